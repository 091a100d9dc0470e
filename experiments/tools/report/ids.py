"""The Lngram reproduction report's ID-analysis part (`experiments.tools.report` prints it).

The ID analyses (§3, App. C of the Lngram v2 paper) of EVERY finished seed of the
Lngram v2 arms r16 and r64 and of the random-router control (the same Lngram with
its router frozen at init), read from the JSON files that `lngram-exp analyze`
writes into `<run>/analysis/` (`python -m experiments.tools.reproduce analyze` runs it):
headline numbers beside the paper's as mean ± sd over seeds, the ID-KNN table with
the surface readers, ρ against the nuisance and the best surface reader (with
bootstrap CIs for one seed) and the permutation p, the strongest associations of
one run, and the summary-table rows. What is missing prints as "pending: <why>".
"""

from __future__ import annotations

from pathlib import Path

from experiments.analysis import stats
from experiments.analysis.associations import PAPER as ASSOC
from experiments.analysis.distributed import PAPER as DIST
from experiments.analysis.id_readers import PAPER_P, PAPER_TABLE1
from experiments.analysis.utilisation import PAPER_TABLE9
from experiments.tools import reproduce
from experiments.tools.report.collect import read_analysis


def _guarded(fn, *args) -> str:
  """fn(*args), or a pending cell when an analysis file lacks what fn reads."""
  try:
    return fn(*args)
  except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
    return f"pending: analysis file lacks {type(e).__name__} {e}"


def _pct(x) -> str:
  return "–" if x is None else f"{100 * x:.2f}%"


def _span(values, fmt=_pct) -> str:
  values = [v for v in values if v is not None]
  if not values:
    return "–"
  lo, hi = min(values), max(values)
  return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def _settings(result: dict, key: str) -> list[tuple[str, str, float | None]]:
  """[(layer, level, value)] of `result["layers"][layer][key][level]`."""
  return [(layer, level, value) for layer, row in result["layers"].items()
          for level, value in row[key].items()]


def _values(result: dict, key: str) -> list:
  return [v for *_, v in _settings(result, key)]


def _x2(x) -> str:
  return f"{x:.2f}"


def _g4(x) -> str:
  return f"{x:.4g}"


# ρ's denominator is the hidden state's excess AP over the reader. Where H_model is at or
# below that reader in more than this share of the document resamples (the excess's 95%
# bootstrap interval reaches 0), the denominator is resampling noise and ρ can take any
# value (a −2,109% has been measured): such a ρ is printed in parentheses, marked
# unresolved, and counted with the undefined ones, not in a verdict.
UNRESOLVED_SHARE = 0.025


def _unresolved(result: dict, layer: str, level: str, key: str) -> bool:
  """True where `key`'s bootstrap left more than UNRESOLVED_SHARE of its resamples undefined."""
  count = _get(result, "layers", layer, "bootstrap", level, f"{key}_undefined")
  n_boot = result.get("n_boot")
  return bool(n_boot and count is not None and count > UNRESOLVED_SHARE * n_boot)


def _rho(result: dict, layer: str, level: str, key: str):
  """result's ρ (`key`: "rho" or "rho_surface") where it is defined and resolved, else None."""
  value = _get(result, "layers", layer, key, level)
  return None if _unresolved(result, layer, level, key) else value


# The analysed arms (by run name, in every experiment / setting of the queue): every
# finished seed of each, never only the best-loss run; and the random-router control
# (the same Lngram with its router frozen at init, `optim.freeze`).
ID_ARMS = ("lngram_r16", "lngram_r64")
CONTROL_ARMS = {"lngram_r16_frozen": "lngram_r16"}   # control -> the arm it controls
RECORD_NAMES = ("utilisation", "id_knn", "associations", "distributed")
NO_RUN = f"pending: no Lngram v2 run of {' / '.join(ID_ARMS)} has finished"


