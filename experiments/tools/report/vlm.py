"""PVM's long-answer rerun in the report: its pre-declared claims paired by seed, and its runs.

    section = vlm_section(Path("runs/repro"))   # markdown; `python -m experiments.tools.report`

Every number comes from the run files of `experiments.tools.reproduce`'s `vlm_long` experiment:
each Stage I arm's final evaluation (`metrics.json`, whose `per_scene` lists pair the arms
scene by scene on the validation scenes of their seed's base) and each stage-0 base's
`attention_decay.json` (`python -m experiments.tools.reproduce analyze`). A seed pairs the arms
trained from one base. Holm runs over this family alone (the Lngram family is another).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from experiments.analysis import stats
from experiments.tools import reproduce
from experiments.vlm.tiny.data import LENGTH_GROUPS

# The premise: visual attention mass around t = 100 against t = 401-800, where answers
# of the long design still run and those of the old 3x3 design had ended.
EARLY_T, LATE_T = (91, 110), (401, 800)
ARMS = tuple(name for name, _ in reproduce.VLM_ARMS)   # sft_pvm, sft_mlp, sft_none
PAPER = "PVM paper (arXiv 2605.00814), Qwen3-VL-8B"
CLAIMS = (
    ("the base's attention to the image fades as the answer grows (the premise)",
     f"{PAPER}: visual attention mass decays with the generated length (Theorem 3.1)",
     {"kind": "premise"}),
    ("PVM beats no branch (the LM trained on the same data instead) in item accuracy",
     f"{PAPER}: +4.8 points on 8 benchmarks (66.7 -> 71.5) over the model without PVM",
     {"kind": "accuracy", "arms": ("sft_pvm", "sft_none"), "groups": {"*": 1.0}}),
    ("PVM beats no branch on long answers",
     f"{PAPER}: long group 39.1 -> 49.8 (+27.3% relative)",
     {"kind": "accuracy", "arms": ("sft_pvm", "sft_none"), "groups": {"long": 1.0}}),
    ("PVM's gain over no branch grows from very short to long answers",
     f"{PAPER}: +6.1% (very short), +7.3%, +17.0%, +27.3% (long) relative",
     {"kind": "accuracy", "arms": ("sft_pvm", "sft_none"),
      "groups": {"long": 1.0, "very_short": -1.0}}),
    ("PVM beats the iso-parameter MLP in item accuracy",
     f"{PAPER}: +2.5 points over the same-parameter MLP control",
     {"kind": "accuracy", "arms": ("sft_pvm", "sft_mlp"), "groups": {"*": 1.0}}),
    ("PVM's gain over the MLP grows from very short to long answers (the mechanism, not "
     "capacity)", "not split by length against the MLP in the paper",
     {"kind": "accuracy", "arms": ("sft_pvm", "sft_mlp"),
      "groups": {"long": 1.0, "very_short": -1.0}}),
)


# LoRA-SFT at PVM's trainable parameter count (reproduce.VLM_LORA_ARM), declared after the
# six claims above had their family: a family of its own, with its own Holm correction.
LORA_CLAIMS = (
    ("PVM beats LoRA-SFT at the same trainable parameter count in item accuracy",
     f"{PAPER}: PVM-SFT 70.6 against LoRA-SFT 67.5 (+3.1 points; LoRA of the decoder)",
     {"kind": "accuracy", "arms": ("sft_pvm", "sft_lora"), "groups": {"*": 1.0}}),
    ("PVM's gain over LoRA-SFT grows from very short to long answers",
     "not split by length against LoRA in the paper",
     {"kind": "accuracy", "arms": ("sft_pvm", "sft_lora"),
      "groups": {"long": 1.0, "very_short": -1.0}}),
)


def _run(name: str, seed: int) -> reproduce.Run:
  return next(r for r in reproduce.vlm_plan() if r.name == name and r.seed == seed)


def read_eval(root: Path, name: str, seed: int) -> dict | None:
  """The final evaluation (metrics.json "eval") of a finished run, else None."""
  run = _run(name, seed)
  if not reproduce.finished(run, root):
    return None
  try:
    return json.loads((reproduce.run_dir(run, root) / "metrics.json").read_text())["eval"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def read_attention(root: Path, seed: int) -> dict | None:
  """A finished base's attention_decay.json from its final checkpoint, else None."""
  run = _run("base", seed)
  if not (reproduce.finished(run, root) and reproduce.vlm_analysis_written(run, root)):
    return None
  return json.loads((reproduce.run_dir(run, root) / "attention_decay.json").read_text())


