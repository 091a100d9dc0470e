"""The Lngram reproduction report's analysis parts (`experiments.report` prints them).

The ID analyses of the best Lngram v2 run (§3, App. C) and the insertion comparison
(App. B, address stability B.2 and injection B.3), read from the JSON files that
`lngram-exp analyze` writes into `<run>/analysis/` (`python -m experiments.reproduce
analyze` runs it on the right runs), with the paper's numbers imported from the
analysis modules and summary-table rows (claim, paper, ours, verdict). What is missing
prints as "pending: <why>", never an error.
"""

from __future__ import annotations

from pathlib import Path

from experiments import reproduce
from experiments.analysis.associations import PAPER as ASSOC
from experiments.analysis.distributed import PAPER as DIST
from experiments.analysis.id_readers import PAPER_P, PAPER_TABLE1
from experiments.analysis.injection import PAPER_TABLE7, PAPER_TABLE8
from experiments.analysis.stability import PAPER_TABLE6
from experiments.analysis.utilisation import PAPER_TABLE9
from experiments.results import collect, finals, mean_std, read_analysis


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


def best_run(root: Path):
  """(run, final bits/byte, n finished candidates) of the best Lngram v2 run, or None."""
  runs = reproduce.plan()
  best = reproduce.best_lngram_run(root, runs)
  if best is None:
    return None
  n = sum(1 for r in runs if r.experiment == "main" and r.name in reproduce.BEST_ARMS
          and reproduce.finished(r, root))
  return (*best, n)


def _utilisation_ours(u: dict) -> str:
  return "; ".join(
      f"layer {layer}: {row['n_eff']:.2f} effective codes of {u['codes_per_route']}, "
      f"normalised entropy {row['normalised_entropy']:.3f}, top code "
      f"{100 * row['top_freq']:.1f}%, dead {row['dead_codes']} / {row['total_codes']}"
      for layer, row in u["layers"].items())


def _utilisation_paper() -> str:
  return "; ".join(f"layer {layer}: {n_eff:.2f} of 16, {ent:.3f}, {100 * top:.1f}%, dead "
                   f"{dead} / {total:,}" for layer, n_eff, ent, top, dead, total in PAPER_TABLE9)


def _id_knn_ours(k: dict) -> str:
  rhos = _settings(k, "rho")
  ps = [k["layers"][layer]["permutation"][level]["p"] for layer, level, _ in rhos]
  order = sum(bool(k["layers"][layer]["ordering"][level]) for layer, level, _ in rhos)
  return (f"excess AP retained ρ {_span(_values(k, 'rho'))} over {len(rhos)} settings; "
          f"permutation p {_span(ps, _g4)} ({k['n_perm']} permutations); "
          f"H_model > Q_route > ID-KNN > nuisance in {order}/{len(rhos)}")


def _id_knn_paper() -> str:
  return (f"ρ {_span([row[-1] for row in PAPER_TABLE1])} over {len(PAPER_TABLE1)} settings; "
          f"p = {PAPER_P:.4g} (1/501) in every setting; ordering in all")


def _associations_ours(a: dict) -> str:
  t = a["total"]
  local = ", ".join(f"layer {key.split('/')[0]} {_pct(row['rate'])}"
                    for key, row in a["by_layer_level"].items() if key.endswith("/local"))
  return (f"{t['candidates']} candidates, {t['evaluable']} evaluable, {t['replicated']} "
          f"replicated: {_pct(t['rate'])}" + (f"; local level {local}" if local else ""))


def _associations_paper() -> str:
  local = ", ".join(f"layer {layer} {_pct(rate)}"
                    for layer, rate in ASSOC["rate_local_presence"].items())
  return (f"{ASSOC['candidates']:,} / {ASSOC['evaluable']:,} / {ASSOC['replicated']:,}: "
          f"{_pct(ASSOC['rate'])}; local presence {local}")


def _routes_of(d: dict) -> int:
  return max(max(row["ms"]) for row in d["layers"].values())


def _distributed_ours(d: dict) -> str:
  return (f"S_dict ρ {_span(_values(d, 'rho'))}, ID-KNN ρ {_span(_values(d, 'rho_id_knn'))}; "
          f"AP_R / AP_1 {_span(_values(d, 'ratio'), _x2)} (R = {_routes_of(d)} routes)")


def _distributed_paper() -> str:
  return (f"S_dict ρ {_span(DIST['rho_range'])}, ID-KNN ρ {_span(DIST['id_knn_rho_range'])}; "
          f"AP_128 / AP_1 {_span(DIST['ap_ratio_range'], _x2)}")