def analysed_groups(root: Path) -> list[dict]:
  """[{experiment, name, runs: [(run, {analysis: result or None}, {analysis: why})]}] of
  the finished runs of ID_ARMS and CONTROL_ARMS, one group per (experiment, arm)."""
  groups: dict[tuple[str, str], dict] = {}
  # The queue's analysed setting (byte-level runs: `analyze` reads no token runs), if it names one.
  setting = getattr(reproduce, "ID_SETTING", None)
  for run in reproduce.plan():
    if run.name not in ID_ARMS and run.name not in CONTROL_ARMS:
      continue
    if setting is not None and run.experiment != setting:
      continue
    if not reproduce.finished(run, root):
      continue
    group = groups.setdefault((run.experiment, run.name),
                              {"experiment": run.experiment, "name": run.name, "runs": []})
    found, whys = {}, {}
    for name in RECORD_NAMES:
      found[name], whys[name] = read_analysis(reproduce.run_dir(run, root), name)
    group["runs"].append((run, found, whys))
  return list(groups.values())


def _results(group: dict, name: str) -> list[dict]:
  return [found[name] for _, found, _ in group["runs"] if found[name] is not None]


def _label(group: dict) -> str:
  return f"{group['experiment']}/{group['name']}"


def _mean_sd(values, fmt=_pct) -> str:
  """mean ± sd over seeds (n), one value alone, "–" for none."""
  values = [v for v in values if v is not None]
  if not values:
    return "–"
  if len(values) == 1:
    return fmt(values[0])
  mean = sum(values) / len(values)
  sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
  return f"{fmt(mean)} ± {fmt(sd)}"


def _mean(values) -> float:
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else float("nan")


def _guarded_settings(result: dict) -> list:
  try:
    return _settings(result, "rho")
  except (KeyError, TypeError, AttributeError):
    return []


def _n_runs(n: int) -> str:
  return f"{n} run" + ("" if n == 1 else "s")


def _f4(x) -> str:
  return f"{x:.4f}"


def _get(result: dict, *keys):
  """result[k0][k1]... or None where a key is missing (older results lack the surface
  readers, rho_surface and the bootstrap)."""
  for k in keys:
    if not isinstance(result, dict) or k not in result:
      return None
    result = result[k]
  return result


def _protocols(group: dict) -> str:
  versions = sorted({_get(r, "protocol", "version") or 1 for r in _results(group, "id_knn")})
  return "/".join(map(str, versions)) if versions else "–"


def _utilisation_ours(results: list[dict]) -> str:
  layers = results[0]["layers"]
  return "; ".join(
      f"layer {layer}: {_mean_sd([r['layers'][layer]['n_eff'] for r in results], _x2)} "
      f"effective codes of {results[0]['codes_per_route']}, normalised entropy "
      f"{_mean_sd([r['layers'][layer]['normalised_entropy'] for r in results], _g3)}, dead "
      f"{_span([r['layers'][layer]['dead_codes'] for r in results], str)} / "
      f"{layers[layer]['total_codes']}" for layer in layers)


def _g3(x) -> str:
  return f"{x:.3f}"


def _utilisation_paper() -> str:
  return "; ".join(f"layer {layer}: {n_eff:.2f} of 16, {ent:.3f}, {100 * top:.1f}%, dead "
                   f"{dead} / {total:,}" for layer, n_eff, ent, top, dead, total in PAPER_TABLE9)


def _id_knn_ours(results: list[dict]) -> str:
  rhos = [_rho(r, layer, level, "rho") for r in results for layer, level, _ in _settings(r, "rho")]
  surf = [_rho(r, layer, level, "rho_surface") for r in results
          for layer, level, _ in _settings(r, "rho_surface")] if all(
      "rho_surface" in row for r in results for row in r["layers"].values()) else []
  ps = [_get(r, "layers", layer, "permutation", level, "p") for r in results
        for layer, level, _ in _settings(r, "rho")]
  return (f"ρ vs nuisance {_span(rhos)}" + (f", vs best surface {_span(surf)}" if surf else "")
          + f" over {len(rhos)} run × settings; permutation p {_span(ps, _g4)}")


def _id_knn_paper() -> str:
  return (f"ρ {_span([row[-1] for row in PAPER_TABLE1])} over {len(PAPER_TABLE1)} settings; "
          f"p = {PAPER_P:.4g} (1/501) in every setting; ordering in all")