def premise_delta(attention: dict) -> float | None:
  """Layer-mean visual attention mass over EARLY_T minus that over LATE_T (> 0: it fades);
  None when no answer runs into either window."""
  t = np.asarray(attention["t"])
  early = (t >= EARLY_T[0]) & (t <= EARLY_T[1])
  late = (t >= LATE_T[0]) & (t <= LATE_T[1])
  if not early.any() or not late.any():
    return None
  mass_LxT = np.asarray([r["mass"] for r in attention["layers"].values()], np.float64)
  return float(mass_LxT[:, early].mean() - mass_LxT[:, late].mean())


def group_mean(per_scene: dict, group: str) -> float:
  values = [a for a, g in zip(per_scene["item_acc"], per_scene["group"], strict=True)
            if group == "*" or g == group]
  return float(np.mean(values)) if values else math.nan


def paired_accuracy(root: Path, spec: dict):
  """(seeds, d per seed, (delta [S, N], groups [N]) or None): d = the contrast of the
  two arms' item accuracy over the claim's groups; the scene arrays only when every run
  kept `per_scene` over the same scenes."""
  better, worse = spec["arms"]
  seeds, d, rows = [], [], []
  for seed in reproduce.VLM_SEEDS:
    a, b = read_eval(root, better, seed), read_eval(root, worse, seed)
    if a is None or b is None:
      continue
    seeds.append(seed)
    if "per_scene" in a and "per_scene" in b:
      pa, pb = a["per_scene"], b["per_scene"]
      d.append(sum(w * (group_mean(pa, g) - group_mean(pb, g))
                   for g, w in spec["groups"].items()))
      rows.append((pa, pb))
    else:   # an evaluation from before per-scene records: the group means it kept
      mean = lambda ev, g: ev["overall"]["item_acc"] if g == "*" else \
          ev["groups"][g]["item_acc"]
      d.append(sum(w * (mean(a, g) - mean(b, g)) for g, w in spec["groups"].items()))
  scenes = None
  if rows and len(rows) == len(seeds):
    digest, groups = rows[0][0]["digest"], rows[0][0]["group"]
    if all(p["digest"] == digest for row in rows for p in row):
      scenes = (np.asarray([np.subtract(pa["item_acc"], pb["item_acc"]) for pa, pb in rows]),
                groups)
  return seeds, d, scenes


def claim_values(root: Path, spec: dict):
  """(seeds, d per seed, scene arrays or None) of one claim."""
  if spec["kind"] == "premise":
    seeds, d = [], []
    for seed in reproduce.VLM_SEEDS:
      attention = read_attention(root, seed)
      delta = None if attention is None else premise_delta(attention)
      if delta is not None:
        seeds.append(seed)
        d.append(delta)
    return seeds, d, None
  return paired_accuracy(root, spec)


def _fmt(x, digits=4, signed=True) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "–"
  return f"{x:+.{digits}f}" if signed else f"{x:.{digits}g}"


