"""The Lngram reproduction report's ID-analysis part (`experiments.tools.report` prints it).

The ID analyses (§3, App. C of the Lngram v2 paper) of EVERY finished seed of the
Lngram v2 arms r16 and r64 and of the random-router control (the same Lngram with
its router frozen at init), read from the JSON files that `lngram-exp analyze`
writes into `<run>/analysis/` (`python -m experiments.tools.reproduce analyze` runs it):
headline numbers beside the paper's as mean ± sd over seeds, the ID-KNN table with
the surface readers, ρ against the nuisance and the best surface reader (with
bootstrap CIs for one seed) and the permutation p, the strongest associations of
one run (the summary-table rows are id_claims.py's). What is missing prints as
"pending: <why>".
"""

from __future__ import annotations

from pathlib import Path

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