def _associations_ours(results: list[dict]) -> str:
  return (f"replicated {_mean_sd([r['total']['rate'] for r in results])} of evaluable "
          f"candidates ({_span([r['total']['evaluable'] for r in results], str)} evaluable)")


def _associations_paper() -> str:
  local = ", ".join(f"layer {layer} {_pct(rate)}"
                    for layer, rate in ASSOC["rate_local_presence"].items())
  return (f"{ASSOC['candidates']:,} / {ASSOC['evaluable']:,} / {ASSOC['replicated']:,}: "
          f"{_pct(ASSOC['rate'])}; local presence {local}")


def _routes_of(d: dict) -> int:
  return max(max(row["ms"]) for row in d["layers"].values())


def _distributed_ours(results: list[dict]) -> str:
  return (f"S_dict ρ {_span([v for r in results for v in _values(r, 'rho')])}; AP_R / AP_1 "
          f"{_span([v for r in results for v in _values(r, 'ratio')], _x2)} "
          f"(R = {_routes_of(results[0])} routes)")


def _distributed_paper() -> str:
  return (f"S_dict ρ {_span(DIST['rho_range'])}, ID-KNN ρ {_span(DIST['id_knn_rho_range'])}; "
          f"AP_128 / AP_1 {_span(DIST['ap_ratio_range'], _x2)}")


ID_ANALYSES = (  # name, section of the paper, ours (over a group's results), paper
    ("utilisation", "C.1, Table 9", _utilisation_ours, _utilisation_paper),
    ("id_knn", "§3.2, Table 1", _id_knn_ours, _id_knn_paper),
    ("associations", "C.2", _associations_ours, _associations_paper),
    ("distributed", "C.3", _distributed_ours, _distributed_paper),
)
TABLE_READERS = ("H_model", "Q_route", "ID", "nuisance", "surface", "surface_byte")


def _rho_cell(results: list[dict], layer: str, level: str, key: str) -> str:
  raw = [_get(r, "layers", layer, key, level) for r in results]
  unresolved = [v is not None and _unresolved(r, layer, level, key)
                for r, v in zip(results, raw, strict=True)]
  if len(results) == 1:
    if unresolved[0]:
      return f"({_pct(raw[0])}) unresolved"
    ci = _get(results[0], "layers", layer, "bootstrap", level, key)
    if raw[0] is not None and ci and None not in ci:
      return f"{_pct(raw[0])} [{_pct(ci[0])}, {_pct(ci[1])}]"
  cell = _mean_sd([None if u else v for v, u in zip(raw, unresolved, strict=True)])
  return cell + (f" ({sum(unresolved)} seed{'s' if sum(unresolved) > 1 else ''} unresolved)"
                 if any(unresolved) else "")


def _id_knn_table(groups: list[dict]) -> str:
  """Every arm and control, every layer x target: mean ± sd over seeds (n)."""
  lines = ["| arm (n) | layer | target | " + " | ".join(TABLE_READERS)
           + " | ρ vs nuisance | ρ vs best surface | perm. p |",
           "|---|---|---|" + "---:|" * (len(TABLE_READERS) + 2) + "---|"]
  for group in groups:
    results = _results(group, "id_knn")
    if not results:
      continue
    for layer, row in results[0]["layers"].items():
      for level in row["rho"]:
        aps = [_mean_sd([_get(r, "layers", layer, "ap", reader, level) for r in results], _f4)
               for reader in TABLE_READERS]
        ps = [_get(r, "layers", layer, "permutation", level, "p") for r in results]
        lines.append(f"| {_label(group)} ({len(results)}) | {layer} | {level} | "
                     + " | ".join(aps) + f" | {_rho_cell(results, layer, level, 'rho')} | "
                     f"{_rho_cell(results, layer, level, 'rho_surface')} | {_span(ps, _g4)} |")
  return "\n".join(lines)


