"""The declared claim families (design.FAMILIES) read from the run records: each claim
paired by seed, Holm over its family, and the report section each family fills.

    python -m experiments.tools.reproduce declared [--root=DIR]

`controls_v3` reads the queue's runs under `root` (the report's root: the repository's
records by default); `scale_check` reads `<root>/scale_check/<arm>_s<seed>`, the records
experiments/tools/bench/scale_check.py writes. A run of a family's new arms counts only
when its stamp (repro.json `declared`) holds the family's digest as declared
(`design.DECLARED`); one trained under another declaration, or before any, is named and
left out. Byte runs are compared on the validation set deduplicated against training: a
run evaluated on the full set is re-scored from its per-document losses over the
documents the deduplicated runs kept (`validation.rescore`; the same windows, so the
same numbers up to float rounding). Verdicts are read once every claim of the family
has all its declared seeds; before that each claim shows its paired seeds so far and
"pending".
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments.analysis import stats
from experiments.data import validation
from experiments.tools.reproduce.design import (
  DECLARED,
  FAMILIES,
  MARGINS_DECLARED,
  MEASURES,
  NONINFERIORITY,
  RECORDS,
  YOUNG_BASE,
  Family,
  declaration_digest,
  margins_digest,
  plan,
  run_dir,
)
from experiments.tools.reproduce.records import TRAINING_KEYS, TWIN
from experiments.tools.reproduce.state import final_bits_per_byte, finished
from experiments.trainer.writers import read_metrics

SCALE_DIR = "scale_check"   # under a records root: the scale check's records


def _json(path: Path):
  try:
    return json.loads(Path(path).read_text())
  except (OSError, ValueError):
    return None


def stamp_digest(workdir: Path, family: str) -> str | None:
  """The digest of `family` a run's stamp says it trained under (None: none)."""
  stamp = _json(Path(workdir) / "repro.json")
  declared = stamp.get("declared") if isinstance(stamp, dict) else None
  return declared.get(family) if isinstance(declared, dict) else None


def _stability(workdir: Path) -> float | None:
  """MEASURES["stability"]: code agreement over own steps 100 -> 300, primary protocol,
  mean over the memory layers; None without that interval."""
  result = _json(Path(workdir) / "analysis" / "stability.json")
  if not isinstance(result, dict):
    return None
  primary = result.get("primary", "fixed")
  rows = [r for r in result.get("rows", []) if r.get("protocol") == primary
          and r.get("from_step") == 100 and r.get("to_step") == 300]
  return sum(r["code_agreement"][0] for r in rows) / len(rows) if rows else None


def dedup_set(family: Family, root: Path) -> tuple[list[str] | None, str]:
  """(names, note): the byte validation documents the family's deduplicated runs scored
  (every one must have scored the same), or (None, why)."""
  found = {}
  for run in plan():
    if (run.experiment == "bytes" and f"{run.experiment}/{run.name}" in family.new_arms
        and finished(run, root)):
      per_doc = validation.read_per_doc(run_dir(run, root))
      if per_doc is not None and "dedup" in per_doc:
        found[run.key] = per_doc["names"]
  if not found:
    return None, "no deduplicated byte run recorded yet"
  sets = {tuple(names) for names in found.values()}
  if len(sets) > 1:
    return None, f"the deduplicated runs scored {len(sets)} different document sets"
  return list(sets.pop()), f"{len(next(iter(found.values())))} documents"


def run_value(run, root: Path, measure: str, keep: list[str] | None) -> tuple[float | None, str]:
  """(the run's `measure`, why not): bits re-scored over `keep` where given (byte runs),
  else its final bits; the stability measure from its analysis."""
  workdir = run_dir(run, root)
  if not finished(run, root):
    return None, "not finished"
  if measure == "stability":
    value = _stability(workdir)
    return value, "" if value is not None else "no stability over steps 100 -> 300"
  if run.experiment == "bytes":
    per_doc = validation.read_per_doc(workdir)
    if keep is None or per_doc is None:
      return None, "no deduplicated set yet" if keep is None else "no per-document losses"
    try:
      return validation.rescore(per_doc, keep), ""
    except KeyError as e:
      return None, str(e)
  return final_bits_per_byte(run, root), ""