def _id_knn_table(k: dict) -> str:
  lines = ["| layer | target | H_model | Q_route | ID-KNN | nuisance | ρ (excess AP retained) | "
           "perm. p | observed vs null max |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
  for layer, row in k["layers"].items():
    for level, rho in row["rho"].items():
      ap, perm = row["ap"], row["permutation"][level]
      lines.append(f"| {layer} | {level} | " + " | ".join(
          f"{ap[r][level]:.4f}" for r in ("H_model", "Q_route", "ID", "nuisance"))
          + f" | {_pct(rho)} | {perm['p']:.4g} | {perm['observed']:.4f} vs "
          f"{perm['null_max']:.4f} |")
  return "\n".join(lines)


def _examples_table(a: dict) -> str:
  lines = ["| code expression | target level | P (held-out) | P0 | Δ | n |",
           "|---|---|---:|---:|---:|---:|"]
  for e in a["examples"]:
    lines.append(f"| `{e['expression']}` | {e['level']} | {_pct(e['P'])} | {_pct(e['P0'])} | "
                 f"{100 * e['delta']:+.2f} pp | {e['n']} |")
  return "\n".join(lines)


ID_ANALYSES = (  # name, section of the paper, ours, paper
    ("utilisation", "C.1, Table 9", _utilisation_ours, _utilisation_paper),
    ("id_knn", "§3.2, Table 1", _id_knn_ours, _id_knn_paper),
    ("associations", "C.2", _associations_ours, _associations_paper),
    ("distributed", "C.3", _distributed_ours, _distributed_paper),
)


def id_section(root: Path) -> str:
  lines = ["#### ID analyses on the best run (§3, App. C)", ""]
  best = best_run(root)
  if best is None:
    return "\n".join(lines + ["pending: no Lngram v2 run of main has finished."])
  run, value, n = best
  workdir = reproduce.run_dir(run, root)
  lines += [f"The best Lngram v2 run is `{run.key}`: final validation {value:.4f} bits/byte, "
            f"the lowest of the {n} finished lngram_r16 / lngram_r64 runs of main (one run: "
            f"no seed spread). `lngram-exp analyze` wrote these numbers into "
            f"`{workdir}/analysis/`. Our targets are read from Python source (token kind, "
            "enclosing statement, imported module), the paper's from COCO (caption mention, "
            "local / visual presence): the numbers compare in kind, not one to one.", "",
            "| analysis | ours | paper |", "|---|---|---|"]
  results = {}
  for name, where, ours, paper in ID_ANALYSES:
    results[name], why = read_analysis(workdir, name)
    cell = why if results[name] is None else _guarded(ours, results[name])
    lines.append(f"| {name} ({where}) | {cell} | {paper()} |")
  steps = sorted({r["source"]["step"] for r in results.values()
                  if isinstance(r, dict) and isinstance(r.get("source"), dict)})
  if steps:
    lines += ["", f"Computed from checkpoint step{'s' if len(steps) > 1 else ''} "
              f"{', '.join(map(str, steps))} of `{run.key}`."]
  if results["id_knn"] is not None:
    perm_queries = results["id_knn"].get("perm_queries", "a subset of the")
    lines += ["", "ID-KNN per setting (mean AP per reader; ρ = (ID − nuisance) / (H_model − "
              "nuisance); p: the permutation test of the reference signatures, its observed AP "
              f"and the null's maximum on {perm_queries} of the queries):", "",
              _guarded(_id_knn_table, results["id_knn"])]
    try:
      above = [f"layer {layer} {level}" for layer, level, v in _settings(results["id_knn"], "rho")
               if v is not None and v > 1]
    except (KeyError, TypeError, AttributeError):
      above = []
    if above:
      lines += ["", f"ρ above 100% ({', '.join(above)}): the ID reader beat the hidden-state "
                "reader there; where H_model's excess over the nuisance is small, ρ is noisy."]
  if results["associations"] is not None:
    lines += ["", "The strongest held-out single-code associations (App. C.2, Table 10's form):",
              "", _guarded(_examples_table, results["associations"])]
  return "\n".join(lines)


def _insertion_runs():
  by_key = {r.key: r for r in reproduce.plan()}
  return [by_key[k] for k in reproduce.INSERTION_PAIR]


def _last_stability(result: dict, offset: int) -> dict:
  """{layer: row} of the primary protocol's last interval, steps in total training steps."""
  rows = [r for r in result["rows"] if r["protocol"] == result.get("primary", "fixed")]
  out = {}
  for r in sorted(rows, key=lambda r: r["to_step"]):
    out[str(r["layer"])] = {**r, "from": r["from_step"] + offset, "to": r["to_step"] + offset}
  return out


def _ci(v) -> str:
  return f"{v[0]:.4f} [{v[1]:.4f}, {v[2]:.4f}]"


def stability_verdict(inserted: dict, scratch: dict) -> str:
  """Inserted vs from step 0: code agreement of the last interval, per layer, by CI."""
  layers = sorted(set(inserted) & set(scratch))
  if not layers:
    return "pending: no interval of two kept checkpoints in both runs"
  ins = {k: inserted[k]["code_agreement"] for k in layers}   # [estimate, low, high]
  scr = {k: scratch[k]["code_agreement"] for k in layers}
  more = [k for k in layers if ins[k][1] > scr[k][2]]
  less = [k for k in layers if ins[k][2] < scr[k][1]]
  gap_i = inserted[layers[0]]["to"] - inserted[layers[0]]["from"]
  gap_s = scratch[layers[0]]["to"] - scratch[layers[0]]["from"]
  values = ", ".join(f"L{k} {ins[k][0]:.4f} vs {scr[k][0]:.4f}" for k in layers)
  spans = f"over {gap_i} vs {gap_s} steps"
  if len(more) == len(layers):
    if gap_i < gap_s:
      return (f"inconclusive at this scale: inserted more stable at every layer ({values}), "
              f"but {spans} (a shorter interval leaves less time to move)")
    return f"reproduced (one seed, CIs disjoint): inserted more stable ({values}) {spans}"
  if len(less) == len(layers):
    if gap_i <= gap_s:
      return f"not reproduced (one seed, CIs disjoint): inserted less stable ({values}) {spans}"
    return (f"inconclusive at this scale: inserted less stable ({values}), but {spans} "
            "(a longer interval leaves more time to move)")
  return (f"inconclusive at this scale: more stable at {len(more)}, less at {len(less)} of "
          f"{len(layers)} layers ({values}) {spans}")


def _injection_values(inj: dict) -> dict[str, float]:
  """Immediate R per Lngram layer and the next-token logit R with all of them off."""
  out = {f"immediate R L{layer}": inj["interventions"][str(layer)]["immediate_R"]
         for layer in inj["layers"]}
  out["logit R (all off)"] = inj["interventions"]["all"]["logit_R"]
  return out


def injection_values(inserted: dict, scratch: dict) -> str:
  a, b = _injection_values(inserted), _injection_values(scratch)
  return ", ".join(f"{n} {a[n]:.4g} vs {b[n]:.4g}" for n in a
                   if b.get(n) is not None and a[n] is not None)


def injection_verdict(inserted: dict, scratch: dict) -> str:
  a, b = _injection_values(inserted), _injection_values(scratch)
  names = [n for n in a if b.get(n) is not None and a[n] is not None]
  if not names:
    return "pending: no injection measure in both runs"
  larger = [n for n in names if a[n] > b[n]]
  if len(larger) == len(names):
    direction = f"inserted larger in all {len(names)} measures (the paper's direction)"
  elif not larger:
    direction = f"inserted smaller in all {len(names)} measures (against the paper)"
  else:
    direction = f"inserted larger in {len(larger)}/{len(names)} measures ({', '.join(larger)})"
  return f"one seed: {direction}, no spread"


def stability_values(inserted: dict, scratch: dict) -> str:
  return "; ".join(f"L{k} {_ci(inserted[k]['code_agreement'])} ({inserted[k]['from']}→"
                   f"{inserted[k]['to']}) vs {_ci(scratch[k]['code_agreement'])} "
                   f"({scratch[k]['from']}→{scratch[k]['to']})"
                   for k in sorted(set(inserted) & set(scratch)))


def _insertion_analyses(root: Path):
  """[(run, label, step offset, {name: result or None}, {name: why})] of the pair."""
  out = []
  for run, label in zip(_insertion_runs(), ("inserted", "from step 0"), strict=True):
    results, whys = {}, {}
    for name in reproduce.INSERTION_ANALYSES:
      if not reproduce.finished(run, root):
        results[name], whys[name] = None, f"pending: {run.key} not finished"
      else:
        results[name], whys[name] = read_analysis(reproduce.run_dir(run, root), name)
    out.append((run, label, reproduce.step_offset(run), results, whys))
  return out


def _pair_ours(pair, name: str, fn, prefix: str) -> str:
  cell = _pair_verdict(pair, name, fn)
  return "–" if cell.startswith("pending") else prefix + cell


def _pair_verdict(pair, name: str, fn) -> str:
  (_, _, off_i, res_i, why_i), (_, _, off_s, res_s, why_s) = pair
  if res_i[name] is None or res_s[name] is None:
    return why_i[name] if res_i[name] is None else why_s[name]
  if name == "stability":
    return _guarded(lambda a, b: fn(_last_stability(a, off_i), _last_stability(b, off_s)),
                    res_i[name], res_s[name])
  return _guarded(fn, res_i[name], res_s[name])


def insertion_section(root: Path, results: dict | None = None) -> str:
  results = collect(root) if results is None else results
  pair = _insertion_analyses(root)
  (ins, *_), (scr, *_) = pair
  by_label = {label: finals(results, r.experiment, r.name, r.seed) for r, label, *_ in pair}
  base = finals(results, "main", "baseline", scr.seed)
  lines = ["#### Insertion vs from scratch (App. B)", "",
           f"Lngram inserted at step {reproduce.step_offset(ins)} into the baseline (`{ins.key}`: "
           f"{reproduce.steps(ins)} more steps from the backbone of `{ins.after}`) against "
           f"Lngram from step 0 (`{scr.key}`, {reproduce.steps(scr)} steps); the same Lngram "
           "config and seed, the same total steps (each leg of the inserted run has its own "
           "warm-up and decay). One seed each: the CIs below are over documents, not over "
           "training seeds. Final validation bits/byte: "
           + ", ".join(f"{label} {mean_std(v) if v else 'pending'}"
                       for label, v in by_label.items())
           + f", baseline (`main/baseline_s{scr.seed}`) "
           f"{mean_std(base) if base else 'pending'}.", ""]
  lines += ["B.2 address stability over the last interval each run's stability analysis "
            "measured (the checkpoints `reproduce.STABILITY_STEPS` names, else the last two "
            "kept), primary protocol (the final router on each checkpoint's backbone, Lngram "
            "off); steps counted from the start of the backbone's training; 95% "
            "document-bootstrap CIs:", "",
            "| layer | run | steps | code agreement ↑ | Hamming ↓ | 2-gram survival ↑ | "
            "3-gram survival ↑ |", "|---|---|---|---|---|---|---|"]
  last = {}
  for _, label, offset, res, why in pair:
    if res["stability"] is None:
      lines.append(f"| – | {label} | {why['stability']} | | | | |")
      continue
    try:
      last[label] = _last_stability(res["stability"], offset)
    except (KeyError, TypeError) as e:
      lines.append(f"| – | {label} | pending: stability.json lacks {e} | | | | |")
      continue
    if not last[label]:
      lines.append(f"| – | {label} | pending: fewer than two kept checkpoints | | | | |")
    for layer, r in last[label].items():
      lines.append(f"| {layer} | {label} | {r['from']}→{r['to']} | " + " | ".join(
          _ci(r[m]) for m in ("code_agreement", "hamming", "survival_2", "survival_3")) + " |")
  lines += ["", "Paper (Table 6, text positions, new VLM / mature Keye2B): " + "; ".join(
      f"layer {layer}: code agreement {ca[0]:.4f} / {ca[1]:.4f}, 3-gram survival "
      f"{s3[0]:.4f} / {s3[1]:.4f}" for layer, mod, ca, _, _, s3 in PAPER_TABLE6
      if mod == "text") + ".", "",
      f"Verdict (B.2): {_pair_verdict(pair, 'stability', stability_verdict)}.", ""]
  lines += ["B.3 injection: the Lngram delta disabled at one layer (immediate R at that layer, "
            "final R at the last) or at all of them (next-token logits):", "",
            "| disabled | run | immediate R | final R | final retention | logit R | JS (nats) | "
            "top-1 agreement |", "|---|---|---:|---:|---:|---:|---:|---:|"]
  for _, label, _, res, why in pair:
    inj = res["injection"]
    if inj is None:
      lines.append(f"| – | {label} | {why['injection']} | | | | | |")
      continue
    for key, row in inj.get("interventions", {}).items():
      cells = [row.get(m) for m in ("immediate_R", "final_R", "final_retention", "logit_R",
                                     "js", "top1_agreement")]
      name = "all Lngram layers" if key == "all" else f"layer {key}"
      lines.append(f"| {name} | {label} | " + " | ".join(
          "–" if c is None else f"{c:.4g}" for c in cells) + " |")
  t7 = {(r[0], r[1], r[2]): r for r in PAPER_TABLE7}
  lines += ["", "Paper (Tables 7-8, text positions, new VLM vs Keye2B): " + "; ".join(
      f"layer {layer} immediate R {t7[layer, 'text', 'new'][3]:.4g} vs "
      f"{t7[layer, 'text', 'Keye2B'][3]:.4g}, final retention {t7[layer, 'text', 'new'][5]:.4g} "
      f"vs {t7[layer, 'text', 'Keye2B'][5]:.4g}" for layer in sorted({r[0] for r in PAPER_TABLE7}))
      + "; all off: " + ", ".join(f"{name} {new:.4g} vs {old:.4g}" for name, new, old in
                                  PAPER_TABLE8 if "hidden" not in name or "text" in name) + ".",
      "", f"Verdict (B.3): {_pair_verdict(pair, 'injection', injection_verdict)}."]
  return "\n".join(lines)


def _count_verdict(hits: int, total: int, text: str) -> str:
  """reproduced when every setting agrees, not reproduced when none does, else inconclusive."""
  if hits == total:
    return f"reproduced: {text}"
  return f"not reproduced: {text}" if hits == 0 else f"inconclusive at this scale: {text}"


def analysis_claims(root: Path) -> list[tuple[str, str, str, str]]:
  """Summary rows (claim, paper, ours, verdict) of the ID analyses and the insertion pair."""
  rows = []
  best = best_run(root)
  found: dict = {}
  if best is None:
    whys = dict.fromkeys(reproduce.ANALYSES[:4], "pending: no Lngram v2 run of main has finished")
  else:
    workdir = reproduce.run_dir(best[0], root)
    whys = {}
    for name in ("utilisation", "id_knn", "associations", "distributed"):
      found[name], whys[name] = read_analysis(workdir, name)
  on = f" ({best[0].key})" if best else ""

  def row(claim, paper, name, ours_fn, verdict_fn):
    if found.get(name) is None:
      rows.append((claim, paper, "–", whys[name]))
      return
    rows.append((claim, paper, _guarded(ours_fn, found[name]) + on,
                 _guarded(verdict_fn, found[name])))

  def util_ours(u):
    return "dead codes " + ", ".join(f"{r['dead_codes']} / {r['total_codes']}" for r in
                                     u["layers"].values()) + "; normalised entropy " + ", ".join(
        f"{r['normalised_entropy']:.3f}" for r in u["layers"].values())

  def util_verdict(u):
    # Collapse: many dead codes (1% or more) or a low normalised entropy (below 0.5).
    dead = sum(r["dead_codes"] for r in u["layers"].values())
    total = sum(r["total_codes"] for r in u["layers"].values())
    entropy = [r["normalised_entropy"] for r in u["layers"].values()]
    text = f"normalised entropy {_span(entropy, lambda x: f'{x:.3f}')}"
    if dead == 0:
      return f"reproduced: no dead code, {text}"
    if dead < 0.01 * total and min(entropy) >= 0.5:
      return f"reproduced: no collapse ({text}), but {dead} / {total} codes dead (paper 0)"
    return f"not reproduced: {dead} / {total} codes dead, {text}"

  row("the codes are used, not collapsed (C.1)", "dead codes " + ", ".join(
      f"{d} / {t:,}" for *_, d, t in PAPER_TABLE9) + "; normalised entropy " + ", ".join(
      f"{e:.3f}" for _, _, e, *_ in PAPER_TABLE9) + " (Table 9)",
      "utilisation", util_ours, util_verdict)

  def perms(k):
    return [k["layers"][layer]["permutation"][level]["p"] for layer, level, _ in
            _settings(k, "rho")]

  def null_verdict(k):
    ps = perms(k)
    below = sum(p <= 0.05 for p in ps)
    tests = [k["layers"][layer]["permutation"][level] for layer, level, _ in _settings(k, "rho")]
    above_all = sum(t["observed"] > t["null_max"] for t in tests)
    text = (f"p ≤ 0.05 in {below}/{len(ps)} layer × target settings, above every "
            f"permutation in {above_all}/{len(ps)}")
    return _count_verdict(below, len(ps), text)

  row("the IDs alone carry the semantics: ID-KNN above the permutation null (§3.2)",
      f"observed AP above all 500 permutations, p = {PAPER_P:.4g} in all "
      f"{len(PAPER_TABLE1)} settings (Table 1)", "id_knn",
      lambda k: f"permutation p {_span(perms(k), _g4)} "
                f"({k['n_perm']} permutations)", null_verdict)

  def rho_verdict(k):
    rhos = _values(k, "rho")
    most = sum(v > 0.5 for v in rhos)
    return _count_verdict(most, len(rhos), f"ρ > 50% in {most}/{len(rhos)} settings")

  row("ID-KNN keeps most of the hidden state's excess AP (§3.2)",
      f"ρ {_span([r[-1] for r in PAPER_TABLE1])} (Table 1)", "id_knn",
      lambda k: f"ρ {_span(_values(k, 'rho'))}", rho_verdict)

  def assoc_verdict(a):
    rate = a["total"]["rate"]
    text = f"({_pct(rate)}; paper {_pct(ASSOC['rate'])})"
    if rate > 0.5:
      return f"reproduced: most evaluable candidates replicate {text}"
    return f"not reproduced: fewer than half replicate {text}"

  row("single-code associations replicate on held-out files (C.2)",
      f"{ASSOC['replicated']:,} / {ASSOC['evaluable']:,} = {_pct(ASSOC['rate'])}", "associations",
      lambda a: f"{a['total']['replicated']} / {a['total']['evaluable']} = "
                f"{_pct(a['total']['rate'])}", assoc_verdict)

  def ratio_verdict(d):
    ratios = _values(d, "ratio")
    above = sum(v > 1 for v in ratios)
    return _count_verdict(above, len(ratios), f"AP_R > AP_1 in {above}/{len(ratios)} settings")

  row("the full signature beats its best single route (C.3)",
      f"AP_128 / AP_1 = {_span(DIST['ap_ratio_range'], _x2)}, 6/6 settings",
      "distributed", lambda d: f"AP_R / AP_1 = {_span(_values(d, 'ratio'), _x2)} "
                               f"(R = {_routes_of(d)})", ratio_verdict)

  def joint_verdict(d):
    pairs = [(v, d["layers"][layer]["rho_id_knn"][level]) for layer, level, v in
             _settings(d, "rho")]
    below = sum(s < i for s, i in pairs)
    text = f"S_dict ρ below ID-KNN ρ in {below}/{len(pairs)} settings"
    if below == len(pairs):
      return f"reproduced: {text}"
    return f"not reproduced: {text}" if below == 0 else f"inconclusive at this scale: {text}"

  row("the joint signature carries more than the single-code marginals (C.3)",
      f"S_dict ρ {_span(DIST['rho_range'])} vs ID-KNN ρ {_span(DIST['id_knn_rho_range'])}",
      "distributed", lambda d: f"S_dict ρ {_span(_values(d, 'rho'))} vs "
                               f"ID-KNN ρ {_span(_values(d, 'rho_id_knn'))}",
      joint_verdict)

  pair = _insertion_analyses(root)
  text = [r for r in PAPER_TABLE6 if r[1] == "text"]
  rows.append(("inserted Lngram has more stable addresses (B.2)",
               "code agreement (text) " + ", ".join(f"L{r[0]} {r[2][1]:.4f} (mature) vs "
                                                    f"{r[2][0]:.4f} (new)" for r in text)
               + " (Table 6)", _pair_ours(pair, "stability", stability_values,
                                          "code agreement, last interval, inserted vs from "
                                          "step 0: "),
               _pair_verdict(pair, "stability", stability_verdict)))
  t7 = {(r[0], r[1], r[2]): r for r in PAPER_TABLE7}
  logit = next(r for r in PAPER_TABLE8 if r[0] == "next-token logit R")
  rows.append(("inserted Lngram injects more into the backbone (B.3)",
               "immediate R (text) " + ", ".join(
                   f"L{layer} {t7[(layer, 'text', 'Keye2B')][3]:.4g} vs "
                   f"{t7[(layer, 'text', 'new')][3]:.4g}" for layer in (1, 13))
               + f"; logit R {logit[2]:.4g} vs {logit[1]:.4g} (mature vs new, Tables 7-8)",
               _pair_ours(pair, "injection", injection_values, "inserted vs from step 0: "),
               _pair_verdict(pair, "injection", injection_verdict)))
  return rows