def _examples_table(a: dict) -> str:
  lines = ["| code expression | target level | P (held-out) | P0 | Δ | n |",
           "|---|---|---:|---:|---:|---:|"]
  for e in a["examples"]:
    lines.append(f"| `{e['expression']}` | {e['level']} | {_pct(e['P'])} | {_pct(e['P0'])} | "
                 f"{100 * e['delta']:+.2f} pp | {e['n']} |")
  return "\n".join(lines)


def _protocol_line(groups: list[dict]) -> str:
  knn = [r for g in groups for r in _results(g, "id_knn")]
  old = sum(1 for r in knn if (_get(r, "protocol", "version") or 1) < 2)
  strata = sorted({r.get("perm_strata", "nuisance") for r in knn})
  movable = [r["perm_movable"] for r in knn if r.get("perm_movable") is not None]
  shares = [r["query_file_max_share"] for r in knn if r.get("query_file_max_share") is not None]
  boots = [r["n_boot"] for r in knn if r.get("n_boot")]
  text = (f"Protocol: near-duplicate files (equal content hash of normalised lines: comments, "
          f"blank lines and indentation dropped, every string literal `\"\"` and number `0`; "
          f"experiments/data/dedup.py) removed from both splits, at most 5% of a split's "
          f"positions from one file (the largest file's share of the queries "
          f"{_span(shares)}), permutations within {', '.join(strata) or '–'} cells"
          + (f" ({_span(movable)} of reference positions movable)" if movable else "")
          + f", ρ CIs over {_span(boots, str)} bootstrap resamples of the query files (shown "
          "for one seed; over seeds the cells are mean ± sd).")
  if old:
    text += (f" {old} of the {len(knn)} id_knn results predate this protocol (one file gave "
             "most queries, near-duplicates sat on both sides): rerun `python -m "
             "experiments.tools.reproduce analyze --force`.")
  return text


def id_section(root: Path) -> str:
  lines = ["#### ID analyses on every seed of Lngram v2 r16 and r64, and the random-router "
           "control (§3, App. C)", ""]
  groups = analysed_groups(root)
  if not any(g["name"] in ID_ARMS for g in groups):
    return "\n".join(lines + [NO_RUN + "."])
  lines += ["Every finished seed of each arm is analysed (`lngram-exp analyze`, files in "
            "`<run>/analysis/`); cells are mean ± sample sd over those seeds, n per arm in "
            "brackets. The control freezes the router at its init (`optim.freeze`), so its "
            "codes are a fixed random projection of the layer input: what the learned codes "
            "add is their margin over it. ρ is the excess AP retained over the nuisance "
            "reader, (ID − nuisance) / (H_model − nuisance), and over the best surface "
            "reader (current and previous byte, or the current byte alone), which reads the "
            "local target (the Python token kind) from the bytes alone. Our targets are read "
            "from Python source (token kind, enclosing statement, imported module), the "
            "paper's from COCO: the numbers compare in kind, not one to one.", "",
            _protocol_line(groups), "", "| analysis | arm (n) | ours | paper |",
            "|---|---|---|---|"]
  for name, where, ours, paper in ID_ANALYSES:
    for group in groups:
      results = _results(group, name)
      if results:
        cell = _guarded(ours, results)
      else:
        cell = group["runs"][0][2][name] if group["runs"] else "pending"
      lines.append(f"| {name} ({where}) | {_label(group)} ({len(results)}) | {cell} | "
                   f"{paper()} |")
  steps = sorted({r["source"]["step"] for g in groups for name in RECORD_NAMES
                  for r in _results(g, name) if isinstance(r.get("source"), dict)})
  if steps:
    lines += ["", f"Computed from checkpoint step{'s' if len(steps) > 1 else ''} "
              f"{', '.join(map(str, steps))}."]
  if any(_results(g, "id_knn") for g in groups):
    lines += ["", "ID-KNN per setting (mean AP per reader; ρ with its 95% bootstrap CI for "
              "one seed, mean ± sd over seeds; p: the permutation test's range over seeds; "
              "ρ unresolved: H_model at or below that reader in more than "
              f"{100 * UNRESOLVED_SHARE:g}% of the document resamples, so its denominator is "
              "noise; not counted in a verdict):",
              "", _guarded(_id_knn_table, groups)]
    above = [f"{_label(g)} layer {layer} {level}" for g in groups for k in _results(g, "id_knn")[:1]
             for layer, level, _ in _guarded_settings(k)
             if _mean([_get(r, "layers", layer, "rho", level) for r in _results(g, "id_knn")]) > 1]
    if above:
      lines += ["", f"ρ above 100% ({', '.join(above)}): the ID reader beat the hidden-state "
                "reader there; where H_model's excess over the nuisance is small, ρ is noisy."]
  first = next(((run, found["associations"]) for g in groups if g["name"] in ID_ARMS
                for run, found, _ in g["runs"] if found["associations"] is not None), None)
  if first is not None:
    lines += ["", f"The strongest held-out single-code associations of one run, `{first[0].key}` "
              "(App. C.2, Table 10's form; near-duplicate files are out of both splits, so a "
              "code cannot score a codec table's twin):", "",
              _guarded(_examples_table, first[1])]
  return "\n".join(lines)