def claim_values(family: Family, root: Path) -> list[dict]:
  """Per claim: {"claim", "seeds", "d", "test", "left_out"} over the family's seeds with
  every arm of the contrast measured (and, for a new arm, trained under the declaration)."""
  by_key = {r.key: r for r in plan()}
  keep, _ = dedup_set(family, root)
  digest = DECLARED.get(family.name)
  out = []
  for claim in family.claims:
    seeds, d, left_out = [], [], []
    for seed in family.seeds:
      values = []
      for arm, _ in claim.contrast:
        run = by_key.get(f"{claim.setting}/{arm}_s{seed}")
        if run is None:
          values.append(None)
          continue
        new = f"{claim.setting}/{arm}" in family.new_arms
        if new and finished(run, root) and stamp_digest(run_dir(run, root), family.name) != digest:
          left_out.append(f"{run.key} (not trained under this declaration)")
          values.append(None)
          continue
        value, _ = run_value(run, root, claim.measure, keep)
        values.append(value)
      if all(v is not None for v in values):
        seeds.append(seed)
        d.append(sum(c * v for (_, c), v in zip(claim.contrast, values, strict=True)))
    out.append({"claim": claim, "seeds": seeds, "d": d, "test": stats.paired_t(d),
                "left_out": left_out})
  return out


def tested(family: Family, rows: list[dict]) -> list[tuple[dict, float, str]]:
  """[(row, Holm p, verdict)]: Holm over the family once every claim has all its seeds,
  verdicts then; before, each claim's unadjusted p and "pending: n of N seeds"."""
  complete = all(len(r["seeds"]) == len(family.seeds) for r in rows)
  n = len(family.seeds)
  if not complete:
    return [(r, math.nan, f"pending: {len(r['seeds'])} of {n} seeds") for r in rows]
  adjusted = stats.holm([r["test"]["p"] for r in rows])
  return [(r, p, stats.verdict(r["test"], p)) for r, p in zip(rows, adjusted, strict=True)]


def _fmt(x, signed=True, digits=4) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "–"
  return f"{x:+.{digits}f}" if signed else f"{x:.3g}"


