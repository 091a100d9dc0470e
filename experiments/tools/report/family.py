"""The report's pre-declared claim family, each claim a paired contrast over seeds
(experiments/analysis/stats/): the paired t-test with its 95% CI, the exact sign-flip test,
a document-bootstrap CI from the per-document validation losses, Holm over the family, the
minimum detectable effect; a claim worded as non-inferiority tested against its declared
margin (margins.py). Its table, the controls outside the family, the same re-scored without
the validation documents that have a near-duplicate in training (sensitivity.py), the
analyses' claims, and the previous section's verdicts beside these (previous.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from experiments.analysis import stats
from experiments.tools import reproduce
from experiments.tools.report import previous as report_previous
from experiments.tools.report import sensitivity as report_sensitivity
from experiments.tools.report.analyses import analysis_claims
from experiments.tools.report.collapse import STE, ste_collapse
from experiments.tools.report.margins import margin_for

# The unit a setting's bits are in: its validation curves read `eval/bits_per_byte`, or
# `eval/bits_per_token` (records of token runs from before that name hold bits per token
# as `eval/bits_per_byte`; collect.eval_curve reads either).
UNIT_OF = {"bytes": "byte", "tokens": "token"}



# The pre-declared claim family, tested paired by seed: (setting, claim, the paper's figure,
# contrast). A contrast {arm: coefficient} gives per seed d = sum of coefficient x final
# validation bits per unit; d > 0 is the claim's direction (lower loss where it says).
def _v2_over(arm):
  return {arm: 1.0, "lngram_r16": -1.0}


_PAPER = {
    "baseline": "val. loss 2.8584 (r16) vs 2.8899 (Table 4); VLM avg 47.93 vs 47.25 (Table 2)",
    "dense_active": "not in the paper (our control: the same active parameters, dense)",
    "lngram_r64": "val. loss 2.8578 vs 2.8584 (Table 4); avg 55.71 vs 54.20 (Table 3)",
    "lngram_v1": "val. loss 2.8584 (v2 r16) vs 2.8609 (v1), Table 4",
    "lngram_v1_paper": "v2 r16 with 82.6% fewer total parameters than v1, Table 4",
    "pkm": "VLM avg 47.93 vs 47.24 (Table 2)",
    "sparse_ffn": "VLM avg 47.93 vs 45.86 (Table 2)",
    "engram": "not measured in the paper (discussed, §4.1)",
}
_V2_CLAIMS = (
    ("baseline", "Lngram v2 r16 beats the memory-free baseline"),
    ("dense_active", "v2 r16 beats a dense baseline with its active parameters"),
    ("lngram_r64", "more routes help (r64 over r16)"),
    ("lngram_v1", "v2 r16 beats v1 at matched active parameters"),
    ("lngram_v1_paper", "v2 r16 matches or beats v1 with 80% fewer total parameters"),
    ("pkm", "v2 r16 beats PKM"),
    ("sparse_ffn", "v2 r16 beats the parameter-matched sparse FFN"),
    ("engram", "v2 r16 vs Engram"),
)


def claim_family() -> list[tuple[str, str, str, dict]]:
  """Every claim of the family, in report order (the Holm adjustment runs over all)."""
  rows = []
  for setting in reproduce.SETTINGS:
    for arm, claim in _V2_CLAIMS:
      contrast = ({"lngram_r16": 1.0, "lngram_r64": -1.0} if arm == "lngram_r64"
                  else _v2_over(arm))
      rows.append((setting, claim, _PAPER[arm], contrast))
  rows += [
      ("bytes", "at equal table parameters, more routes beat wider entries (r64 over "
       "r16 mem128)", "avg 55.71 (r64/m4/KV8, 90.2M) vs 54.69 (r23/m4/KV8/mem256, 89.4M) "
       "(Table 3)", {"lngram_r16_mem128": 1.0, "lngram_r64": -1.0}),
      ("bytes", "the sink helps", "avg 79.71 vs 79.39 (§4.2, Keye30B)", _v2_over("lngram_nosink")),
      ("bytes", "the counterfactual (one-bit) surrogate beats STE",
       "val. loss 2.8585 vs 7.3349 (App. A.5)", _v2_over("lngram_ste")),
      ("bytes", "inserted Lngram (backbone LR x0.05) gains over its continued baseline",
       "gain +0.70 avg into mature Keye2B (Table 5)",
       {"continued_low": 1.0, "inserted_low": -1.0}),
      ("bytes", "insertion at backbone LR x0.05 gains more than at the full LR",
       "the App. B recipe: backbone 5e-6, memory 1e-4 / 4e-4",
       {"continued_low": 1.0, "inserted_low": -1.0, "continued_full": -1.0,
        "inserted_full": 1.0}),
  ]
  return rows


# Controls, outside the family (unadjusted p): whether a comparison arm is a fair one.
CONTROLS = (
    ("bytes", "the matched sparse FFN is not worse than the baseline",
     {"baseline": 1.0, "sparse_ffn": -1.0}),
    ("tokens", "the matched sparse FFN is not worse than the baseline",
     {"baseline": 1.0, "sparse_ffn": -1.0}),
    ("bytes", "the active-matched dense baseline beats the baseline",
     {"baseline": 1.0, "dense_active": -1.0}),
    ("bytes", "a trained router beats a frozen random one (the ID analyses' control)",
     _v2_over("lngram_r16_frozen")),
    ("bytes", "full-LR insertion gains over its continued baseline",
     {"continued_full": 1.0, "inserted_full": -1.0}),
)


def paired_values(results, setting: str, contrast: dict):
  """(seeds, d per seed, per-document contrast [S, D] and tokens [D] or None, missing):
  the seeds where every arm of the contrast finished; the document arrays only when every
  one of those runs kept its per-document evaluation over the same documents."""
  seeds_of = {}
  for arm in contrast:
    entry = results.get(setting, {}).get(arm, {"seeds": {}})
    seeds_of[arm] = {k: v for k, v in entry["seeds"].items() if v["final"] is not None}
  seeds = sorted(set.intersection(*(set(v) for v in seeds_of.values())))
  d = [sum(c * seeds_of[a][s]["final"] for a, c in contrast.items()) for s in seeds]
  missing = [f"{setting}/{a} {len(seeds_of[a])} seeds" for a in contrast]
  docs = None
  per = [[seeds_of[a][s]["per_doc"] for a in contrast] for s in seeds]
  if seeds and all(p is not None for row in per for p in row):
    names = per[0][0]["names"]
    tokens = per[0][0]["tokens"]
    if all(p["names"] == names and np.array_equal(p["tokens"], tokens)
           for row in per for p in row):
      delta = np.stack([sum(c * p["nats"] for c, p in zip(contrast.values(), row,
                                                           strict=True)) for row in per])
      docs = (delta, tokens)
  return seeds, d, docs, missing


def _fmt(x, digits=4, signed=True) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "–"
  return f"{x:+.{digits}f}" if signed else f"{x:.{digits}g}"


def claim_test(setting: str, claim: str, d) -> dict:
  """The paired t-test of a claim's per-seed differences: against 0 (superiority), or, for
  a claim worded as non-inferiority, against -margin (margins.py): the one-sided test at
  α/2 read two-sided, so "supported" is non-inferior and "reversed" worse by more than
  the margin."""
  margin = margin_for(setting, claim)
  return stats.paired_t(d) if margin is None else stats.paired_t(d, null=-margin.value)


def claim_label(setting: str, claim: str) -> str:
  """The claim as the tables print it: a non-inferiority claim with its margin."""
  margin = margin_for(setting, claim)
  return claim if margin is None else (f"{claim} (non-inferiority, margin "
                                       f"{margin.value:g} {margin.unit})")


def _claim_cells(results, setting, claim, contrast, holm_p, mde_alpha):
  seeds, d, docs, missing = paired_values(results, setting, contrast)
  test = claim_test(setting, claim, d)
  n = len(d)
  arms = " / ".join(f"{a} {m.split()[-2]}" for a, m in zip(contrast, missing, strict=True))
  diff = (f"{_fmt(test['mean'])} [{_fmt(test['ci'][0])}, {_fmt(test['ci'][1])}]"
          if n >= 2 else (_fmt(test["mean"]) if n else "–"))
  boot = "–"
  if docs is not None and n >= 1:
    _, lo, hi = stats.doc_bootstrap_ci(*docs)
    boot = f"[{_fmt(lo)}, {_fmt(hi)}]"
  # Against the test's null (0, or -margin): the sign flips of d - null.
  flip = stats.sign_flip_p(np.asarray(d) - test["null"]) if n else math.nan
  flips = f"{_fmt(flip, 3, False)} (min {_fmt(stats.min_flip_p(n), 3, False)})" if n else "–"
  mde = stats.min_detectable_effect(test["sd"], n, alpha=mde_alpha)
  verdict = stats.verdict(test, holm_p)
  if verdict == "pending":
    verdict = f"pending: n = {n} paired seeds ({arms})"
  return (f"{n} ({arms})", diff, boot, _fmt(test["p"], 3, False), flips,
          _fmt(holm_p, 3, False), _fmt(mde, 3, False), verdict)


def family_tests(results) -> tuple[list[tuple[str, str, str, dict, dict, float]], int]:
  """Every claim of the family with its paired t-test over seeds (`claim_test`) and
  Holm-adjusted p: ([(setting, claim, paper, contrast, test, holm_p)], m evaluable claims)."""
  family = claim_family()
  tests = [claim_test(s, claim, paired_values(results, s, c)[1]) for s, claim, _, c in family]
  raw = [t["p"] for t in tests]
  m = sum(not math.isnan(p) for p in raw) or len(family)
  return [(*row, test, holm_p) for row, test, holm_p
          in zip(family, tests, stats.holm(raw), strict=True)], m


def family_verdicts(tested) -> dict[tuple[str, str], tuple[int, str]]:
  """{(setting, claim): (n paired seeds, verdict)} of `family_tests`' claims, as the summary
  shows them."""
  return {(setting, claim): (test["n"], stats.verdict(test, holm_p))
          for setting, claim, _, _, test, holm_p in tested}


def _methods(n_claims: int, m: int) -> str:
  return (f"Paired by seed: Δ = the claim's 'worse' arm minus its 'better' arm in final "
          f"validation bits per unit (> 0: the claim's direction), mean over seeds with its "
          f"t 95% CI; the document-bootstrap 95% CI (2,000 resamples of validation "
          f"documents, shared by the seeds); p of the paired t-test and of the exact "
          f"sign-flip test over seeds (with the smallest p its n allows); Holm over the "
          f"{n_claims} pre-declared claims ({m} evaluable); MDE: the true mean Δ a paired "
          f"t-test of this n detects with 80% power at α = 0.05/{m} (Holm's first step), "
          f"from the observed sd, on the noncentral t. Verdict: supported / reversed when "
          f"Holm p < 0.05, else not shown. A claim worded \"matches or beats\" or \"is not "
          f"worse than\" is tested as non-inferiority (its margin beside it, declared after "
          f"the runs in experiments/tools/reproduce/design.py and pinned by its digest: half "
          f"the paper's memory gain, 1.09% of the baseline's loss, at this setting's "
          f"baseline loss): p and the "
          f"sign-flip p test Δ = −margin (two-sided; the one-sided non-inferiority test at "
          f"α/2), the MDE is the distance above −margin; supported: non-inferior, reversed: "
          f"worse by more than the margin.")


def _ste_cell(results, root, contrast, verdict: str) -> str:
  """The A.5 row's verdict: whether any STE run collapsed (the paper's claim), then the
  paired test's."""
  if STE not in contrast or verdict.startswith("pending"):
    return verdict
  _, sentence = ste_collapse(results, root)
  return f"{sentence}; one-bit vs STE paired: {verdict}"