def _count_verdict(hits: int, total: int, text: str) -> str:
  """reproduced when every setting agrees, not reproduced when none does, else inconclusive."""
  if hits == total:
    return f"reproduced: {text}"
  return f"not reproduced: {text}" if hits == 0 else f"inconclusive at this scale: {text}"


def _pending(groups: list[dict], name: str) -> str:
  """Why no result of `name` is there: no finished run, or each run's reason."""
  whys = list(dict.fromkeys(whys[name] for g in groups if g["name"] in ID_ARMS
                            for _, _, whys in g["runs"] if whys[name]))
  return "; ".join(whys) if whys else NO_RUN


def _main_results(groups: list[dict], name: str) -> list[dict]:
  """`name`'s results of every analysed seed of the Lngram v2 arms (not the control)."""
  return [r for g in groups if g["name"] in ID_ARMS for r in _results(g, name)]


def _arms_text(groups: list[dict], name: str) -> str:
  return ", ".join(f"{_label(g)} n={len(_results(g, name))}" for g in groups
                   if g["name"] in ID_ARMS and _results(g, name))


def _ap_values(k: dict) -> list:
  return [_get(k, "layers", layer, "ap", "ID", level) for layer, level, _ in _settings(k, "rho")]


def control_verdict(learned: list[dict], control: list[dict]) -> str:
  """Learned vs frozen router: ID-KNN mean AP per setting, every learned seed above every
  control seed (the exact rank test's smallest one-sided p, 1 / C(n1 + n2, n1))."""
  if not learned or not control:
    return "pending: needs analysed seeds of both the arm and its control"
  from math import comb
  settings = [(layer, level) for layer, level, _ in _settings(learned[0], "rho")]
  above = sum(
      min(_get(r, "layers", la, "ap", "ID", lv) or 0 for r in learned)
      > max(_get(r, "layers", la, "ap", "ID", lv) or 0 for r in control)
      for la, lv in settings)
  p = 1 / comb(len(learned) + len(control), len(learned))
  text = (f"every learned seed above every frozen-router seed in {above}/{len(settings)} "
          f"settings (n = {len(learned)} vs {len(control)}; where all are above, the exact "
          f"rank test gives p = {p:.3g} one-sided per setting)")
  if p > 0.05:
    return f"inconclusive (too few seeds for p ≤ 0.05): {text}"
  return _count_verdict(above, len(settings), text)


def control_pairs(groups: list[dict], name: str, value) -> tuple[str, list[tuple[int, float,
                                                                                  float]]]:
  """(label, [(seed, learned, frozen)]): `value(learned result, frozen result)` -> (learned
  value, frozen value) or None, for every seed where both the arm and its frozen-router
  control (CONTROL_ARMS) have `name`'s result: the same seed, the same backbone init and
  batches (paired)."""
  out, labels = [], []
  for control, arm in CONTROL_ARMS.items():
    def by_seed(want):
      return {run.seed: found[name] for g in groups if g["name"] == want
              for run, found, _ in g["runs"] if found[name] is not None}
    learned, frozen = by_seed(arm), by_seed(control)
    labels.append(f"{arm} vs {control}")
    for seed in sorted(set(learned) & set(frozen)):
      pair = value(learned[seed], frozen[seed])
      if pair is not None:
        out.append((seed, *pair))
  return ", ".join(labels), out


