"""The summary-table rows of the ID analyses (`experiments.tools.report` prints them with
the claim family): each claim of §3 and App. C of the Lngram v2 paper beside the paper's
number, ours over every analysed seed of r16 and r64 (ids.py reads them), and a verdict
computed from those numbers; a "reproduced" verdict is then read against the frozen
random-router control (CONTROL_ARMS), paired by seed.
"""

from __future__ import annotations

from math import comb
from pathlib import Path

from experiments.analysis import stats
from experiments.analysis.associations import PAPER as ASSOC
from experiments.analysis.distributed import PAPER as DIST
from experiments.analysis.id_readers import PAPER_P, PAPER_TABLE1
from experiments.analysis.utilisation import PAPER_TABLE9
from experiments.tools.report.ids import (
    CONTROL_ARMS,
    ID_ARMS,
    NO_RUN,
    _f4,
    _g3,
    _g4,
    _get,
    _guarded,
    _label,
    _mean_sd,
    _n_runs,
    _pct,
    _results,
    _rho,
    _routes_of,
    _settings,
    _span,
    _values,
    _x2,
    analysed_groups,
)

Row = tuple[str, str, str, str]   # claim, paper, ours, verdict


def id_claims(root: Path) -> list[Row]:
  """Summary rows (claim, paper, ours, verdict) of the ID analyses: every analysed seed of
  r16 and r64, and the random-router control."""
  groups = analysed_groups(root)
  return [
      _row(groups, "the codes are used, not collapsed (C.1)", "dead codes " + ", ".join(
          f"{d} / {t:,}" for *_, d, t in PAPER_TABLE9) + "; normalised entropy " + ", ".join(
          f"{e:.3f}" for _, _, e, *_ in PAPER_TABLE9) + " (Table 9)",
          "utilisation", _utilisation_ours, _utilisation_verdict),
      _row(groups, "the IDs alone carry the semantics: ID-KNN above the permutation null (§3.2)",
           f"observed AP above all 500 permutations, p = {PAPER_P:.4g} in all "
           f"{len(PAPER_TABLE1)} settings (Table 1)", "id_knn",
           lambda ks: f"permutation p {_span([t['p'] for t in _perm_tests(ks)], _g4)} "
                      f"({ks[0]['n_perm']} permutations)", _null_verdict),
      _rho_claim(groups, "ID-KNN keeps most of the hidden state's excess AP over the nuisance "
                 "reader (§3.2)", f"ρ {_span([r[-1] for r in PAPER_TABLE1])} (Table 1)", "rho",
                 "ρ vs nuisance"),
      _rho_claim(groups, "... and over the best surface reader (bytes alone)",
                 "not measured in the paper (no surface reader)", "rho_surface",
                 "ρ vs best surface"),
      *_control_claims(groups),
      _row(groups, "single-code associations replicate on held-out files (C.2)",
           f"{ASSOC['replicated']:,} / {ASSOC['evaluable']:,} = {_pct(ASSOC['rate'])}",
           "associations",
           lambda assocs: f"{_mean_sd([a['total']['rate'] for a in assocs])} replicate",
           lambda assocs: _assoc_against_frozen(groups, assocs)),
      _row(groups, "the full signature beats its best single route (C.3)",
           f"AP_128 / AP_1 = {_span(DIST['ap_ratio_range'], _x2)}, 6/6 settings",
           "distributed", lambda ds: f"AP_R / AP_1 = "
                                     f"{_span([v for d in ds for v in _values(d, 'ratio')], _x2)} "
                                     f"(R = {_span([_routes_of(d) for d in ds], str)})",
           _ratio_verdict),
      _row(groups, "the joint signature carries more than the single-code marginals (C.3)",
           f"S_dict ρ {_span(DIST['rho_range'])} vs ID-KNN ρ {_span(DIST['id_knn_rho_range'])}",
           "distributed",
           lambda ds: f"S_dict ρ {_span([v for d in ds for v in _values(d, 'rho')])} vs "
                      f"ID-KNN ρ {_span([v for d in ds for v in _values(d, 'rho_id_knn')])}",
           _joint_verdict),
  ]


def _row(groups: list[dict], claim: str, paper: str, name: str, ours_fn, verdict_fn) -> Row:
  """One claim's row from `name`'s results of the Lngram v2 arms: ours_fn and verdict_fn
  over those results, or the reason it is pending."""
  found = _main_results(groups, name)
  if not found:
    return (claim, paper, "–", _pending(groups, name))
  return (claim, paper, _guarded(ours_fn, found) + f" ({_arms_text(groups, name)})",
          _guarded(verdict_fn, found))


def _utilisation_ours(us: list[dict]) -> str:
  return ("dead codes " + _span([sum(r["dead_codes"] for r in u["layers"].values())
                                 for u in us], str) + f" / "
          f"{sum(r['total_codes'] for r in us[0]['layers'].values())} per run; normalised "
          f"entropy " + _span([r["normalised_entropy"] for u in us
                               for r in u["layers"].values()], _g3))