def claims_table(root: Path, claims=CLAIMS) -> str:
  """The table of one claim family (CLAIMS, or LORA_CLAIMS), Holm over that family."""
  values = [claim_values(root, spec) for _, _, spec in claims]
  tests = [stats.paired_t(d) for _, d, _ in values]
  adjusted = stats.holm([t["p"] for t in tests])
  m = sum(not math.isnan(t["p"]) for t in tests) or len(claims)
  premise = (f", the premise in visual attention mass (t = {EARLY_T[0]}-{EARLY_T[1]} minus "
             f"t = {LATE_T[0]}-{LATE_T[1]}, layer mean)"
             if any(spec["kind"] == "premise" for _, _, spec in claims) else "")
  lines = [f"Paired by seed (the arms trained from one base): Δ > 0 is the claim's direction; "
           f"item-accuracy claims in accuracy points (fractions){premise}. Mean over seeds "
           f"with its t 95% CI; the scene-bootstrap 95% CI "
           f"(2,000 resamples of the validation scenes within each length group, shared "
           f"by the seeds); p of the paired t-test and of the exact sign-flip test; Holm "
           f"over these {len(claims)} claims ({m} evaluable); MDE at α = 0.05/{m}.", "",
           "| claim | paper | n seeds | Δ [95% CI] | scene-bootstrap CI | p (t) | "
           "p (sign-flip) | Holm p | MDE | verdict |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
  for (claim, paper, spec), (seeds, d, scenes), test, holm_p in zip(
      claims, values, tests, adjusted, strict=True):
    n = len(d)
    diff = (f"{_fmt(test['mean'])} [{_fmt(test['ci'][0])}, {_fmt(test['ci'][1])}]"
            if n >= 2 else (_fmt(test["mean"]) if n else "–"))
    boot = "–"
    if scenes is not None:
      _, lo, hi = stats.group_bootstrap_ci(*scenes, spec["groups"])
      boot = f"[{_fmt(lo)}, {_fmt(hi)}]"
    flip = f"{_fmt(stats.sign_flip_p(d), 3, False)} (min {_fmt(stats.min_flip_p(n), 3, False)})" \
        if n else "–"
    mde = stats.min_detectable_effect(test["sd"], n, alpha=stats.ALPHA / m)
    verdict = stats.verdict(test, holm_p)
    if verdict == "pending":
      done = (f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
              if seeds else "none")
      verdict = f"pending: n = {n} seed{'' if n == 1 else 's'} ({done} done)"
    lines.append(f"| {claim} | {paper} | {n} | {diff} | {boot} | {_fmt(test['p'], 3, False)} | "
                 f"{flip} | {_fmt(holm_p, 3, False)} | {_fmt(mde, 3, False)} | {verdict} |")
  return "\n".join(lines)


def runs_table(root: Path) -> str:
  """Each run's state and, once done, its final evaluation: item accuracy overall and per
  length group, answer accuracy, scenes."""
  head = " | ".join(g.replace("_", " ") for g in LENGTH_GROUPS)
  lines = [f"| run | config | after | state | item acc. | {head} | answer acc. | scenes |",
           "|---|---|---|---|---:|" + "---:|" * len(LENGTH_GROUPS) + "---:|---:|"]
  for run in reproduce.vlm_plan():
    cells = ["–"] * (3 + len(LENGTH_GROUPS))
    state = reproduce.status(run, root)
    if state == "done":
      try:
        ev = json.loads((reproduce.run_dir(run, root) / "metrics.json").read_text())["eval"]
        groups = [ev["groups"][g]["item_acc"] for g in LENGTH_GROUPS]
        cells = [f"{ev['overall']['item_acc']:.4f}",
                 *("–" if x is None else f"{x:.4f}" for x in groups),
                 f"{ev['overall']['answer_acc']:.4f}", str(ev["n"])]
      except (OSError, ValueError, KeyError, TypeError) as e:
        state = f"pending: metrics.json unreadable ({type(e).__name__})"
    lines.append(f"| `{run.key}` | `{run.config}` | {run.after or '–'} | {state} | "
                 + " | ".join(cells) + " |")
  return "\n".join(lines)


def vlm_section(root: Path) -> str:
  return "\n".join([f"#### {reproduce.VLM}: PVM's long-answer rerun", "",
                    f"{reproduce.TRAINED_LAST[reproduce.VLM]}.", "", claims_table(root), "",
                    "PVM against LoRA-SFT (`sft_lora`: rank-16 LoRA on the seven projections "
                    "of every decoder layer, 147,456 factors against the branch's 147,842, "
                    "from the same bases; a family of its own, declared after the six claims "
                    "above):", "",
                    claims_table(root, LORA_CLAIMS), "", runs_table(root)])