def sensitivity(results) -> str:
  """The declared near-duplicate sensitivity analysis: the family and the controls
  re-scored without each setting's validation documents that have a near-duplicate in its
  training split (report/sensitivity.py), the same tests, Holm over the same family."""
  found = {s: report_sensitivity.near_duplicates(results, s) for s in reproduce.SETTINGS
           if s in results}
  rescored = results
  described = []
  for setting, f in found.items():
    if f.why:
      described.append(f"{setting}: not re-scored ({f.why}), its rows as in the main table")
      continue
    rescored = report_sensitivity.without(rescored, setting, f.names)
    gone, docs, units, total = report_sensitivity.removed_units(results, f)
    unit = UNIT_OF.get(setting, "unit")
    described.append(f"{setting}: {gone} of {docs} documents removed, {units:,} of "
                     f"{total:,} scored {unit}s ({units / max(total, 1):.1%})"
                     + (": " + ", ".join(report_sensitivity.short_name(setting, n)
                                         for n in f.names) if f.names else ""))
  main, _ = family_tests(results)
  tested, m = family_tests(rescored)
  lines = [f"Sensitivity analysis, near-duplicates (declared in Reproductions v3 after these "
           f"runs; beside the table above, not a replacement): every claim re-scored without "
           f"the validation documents that have a near-duplicate in their setting's training "
           f"split (experiments/data/dedup.py's rule, applied to each setting's split as "
           f"its runs read it, computed from the data: experiments/tools/report/"
           f"sensitivity.py), each run's bits per unit summed again from its per-document "
           f"losses (no retraining); the same tests, Holm over the same {len(tested)} claims "
           f"({m} evaluable), MDE at α = 0.05/{m}. " + "; ".join(described) + ".", "",
           "| setting | claim | n pairs | Δ main table | Δ without near-duplicates [95% CI] | "
           "document-bootstrap CI | p (t) | p (sign-flip) | Holm p | MDE | verdict | "
           "verdict, main table |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
  for row, before in zip(tested, main, strict=True):
    setting, claim, _, contrast, _, holm_p = row
    n_, diff, boot, pt, flips, holm, mde, verdict = _claim_cells(
        rescored, setting, claim, contrast, holm_p, stats.ALPHA / m)
    lines.append(f"| {setting} (sensitivity) | {claim_label(setting, claim)} | "
                 f"{n_.split(' (')[0]} | "
                 f"{_fmt(before[4]['mean'])} | {diff} | {boot} | {pt} | {flips} | {holm} | "
                 f"{mde} | {verdict} | {stats.verdict(before[4], before[5])} |")
  lines += ["", "| setting | control (p unadjusted) | n pairs | Δ main table | Δ without "
            "near-duplicates [95% CI] | p (t) | verdict | verdict, main table |",
            "|---|---|---|---:|---:|---:|---|---|"]
  for setting, claim, contrast in CONTROLS:
    before = claim_test(setting, claim, paired_values(results, setting, contrast)[1])
    test = claim_test(setting, claim, paired_values(rescored, setting, contrast)[1])
    n_, diff, _, pt, _, _, _, verdict = _claim_cells(rescored, setting, claim, contrast,
                                                     test["p"], stats.ALPHA)
    lines.append(f"| {setting} (sensitivity) | {claim_label(setting, claim)} | "
                 f"{n_.split(' (')[0]} | {_fmt(before['mean'])} | {diff} | {pt} | {verdict} | "
                 f"{stats.verdict(before, before['p'])} |")
  return "\n".join(lines)


def summary(results, root: Path | None = None) -> str:
  """The claim family's table: paired differences over seeds, Holm over the family; the
  controls; the near-duplicate sensitivity analysis; with `root`, the analysis claims; the
  previous section's verdicts beside these."""
  tested, m = family_tests(results)
  lines = [_methods(len(tested), m), "",
           "| setting | claim | paper | n pairs (seeds per arm) | Δ bits/unit [95% CI] | "
           "document-bootstrap CI | p (t) | p (sign-flip) | Holm p | MDE | verdict |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
  for setting, claim, paper, contrast, _, holm_p in tested:
    cells = list(_claim_cells(results, setting, claim, contrast, holm_p, stats.ALPHA / m))
    cells[-1] = _ste_cell(results, root, contrast, cells[-1])
    lines.append(f"| {setting} | {claim_label(setting, claim)} | {paper} | "
                 + " | ".join(cells) + " |")
  lines += ["", "Controls (outside the family; p unadjusted, verdict at p < 0.05):", "",
            "| setting | control | n pairs (seeds per arm) | Δ bits/unit [95% CI] | "
            "document-bootstrap CI | p (t) | p (sign-flip) | verdict |",
            "|---|---|---|---:|---:|---:|---:|---|"]
  for setting, claim, contrast in CONTROLS:
    p = claim_test(setting, claim, paired_values(results, setting, contrast)[1])["p"]
    n_, diff, boot, pt, flips, _, _, verdict = _claim_cells(results, setting, claim, contrast,
                                                            p, stats.ALPHA)
    lines.append(f"| {setting} | {claim_label(setting, claim)} | {n_} | {diff} | {boot} | "
                 f"{pt} | {flips} | {verdict} |")
  lines += ["", sensitivity(results)]
  previous = ["", report_previous.section(family_verdicts(tested))]
  if root is not None:
    rows = analysis_claims(root)
    lines += ["", "The analyses' claims (the ID analyses over every analysed seed, read "
              "against the frozen-random-router control; the insertion pair), from "
              "`<run>/analysis/*.json`:", "",
              "| claim | paper | ours | verdict |", "|---|---|---|---|"]
    lines += [f"| {claim} | {paper} | {ours} | {why} |" for claim, paper, ours, why in rows]
    previous += ["", report_previous.analysis_section(rows)]
  return "\n".join(lines + previous)