def _table(family: Family, rows, unit: str) -> list[str]:
  lines = [f"| setting | claim | measure | n pairs | Δ {unit} [95% CI] | p (t) | "
           "p (sign-flip) | Holm p | verdict |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
  for r, holm_p, verdict in tested(family, rows):
    test, claim = r["test"], r["claim"]
    diff = (f"{_fmt(test['mean'])} [{_fmt(test['ci'][0])}, {_fmt(test['ci'][1])}]"
            if test["n"] >= 2 else _fmt(test["mean"]) if test["n"] else "–")
    flip = _fmt(stats.sign_flip_p(r["d"]), signed=False) if r["d"] else "–"
    lines.append(f"| {claim.setting} | {claim.claim} | {claim.measure} | {test['n']} | "
                 f"{diff} | {_fmt(test['p'], signed=False)} | {flip} | "
                 f"{_fmt(holm_p, signed=False)} | {verdict} |")
  return lines


def _first_difference(rows: list[dict], theirs: dict[int, dict]) -> tuple[int, int | None]:
  """(logged steps equal, the first step whose training numbers differ or None)."""
  equal = 0
  for row in rows:
    other = theirs.get(row.get("step"))
    keys = [k for k in TRAINING_KEYS if other is not None and k in row and k in other]
    if not keys:
      continue
    if any(row[k] != other[k] for k in keys):
      return equal, row["step"]
    equal += 1
  return equal, None


def young_check(root: Path) -> list[str]:
  """Per seed: whether `baseline_young` logged, bit for bit over the steps both logged,
  the training numbers of the baseline the mature insertion started from (the young
  backbone is then the mature run's own step-200 state; their validation sets differ, so
  evaluations are not compared): the baseline's record, or where the mature insertion's
  analyses are a twin's, the retrained baseline that twin started from (TWIN)."""
  by_key = {r.key: r for r in plan()}
  out = []
  for run in plan():
    if run.name != YOUNG_BASE or not finished(run, root):
      continue
    base = by_key.get(f"{run.experiment}/baseline_s{run.seed}")
    mature = by_key.get(f"{run.experiment}/inserted_low_s{run.seed}")
    twin = _json(run_dir(mature, root) / TWIN) if mature is not None else None
    if isinstance(twin, dict) and twin.get("base_training"):
      rows, against = twin["base_training"], "the retrained baseline of its mature twin"
    elif base is not None and finished(base, root):
      rows, against = read_metrics(run_dir(base, root)), "its baseline"
    else:
      continue
    theirs = {r["step"]: r for r in rows if "step" in r}
    equal, first = _first_difference(read_metrics(run_dir(run, root)), theirs)
    out.append(f"seed {run.seed} against {against}: "
               + (f"equal over {equal} logged steps" if first is None
                  else f"DIFFERS at step {first} (after {equal} equal)"))
  return out


def twin_lines(root: Path) -> list[str]:
  """The records whose analyses are a twin's (TWIN): which, why, and where the twin's
  retrained base ended against its record's final validation bits."""
  by_key = {r.key: r for r in plan()}
  out = []
  for run in plan():
    twin = _json(run_dir(run, root) / TWIN)
    if not isinstance(twin, dict):
      continue
    names = ", ".join(Path(a).stem for a in twin.get("analyses", []))
    line = f"{run.key} ({names}): {twin.get('differs', '')}"
    final, base = twin.get("base_final") or {}, by_key.get(run.after or "")
    bits = next((v for k, v in final.items() if k.startswith("eval/")), None)
    recorded_bits = final_bits_per_byte(base, root) if base is not None else None
    if bits is not None and recorded_bits is not None:
      line += (f" Its base {base.key}, retrained, ends at {bits:.4f} against its record's "
               f"{recorded_bits:.4f} (Δ {bits - recorded_bits:+.4f})")
    out.append(line)
  return out


def controls_section(root: Path | None = None) -> str:
  """The `controls_v3` section: what it decides, its validation set, its claims."""
  root = Path(RECORDS if root is None else root)
  family = FAMILIES["controls_v3"]
  rows = claim_values(family, root)
  _, note = dedup_set(family, root)
  lines = [f"Declared before its runs (digest `{DECLARED[family.name][:16]}…`): "
           f"{family.question} Seeds {', '.join(map(str, family.seeds))} per arm; Δ > 0 is "
           f"the claim's direction; {family.test}. Byte claims on the validation set "
           f"deduplicated against training ({note})"
           + (", token claims on the token validation set" if any(
               c.setting == "tokens" for c in family.claims) else "")
           + "; measures: " + "; ".join(f"{k}: {v}" for k, v in MEASURES.items()) + ".",
           "", *_table(family, rows, "(bits/unit or agreement)")]
  young = young_check(root)
  if young:
    lines += ["", f"`{YOUNG_BASE}` against the logged training of the baseline the mature "
                  "insertion started from (the young backbone is the mature run's own "
                  "step-200 state where equal): " + "; ".join(young) + "."]
  twins = twin_lines(root)
  if twins:
    lines += ["", "Analyses from a twin (the run trained again from the same config, seed, "
                  "initialisation and batches, for analyses its record lacked; its numbers "
                  "part from the record's at rounding level and the trajectories then drift "
                  "apart, so its analyses are another realisation of the same arm and seed, "
                  "while the record keeps its own numbers): " + "; ".join(twins) + "."]
  left = [x for r in rows for x in r["left_out"]]
  if left:
    lines += ["", "Left out: " + ", ".join(sorted(set(left))) + "."]
  return "\n".join(lines)


# --- the scale check's records -------------------------------------------------------------


def scale_records(root: Path | None = None) -> list[dict]:
  """The scale check's finished records under `<root>/scale_check`: [{arm, seed, bits,
  data (sha256), digest, stamp}]."""
  base = Path(RECORDS if root is None else root) / SCALE_DIR
  found = []
  for workdir in sorted(base.glob("*_s*")) if base.is_dir() else []:
    stamp = _json(workdir / "repro.json")
    per_doc = validation.read_per_doc(workdir)
    if not isinstance(stamp, dict) or per_doc is None or stamp.get("smoke"):
      continue
    found.append({"arm": stamp.get("arm"), "seed": stamp.get("seed"),
                  "bits": float(per_doc["bits_per_unit"]),
                  "data": (stamp.get("data") or {}).get("sha256"),
                  "digest": (stamp.get("declared") or {}).get("scale_check"),
                  "stamp": stamp, "dir": workdir.name})
  return found


def scale_values(root: Path | None = None) -> tuple[list[dict], dict]:
  """(claim rows as `claim_values`, about): the records trained under the declared
  digest, on the data most of them share (one data set per family: its sha256)."""
  family = FAMILIES["scale_check"]
  records = scale_records(root)
  ok = [r for r in records if r["digest"] == DECLARED[family.name]]
  datas = sorted({r["data"] for r in ok}, key=lambda h: -sum(r["data"] == h for r in ok))
  data = datas[0] if datas else None
  used = [r for r in ok if r["data"] == data]
  by = {(r["arm"], r["seed"]): r["bits"] for r in used}
  rows = []
  for claim in family.claims:
    seeds = [s for s in family.seeds if all((a, s) in by for a, _ in claim.contrast)]
    d = [sum(c * by[(a, s)] for a, c in claim.contrast) for s in seeds]
    rows.append({"claim": claim, "seeds": seeds, "d": d, "test": stats.paired_t(d),
                 "left_out": []})
  about = {"data": data, "used": used,
           "left_out": [r["dir"] for r in records if r not in used]}
  return rows, about


def scale_section(root: Path | None = None) -> str:
  """The scale check's section: its runs, their parameters, its three claims."""
  family = FAMILIES["scale_check"]
  rows, about = scale_values(root)
  used = about["used"]
  lines = [f"Declared before its runs (digest `{DECLARED[family.name][:16]}…`): "
           f"{family.question} Seeds {', '.join(map(str, family.seeds))}; Δ > 0 is the "
           f"claim's direction; {family.test}."]
  if not used:
    return "\n".join(lines + ["", "No scale-check run recorded under this declaration yet."])
  first = used[0]["stamp"]
  data, val = first.get("data", {}), first.get("validation", {})
  devices = sorted({r["stamp"].get("device", "?") for r in used})
  lines += ["", f"Data `{data.get('spec')}` sha256 {str(about['data'])[:16]}…, "
                f"{data.get('train_bytes', 0):,} training bytes, "
                f"{data.get('epochs', float('nan')):.2f} epochs a run; validation "
                f"{val.get('docs')} documents, {val.get('units', 0):,} units, the largest "
                f"{100 * val.get('largest_share', 0):.1f}%, {val.get('removed_count', 0)} "
                f"left out as near-duplicates of training files; devices: "
                f"{', '.join(devices)}.", "",
            "| arm | seeds | final val. bits/byte (mean) | memory total | memory active |",
            "|---|---|---:|---:|---:|"]
  for arm in dict.fromkeys(a.split("/", 1)[1] for a in family.new_arms):
    mine = sorted((r for r in used if r["arm"] == arm), key=lambda r: r["seed"])
    if not mine:
      lines.append(f"| {arm} | – | – | – | – |")
      continue
    params = mine[0]["stamp"].get("params", {})
    mean = sum(r["bits"] for r in mine) / len(mine)
    lines.append(f"| {arm} | {', '.join(str(r['seed']) for r in mine)} | {mean:.4f} | "
                 f"{params.get('memory_total', 0):,} | {params.get('memory_active', 0):,} |")
  lines += ["", *_table(family, rows, "bits/byte")]
  if about["left_out"]:
    lines += ["", "Left out (another declaration or data set): "
              + ", ".join(about["left_out"]) + "."]
  return "\n".join(lines)


def main(root: Path | None = None) -> int:
  """`declared`: each family, its digest as declared and as computed, and its section."""
  for name, family in FAMILIES.items():
    now = declaration_digest(family)
    state = "as declared" if now == DECLARED.get(name) else "CHANGED since its declaration"
    print(f"## {name}: digest {now[:16]}… ({state})\n")
    print(controls_section(root) if name == "controls_v3" else scale_section(root))
    print()
  now = margins_digest()
  state = "as declared" if now == MARGINS_DECLARED else "CHANGED since their declaration"
  print(f"## non-inferiority margins: digest {now[:16]}… ({state}; declared "
        f"{NONINFERIORITY.declared})")
  return 0
