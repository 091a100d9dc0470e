"""The Lngram reproduction report's analysis parts (`experiments.tools.report` prints them).

The ID analyses (§3, App. C) are `experiments.tools.report.ids` and `.id_claims`
(re-exported here: every seed of r16 and r64 and the random-router control); this module
adds the insertion comparison (App. B, address stability B.2 and injection B.3), read from
the JSON files that `lngram-exp analyze` writes into `<run>/analysis/`, with the paper's
numbers imported from the analysis modules, and the summary-table rows (claim,
paper, ours, verdict) of both. What is missing prints as "pending: <why>", never an
error.

B.2 is read against its LR-matched control. The inserted run's backbone trains at 0.05x
the LR, the run from step 0 at the full LR; with the router fixed (the primary protocol),
code agreement measures how far the backbone drifts, which the LR alone can explain. So
the pair earns no "reproduced" by itself: that needs the declared control (family
`controls_v3`: Lngram inserted at 0.05x into the mature step-600 backbone against the same
insertion into a young step-200 one, every seed), and until its records exist the verdict
says the comparison is confounded by the LR and names the control as pending.
"""

from __future__ import annotations

from pathlib import Path

from experiments.analysis.injection import PAPER_TABLE7, PAPER_TABLE8
from experiments.analysis.stability import PAPER_TABLE6
from experiments.tools import reproduce
from experiments.tools.report.collect import collect, finals, mean_std, read_analysis
from experiments.tools.report.id_claims import id_claims
from experiments.tools.report.ids import _guarded, id_section

__all__ = ["analysis_claims", "id_claims", "id_section", "insertion_section"]


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


def lr_matched_control(root: Path) -> tuple[str, str]:
  """(state, text) of the LR-matched B.2 control: the stability claim of the declared
  family `controls_v3` read from the records (experiments.tools.reproduce.declared), state
  "pending" until every claim of the family has its seeds, then its verdict."""
  try:
    from experiments.tools.reproduce import declared
    from experiments.tools.reproduce.design import FAMILIES, YOUNG_BASE, YOUNG_INSERTED

    family = FAMILIES["controls_v3"]
    rows = declared.claim_values(family, root)
    row, holm_p, verdict = next(t for t in declared.tested(family, rows)
                                if t[0]["claim"].measure == "stability")
  except (ImportError, AttributeError, KeyError, StopIteration) as e:
    return "pending", f"not declared ({type(e).__name__} {e})"
  what = (f"bytes/{YOUNG_INSERTED} (inserted at 0.05x into the step-200 "
          f"`bytes/{YOUNG_BASE}`) against bytes/inserted_low (into the step-600 baseline), "
          f"family controls_v3")
  test, n = row["test"], len(family.seeds)
  if verdict.startswith("pending"):
    return "pending", f"{what}: {len(row['seeds'])} of {n} seeds recorded"
  numbers = (f"code agreement mature − young {test['mean']:+.4f} [{test['ci'][0]:+.4f}, "
             f"{test['ci'][1]:+.4f}], n = {test['n']}, p {test['p']:.3g}, Holm p {holm_p:.3g}")
  return verdict, f"{what}: {numbers}"


def b2_verdict(reading: str, control: tuple[str, str]) -> str:
  """The B.2 verdict: the insertion pair's reading (`stability_verdict`) in the light of
  the LR-matched control. A reading in the paper's direction is "confounded by the
  learning rate" while the control is pending, "reproduced" only when the control
  supports it; a reading against the paper stands (the LR favours the inserted run)."""
  state, text = control
  if not reading.startswith("reproduced"):
    return reading
  body = reading.split(": ", 1)[1] if ": " in reading else reading
  lr = ("the inserted run's backbone trains at 0.05x the LR, the run from step 0 at the "
        "full LR, and with the router fixed code agreement measures the backbone's drift, "
        "which the LR alone can explain")
  if state == "supported":
    return (f"reproduced (LR-matched control): at 0.05x the LR the mature backbone's "
            f"insertion is more stable than the young one's ({text}); one seed against from "
            f"step 0: {body}")
  if state == "reversed":
    return (f"not reproduced at an equal LR: the young backbone's insertion is the more "
            f"stable ({text}); the pair's {body} is the LR's")
  if state == "not shown":
    return (f"not shown at an equal LR ({text}); the pair's {body} is confounded: {lr}")
  return (f"confounded by the learning rate: {body}, but {lr}; the LR-matched control "
          f"is pending ({text})")


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


def _b2(pair, root: Path) -> str:
  reading = _pair_verdict(pair, "stability", stability_verdict)
  return reading if reading.startswith("pending") else b2_verdict(reading,
                                                                  lr_matched_control(root))


def insertion_section(root: Path, results: dict | None = None) -> str:
  results = collect(root) if results is None else results
  pair = _insertion_analyses(root)
  (ins, *_), (scr, *_) = pair
  by_label = {label: finals(results, r.experiment, r.name, r.seed) for r, label, *_ in pair}
  # The inserted run's own control: its baseline continued the same way without memory.
  control = f"{ins.experiment}/continued_low_s{ins.seed}"
  base = finals(results, ins.experiment, "continued_low", ins.seed)
  lines = ["#### Insertion vs from scratch (App. B)", "",
           f"Lngram inserted at step {reproduce.step_offset(ins)} into the final baseline "
           f"(`{ins.key}`: {reproduce.steps(ins)} more steps from the backbone of "
           f"`{ins.after}`, its own warm-up and decay, backbone LR x0.05) against Lngram "
           f"from step 0 (`{scr.key}`, {reproduce.steps(scr)} steps); the same Lngram config "
           f"and seed. The inserted memory trains {reproduce.steps(ins)} steps on a mature "
           f"backbone, the other {reproduce.steps(scr)} with its backbone; stability compares "
           "intervals of equal length (`reproduce.STABILITY_STEPS`). One seed each: the CIs "
           "below are over documents, not over training seeds. Final validation bits/byte: "
           + ", ".join(f"{label} {mean_std(v) if v else 'pending'}"
                       for label, v in by_label.items())
           + f", continued baseline (`{control}`) {mean_std(base) if base else 'pending'}. "
           "The inserted backbone trains at 0.05x the LR, the one from step 0 at the full LR: "
           "B.2's verdict waits for the LR-matched control (insertion at 0.05x into a young "
           "step-200 backbone against the mature one, every seed; `controls_v3`).", ""]
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
      f"Verdict (B.2): {_b2(pair, root)}.", ""]
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


def analysis_claims(root: Path) -> list[tuple[str, str, str, str]]:
  """Summary rows (claim, paper, ours, verdict): the ID analyses', then the insertion pair's."""
  rows = id_claims(root)
  pair = _insertion_analyses(root)
  text = [r for r in PAPER_TABLE6 if r[1] == "text"]
  rows.append(("inserted Lngram has more stable addresses (B.2)",
               "code agreement (text) " + ", ".join(f"L{r[0]} {r[2][1]:.4f} (mature) vs "
                                                    f"{r[2][0]:.4f} (new)" for r in text)
               + " (Table 6)", _pair_ours(pair, "stability", stability_values,
                                          "code agreement, last interval, inserted vs from "
                                          "step 0: "),
               _b2(pair, root)))
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