def _guarded_pairs(groups, name, value):
  """`control_pairs`, with a control seed whose file lacks what `value` reads left out."""
  def safe(a, b):
    try:
      return value(a, b)
    except (KeyError, TypeError, IndexError, AttributeError):
      return None
  return control_pairs(groups, name, safe)


def against_frozen(verdict: str, label: str, pairs, what: str) -> str:
  """A "reproduced" ID verdict read against the frozen random router: it stands only where
  the learned router beats the frozen one on the same measure (paired t over seeds,
  two-sided, p < 0.05, unadjusted); otherwise the row says the measure does not tell the
  learned router from a random projection. Other verdicts are returned as they are."""
  if not verdict.startswith("reproduced"):
    return verdict
  rest = verdict.split(": ", 1)[1] if ": " in verdict else verdict
  test = stats.paired_t([a - b for _, a, b in pairs])
  if test["n"] < 2:
    return (f"pending the frozen-router control: {what} needs two seeds of both {label} "
            f"({test['n']} paired); {rest}")
  means = (f"{_pct(sum(a for _, a, _ in pairs) / len(pairs))} vs "
           f"{_pct(sum(b for _, _, b in pairs) / len(pairs))}")
  numbers = (f"{what} {label} {means}, learned − frozen {100 * test['mean']:+.2f} pp "
             f"[{100 * test['ci'][0]:+.2f}, {100 * test['ci'][1]:+.2f}] (paired t over seeds "
             f"{', '.join(str(k) for k, _, _ in pairs)}, p = {test['p']:.3g})")
  if test["p"] < stats.ALPHA and test["mean"] > 0:
    return f"{verdict}; the learned router beats the frozen random one: {numbers}"
  if test["p"] < stats.ALPHA:
    return f"not reproduced: the frozen random router scores higher: {numbers}; {rest}"
  return f"not distinguished from a frozen random router: {numbers}; {rest}"