def _utilisation_verdict(us: list[dict]) -> str:
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


def _perm_tests(ks: list[dict]) -> list[dict]:
  return [k["layers"][layer]["permutation"][level] for k in ks
          for layer, level, _ in _settings(k, "rho")]


def _null_verdict(ks: list[dict]) -> str:
  tests = _perm_tests(ks)
  below = sum(t["p"] <= 0.05 for t in tests)
  above_all = sum(t["observed"] > t["null_max"] for t in tests)
  strata = sorted({k.get("perm_strata", "nuisance") for k in ks})
  text = (f"p ≤ 0.05 in {below}/{len(tests)} run × layer × target settings, above every "
          f"permutation in {above_all}/{len(tests)} (cells: {', '.join(strata)})")
  return _count_verdict(below, len(tests), text)


def _rho_means(ks: list[dict], key: str) -> list:
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


def _rho_claim(groups: list[dict], claim: str, paper: str, key: str, label: str) -> Row:
  """The row of a ρ claim (`key`: "rho" or "rho_surface"): each arm's mean ρ over seeds per
  setting, most of them above 50%, read against the frozen router's ρ."""
  arms = [(g, _results(g, "id_knn")) for g in groups if g["name"] in ID_ARMS]
  arms = [(g, ks) for g, ks in arms if ks]
  if not arms:
    return (claim, paper, "–", _pending(groups, "id_knn"))
  if any(_get(k, "layers", layer, key) is None for _, ks in arms for k in ks
         for layer in k["layers"]):
    return (claim, paper, "–", f"pending: {label} missing (an analysis from before "
            "the surface readers)")
  try:
    means = {_label(g): _rho_means(ks, key) for g, ks in arms}
  except (KeyError, TypeError, IndexError) as e:
    return (claim, paper, "–", f"pending: analysis file lacks {type(e).__name__} {e}")
  ours = "; ".join(f"{_label(g)} (n={len(ks)}) mean {label} per setting {_span(means[_label(g)])}"
                   for g, ks in arms)
  flat = [v for m in means.values() for v in m]
  defined = [v for v in flat if v is not None]
  undefined = len(flat) - len(defined)
  note = (f"; undefined in {undefined}/{len(flat)} (in no seed does the hidden state beat "
          "that reader beyond resampling noise, so nothing is there to retain)"
          if undefined else "")
  if not defined:
    return (claim, paper, ours, f"not evaluable: {label} undefined in every arm × "
            "setting (the hidden state never beats that reader)")
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
  return (claim, paper, ours, against_frozen(
      verdict, control, pairs, f"mean {label} over the settings defined in both"))


def _control_claims(groups: list[dict]) -> list[Row]:
  """Per frozen-router control: does the learned router's ID-KNN beat it (every seed)."""
  rows = []
  for control, arm in CONTROL_ARMS.items():
    learned = [r for g in groups if g["name"] == arm for r in _results(g, "id_knn")]
    frozen = [r for g in groups if g["name"] == control for r in _results(g, "id_knn")]
    ours = "–" if not learned or not frozen else (
        f"ID-KNN mean AP {arm} {_span([v for r in learned for v in _ap_values(r)], _f4)} vs "
        f"{control} {_span([v for r in frozen for v in _ap_values(r)], _f4)}")
    rows.append((f"a learned router carries more than a random one ({arm} vs {control})",
                 "not measured in the paper", ours, control_verdict(learned, frozen)))
  return rows


def _assoc_verdict(assocs: list[dict]) -> str:
  rates = [a["total"]["rate"] for a in assocs]
  text = f"({_mean_sd(rates)} over {_n_runs(len(rates))}; paper {_pct(ASSOC['rate'])})"
  if min(rates) > 0.5:
    return f"reproduced: most evaluable candidates replicate in every run {text}"
  if max(rates) <= 0.5:
    return f"not reproduced: at most half replicate in every run {text}"
  return f"inconclusive at this scale: above half in some runs only {text}"


def _assoc_against_frozen(groups: list[dict], assocs: list[dict]) -> str:
  control, pairs = _guarded_pairs(
      groups, "associations", lambda a, b: (a["total"]["rate"], b["total"]["rate"]))
  return against_frozen(_assoc_verdict(assocs), control, pairs, "replication rate")


def _ratio_verdict(ds: list[dict]) -> str:
  ratios = [v for d in ds for v in _values(d, "ratio")]
  above = sum(v > 1 for v in ratios)
  return _count_verdict(above, len(ratios),
                        f"AP_R > AP_1 in {above}/{len(ratios)} run × settings")


def _joint_verdict(ds: list[dict]) -> str:
  pairs = [(v, d["layers"][layer]["rho_id_knn"][level]) for d in ds
           for layer, level, v in _settings(d, "rho")]
  below = sum(s is not None and i is not None and s < i for s, i in pairs)
  return _count_verdict(below, len(pairs),
                        f"S_dict ρ below ID-KNN ρ in {below}/{len(pairs)} run × settings")


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