def id_claims(root: Path) -> list[tuple[str, str, str, str]]:
  """Summary rows (claim, paper, ours, verdict) of the ID analyses: every analysed seed of
  r16 and r64, and the random-router control."""
  rows = []
  groups = analysed_groups(root)

  def row(claim, paper, name, ours_fn, verdict_fn):
    found = _main_results(groups, name)
    if not found:
      rows.append((claim, paper, "–", _pending(groups, name)))
      return
    rows.append((claim, paper, _guarded(ours_fn, found) + f" ({_arms_text(groups, name)})",
                 _guarded(verdict_fn, found)))

  def util_ours(us):
    return ("dead codes " + _span([sum(r["dead_codes"] for r in u["layers"].values())
                                   for u in us], str) + f" / "
            f"{sum(r['total_codes'] for r in us[0]['layers'].values())} per run; normalised "
            f"entropy " + _span([r["normalised_entropy"] for u in us
                                 for r in u["layers"].values()], _g3))

  def util_verdict(us):
    # Collapse: many dead codes (1% or more) or a low normalised entropy (below 0.5).
    dead = max(sum(r["dead_codes"] for r in u["layers"].values()) for u in us)
    total = sum(r["total_codes"] for r in us[0]["layers"].values())
    entropy = [r["normalised_entropy"] for u in us for r in u["layers"].values()]
    text = f"normalised entropy {_span(entropy, _g3)} over {_n_runs(len(us))}"
    if dead == 0:
      return f"reproduced: no dead code, {text}"
    if dead < 0.01 * total and min(entropy) >= 0.5:
      return f"reproduced: no collapse ({text}), but up to {dead} / {total} codes dead (paper 0)"
    return f"not reproduced: up to {dead} / {total} codes dead, {text}"

  row("the codes are used, not collapsed (C.1)", "dead codes " + ", ".join(
      f"{d} / {t:,}" for *_, d, t in PAPER_TABLE9) + "; normalised entropy " + ", ".join(
      f"{e:.3f}" for _, _, e, *_ in PAPER_TABLE9) + " (Table 9)",
      "utilisation", util_ours, util_verdict)

  def perm_tests(ks):
    return [k["layers"][layer]["permutation"][level] for k in ks
            for layer, level, _ in _settings(k, "rho")]

  def null_verdict(ks):
    tests = perm_tests(ks)
    below = sum(t["p"] <= 0.05 for t in tests)
    above_all = sum(t["observed"] > t["null_max"] for t in tests)
    strata = sorted({k.get("perm_strata", "nuisance") for k in ks})
    text = (f"p ≤ 0.05 in {below}/{len(tests)} run × layer × target settings, above every "
            f"permutation in {above_all}/{len(tests)} (cells: {', '.join(strata)})")
    return _count_verdict(below, len(tests), text)

  row("the IDs alone carry the semantics: ID-KNN above the permutation null (§3.2)",
      f"observed AP above all 500 permutations, p = {PAPER_P:.4g} in all "
      f"{len(PAPER_TABLE1)} settings (Table 1)", "id_knn",
      lambda ks: f"permutation p {_span([t['p'] for t in perm_tests(ks)], _g4)} "
                 f"({ks[0]['n_perm']} permutations)", null_verdict)

  def rho_means(ks, key):
    """Per (layer, level) setting: the mean over one arm's seeds of `key` where it is
    defined and resolved; None where no seed has it so (the hidden state does not beat the
    reader, so ρ has no positive denominator: `id_readers.rho`; or only within resampling
    noise: `_unresolved`). Raises KeyError where a seed's
    analysis lacks `key` altogether (one from before the surface readers)."""
    out = []
    for layer, level, _ in _settings(ks[0], "rho"):
      for k in ks:
        k["layers"][layer][key][level]   # KeyError: see above
      values = [v for v in (_rho(k, layer, level, key) for k in ks) if v is not None]
      out.append(sum(values) / len(values) if values else None)
    return out

  arms = [(g, _results(g, "id_knn")) for g in groups if g["name"] in ID_ARMS]
  arms = [(g, ks) for g, ks in arms if ks]

  def rho_row(claim, paper, key, label):
    if not arms:
      rows.append((claim, paper, "–", _pending(groups, "id_knn")))
      return
    if any(_get(k, "layers", layer, key) is None for _, ks in arms for k in ks
           for layer in k["layers"]):
      rows.append((claim, paper, "–", f"pending: {label} missing (an analysis from before "
                   "the surface readers)"))
      return
    try:
      means = {_label(g): rho_means(ks, key) for g, ks in arms}
    except (KeyError, TypeError, IndexError) as e:
      rows.append((claim, paper, "–", f"pending: analysis file lacks {type(e).__name__} {e}"))
      return
    ours = "; ".join(f"{_label(g)} (n={len(ks)}) mean {label} per setting {_span(means[_label(g)])}"
                     for g, ks in arms)
    flat = [v for m in means.values() for v in m]
    defined = [v for v in flat if v is not None]
    undefined = len(flat) - len(defined)
    note = (f"; undefined in {undefined}/{len(flat)} (in no seed does the hidden state beat "
            "that reader beyond resampling noise, so nothing is there to retain)"
            if undefined else "")
    if not defined:
      rows.append((claim, paper, ours, f"not evaluable: {label} undefined in every arm × "
                   "setting (the hidden state never beats that reader)"))
      return
    most = sum(v > 0.5 for v in defined)
    verdict = _count_verdict(
        most, len(defined), f"the arm's mean {label} over seeds > 50% in {most}/{len(defined)} "
                            f"arm × settings where it is defined{note}")

    def mean_rho(learned, frozen):
      # Over the settings where both runs' ρ is defined and resolved.
      both = [(a, b) for la, lv, _ in _settings(learned, "rho")
              if (a := _rho(learned, la, lv, key)) is not None
              and (b := _rho(frozen, la, lv, key)) is not None]
      if not both:
        return None
      return sum(a for a, _ in both) / len(both), sum(b for _, b in both) / len(both)

    control, pairs = _guarded_pairs(groups, "id_knn", mean_rho)
    rows.append((claim, paper, ours, against_frozen(
        verdict, control, pairs, f"mean {label} over the settings defined in both")))

  rho_row("ID-KNN keeps most of the hidden state's excess AP over the nuisance reader (§3.2)",
          f"ρ {_span([r[-1] for r in PAPER_TABLE1])} (Table 1)", "rho", "ρ vs nuisance")
  rho_row("... and over the best surface reader (bytes alone)",
          "not measured in the paper (no surface reader)", "rho_surface", "ρ vs best surface")

  for control, arm in CONTROL_ARMS.items():
    learned = [r for g in groups if g["name"] == arm for r in _results(g, "id_knn")]
    frozen = [r for g in groups if g["name"] == control for r in _results(g, "id_knn")]
    ours = "–" if not learned or not frozen else (
        f"ID-KNN mean AP {arm} {_span([v for r in learned for v in _ap_values(r)], _f4)} vs "
        f"{control} {_span([v for r in frozen for v in _ap_values(r)], _f4)}")
    rows.append((f"a learned router carries more than a random one ({arm} vs {control})",
                 "not measured in the paper", ours, control_verdict(learned, frozen)))

  def assoc_verdict(assocs):
    rates = [a["total"]["rate"] for a in assocs]
    text = f"({_mean_sd(rates)} over {_n_runs(len(rates))}; paper {_pct(ASSOC['rate'])})"
    if min(rates) > 0.5:
      return f"reproduced: most evaluable candidates replicate in every run {text}"
    if max(rates) <= 0.5:
      return f"not reproduced: at most half replicate in every run {text}"
    return f"inconclusive at this scale: above half in some runs only {text}"

  def assoc_against_frozen(assocs):
    control, pairs = _guarded_pairs(
        groups, "associations", lambda a, b: (a["total"]["rate"], b["total"]["rate"]))
    return against_frozen(assoc_verdict(assocs), control, pairs, "replication rate")

  row("single-code associations replicate on held-out files (C.2)",
      f"{ASSOC['replicated']:,} / {ASSOC['evaluable']:,} = {_pct(ASSOC['rate'])}", "associations",
      lambda assocs: f"{_mean_sd([a['total']['rate'] for a in assocs])} replicate",
      assoc_against_frozen)

  def ratio_verdict(ds):
    ratios = [v for d in ds for v in _values(d, "ratio")]
    above = sum(v > 1 for v in ratios)
    return _count_verdict(above, len(ratios),
                          f"AP_R > AP_1 in {above}/{len(ratios)} run × settings")

  row("the full signature beats its best single route (C.3)",
      f"AP_128 / AP_1 = {_span(DIST['ap_ratio_range'], _x2)}, 6/6 settings",
      "distributed", lambda ds: f"AP_R / AP_1 = {_span([v for d in ds for v in _values(d, 'ratio')], _x2)} "
                                f"(R = {_span([_routes_of(d) for d in ds], str)})", ratio_verdict)

  def joint_verdict(ds):
    pairs = [(v, d["layers"][layer]["rho_id_knn"][level]) for d in ds
             for layer, level, v in _settings(d, "rho")]
    below = sum(s is not None and i is not None and s < i for s, i in pairs)
    return _count_verdict(below, len(pairs),
                          f"S_dict ρ below ID-KNN ρ in {below}/{len(pairs)} run × settings")

  row("the joint signature carries more than the single-code marginals (C.3)",
      f"S_dict ρ {_span(DIST['rho_range'])} vs ID-KNN ρ {_span(DIST['id_knn_rho_range'])}",
      "distributed", lambda ds: f"S_dict ρ {_span([v for d in ds for v in _values(d, 'rho')])} vs "
                                f"ID-KNN ρ {_span([v for d in ds for v in _values(d, 'rho_id_knn')])}",
      joint_verdict)
  return rows
