"""The report's ID-analysis part (experiments.tools.report.ids) and its summary rows
(id_claims): every seed of r16 / r64 and the random-router control, mean ± sd, the surface
readers and rho against the best of them, the control's verdict, and pending cells for
missing or older analysis files."""

import json
import types

import pytest

from experiments.tools import reproduce
from experiments.tools.report import ids as report_ids
from experiments.tools.report.id_claims import control_verdict, id_claims

LEVELS = ("local", "document")


def _id_knn(id_ap, *, surface=0.25, p=0.002, boot=True, protocol=True):
  aps = {"H_model": 0.4, "Q_route": 0.35, "ID": id_ap, "nuisance": 0.1, "surface": surface,
         "surface_byte": surface - 0.05}
  layer = {"ap": {r: dict.fromkeys(LEVELS, v) for r, v in aps.items()},
           "rho": dict.fromkeys(LEVELS, (id_ap - 0.1) / 0.3),
           "rho_surface": dict.fromkeys(LEVELS, (id_ap - surface) / (0.4 - surface)),
           "best_surface": dict.fromkeys(LEVELS, "surface"),
           "ordering": dict.fromkeys(LEVELS, True),
           "permutation": {lv: {"p": p, "observed": id_ap, "null_max": id_ap - 0.05}
                           for lv in LEVELS}}
  if boot:
    layer["bootstrap"] = {lv: {"rho": [0.1, 0.9], "rho_surface": [-0.2, 0.5]} for lv in LEVELS}
  out = {"n_perm": 500, "perm_strata": "nuisance_byte", "perm_movable": 0.4,
         "query_file_max_share": 0.05, "layers": {"1": layer}}
  if protocol:
    out["protocol"] = {"version": 2}
  return out


def _utilisation(dead=0):
  return {"codes_per_route": 16, "layers": {"1": {"n_eff": 9.5, "normalised_entropy": 0.81,
                                                  "top_freq": 0.3, "dead_codes": dead,
                                                  "total_codes": 256}}}


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
  """Runs of three arms under tmp_path: r16 seeds 0-2, r64 seed 0, the control seeds 0-2."""
  runs = [types.SimpleNamespace(experiment="bytes", name=name, seed=s, key=f"bytes/{name}_s{s}")
          for name, seeds in (("baseline", (0,)), ("lngram_r16", (0, 1, 2)),
                              ("lngram_r64", (0,)), ("lngram_r16_frozen", (0, 1, 2)))
          for s in seeds]
  monkeypatch.setattr(reproduce, "plan", lambda: runs)
  monkeypatch.setattr(reproduce, "run_dir", lambda run, root=None: tmp_path / run.key)
  monkeypatch.setattr(reproduce, "finished", lambda run, root=None: True)

  def write(key, name, result):
    (tmp_path / key / "analysis").mkdir(parents=True, exist_ok=True)
    (tmp_path / key / "analysis" / f"{name}.json").write_text(json.dumps(result))

  for s, ap in enumerate((0.30, 0.32, 0.34)):
    write(f"bytes/lngram_r16_s{s}", "id_knn", _id_knn(ap))
    write(f"bytes/lngram_r16_s{s}", "utilisation", _utilisation(dead=s))
    write(f"bytes/lngram_r16_frozen_s{s}", "id_knn", _id_knn(0.2 + 0.01 * s))
  write("bytes/lngram_r64_s0", "id_knn", _id_knn(0.36))
  return tmp_path, write


def test_section_shows_every_seed_the_surface_readers_and_the_control(fake_root):
  root, _ = fake_root
  text = report_ids.id_section(root)
  assert "every seed of Lngram v2 r16 and r64" in text
  # r16: mean ± sd over 3 seeds of ID-KNN 0.30 / 0.32 / 0.34; surface readers printed.
  assert ("| bytes/lngram_r16 (3) | 1 | local | 0.4000 ± 0.0000 | 0.3500 ± 0.0000 | "
          "0.3200 ± 0.0200 | 0.1000 ± 0.0000 | 0.2500 ± 0.0000 | 0.2000 ± 0.0000 | "
          "73.33% ± 6.67% | 46.67% ± 13.33% |") in text
  # One seed: rho with its bootstrap CI.
  assert "| bytes/lngram_r64 (1) | 1 | local |" in text and "86.67% [10.00%, 90.00%]" in text
  assert "| bytes/lngram_r16_frozen (3) | 1 | document |" in text
  assert "normalised lines" in text and "nuisance_byte" in text
  assert "utilisation (C.1, Table 9) | bytes/lngram_r16 (3) |" in text
  assert "| utilisation (C.1, Table 9) | bytes/lngram_r64 (0) | pending: utilisation not run" in text
  assert "predate this protocol" not in text


def test_claims_over_all_seeds_and_the_control_verdict(fake_root):
  root, write = fake_root
  claims = {c: (ours, v) for c, _, ours, v in id_claims(root)}
  ours, verdict = claims["the IDs alone carry the semantics: ID-KNN above the permutation "
                         "null (§3.2)"]
  assert verdict.startswith("reproduced: p ≤ 0.05 in 8/8 run × layer × target settings")
  assert "bytes/lngram_r16 n=3, bytes/lngram_r64 n=1" in ours
  # Per arm: r16's mean rho vs the best surface is 46.67% (below half), r64's 73.33%.
  ours, verdict = claims["... and over the best surface reader (bytes alone)"]
  assert verdict == ("inconclusive at this scale: the arm's mean ρ vs best surface over "
                     "seeds > 50% in 2/4 arm × settings where it is defined")
  assert "bytes/lngram_r16 (n=3) mean ρ vs best surface per setting 46.67%" in ours
  assert claims["ID-KNN keeps most of the hidden state's excess AP over the nuisance reader "
                "(§3.2)"][1].startswith("reproduced: the arm's mean ρ vs nuisance")
  control = claims["a learned router carries more than a random one (lngram_r16 vs "
                   "lngram_r16_frozen)"][1]
  assert control.startswith("reproduced: every learned seed above every frozen-router seed "
                            "in 2/2 settings (n = 3 vs 3")
  assert "p = 0.05" in control
  util = claims["the codes are used, not collapsed (C.1)"][1]
  assert util.startswith("reproduced: no collapse") and "up to 2 / 256" in util
  # A control seed as good as a learned one: no longer every learned seed above.
  write("bytes/lngram_r16_frozen_s2", "id_knn", _id_knn(0.31))
  control = {c: v for c, _, _, v in id_claims(root)}[
      "a learned router carries more than a random one (lngram_r16 vs lngram_r16_frozen)"]
  assert control.startswith("not reproduced: every learned seed above every frozen-router "
                            "seed in 0/2")
  assert control_verdict([_id_knn(0.3)], [_id_knn(0.1)]).startswith(
      "inconclusive (too few seeds")


def test_id_rows_are_read_against_the_frozen_random_router(fake_root):
  """T1's ρ and C.2 keep "reproduced" only where the learned router beats the frozen one
  (paired by seed); a frozen router as good says the measure does not tell them apart."""
  root, write = fake_root
  claim = "ID-KNN keeps most of the hidden state's excess AP over the nuisance reader (§3.2)"
  # The fixture's learned ρ (66.67%, 73.33%, 80.00%) is above the control's (33-40%).
  verdict = {c: v for c, _, _, v in id_claims(root)}[claim]
  assert verdict.startswith("reproduced: the arm's mean ρ vs nuisance over seeds > 50%")
  assert "the learned router beats the frozen random one: mean ρ vs nuisance" in verdict
  assert "lngram_r16 vs lngram_r16_frozen 73.33% vs 36.67%" in verdict
  # The control as good as the learned router, seed by seed (within noise).
  for s, ap in enumerate((0.31, 0.31, 0.35)):
    write(f"bytes/lngram_r16_frozen_s{s}", "id_knn", _id_knn(ap))
  verdict = {c: v for c, _, _, v in id_claims(root)}[claim]
  assert verdict.startswith("not distinguished from a frozen random router: mean ρ vs "
                            "nuisance over the settings defined in both")
  assert "(paired t over seeds 0, 1, 2, p = " in verdict
  assert verdict.endswith("the arm's mean ρ vs nuisance over seeds > 50% in 4/4 arm × "
                          "settings where it is defined")
  # Higher at every seed by a steady margin: the frozen router scores higher.
  for s, ap in enumerate((0.35, 0.37, 0.40)):
    write(f"bytes/lngram_r16_frozen_s{s}", "id_knn", _id_knn(ap))
  verdict = {c: v for c, _, _, v in id_claims(root)}[claim]
  assert verdict.startswith("not reproduced: the frozen random router scores higher")


def test_associations_are_read_against_the_frozen_router(fake_root):
  root, write = fake_root
  claim = "single-code associations replicate on held-out files (C.2)"

  def rate(r):
    return {"total": {"rate": r, "evaluable": 100}, "examples": []}

  for s, (learned, frozen) in enumerate(((0.70, 0.69), (0.72, 0.73), (0.71, 0.70))):
    write(f"bytes/lngram_r16_s{s}", "associations", rate(learned))
    write(f"bytes/lngram_r16_frozen_s{s}", "associations", rate(frozen))
  verdict = {c: v for c, _, _, v in id_claims(root)}[claim]
  assert verdict.startswith("not distinguished from a frozen random router: replication rate "
                            "lngram_r16 vs lngram_r16_frozen 71.00% vs 70.67%")
  assert verdict.endswith("most evaluable candidates replicate in every run (71.00% ± 1.00% "
                          "over 3 runs; paper 65.85%)")
  # Without the control's files the row cannot be "reproduced" yet.
  for s in range(3):
    (root / f"bytes/lngram_r16_frozen_s{s}" / "analysis" / "associations.json").unlink()
  verdict = {c: v for c, _, _, v in id_claims(root)}[claim]
  assert verdict.startswith("pending the frozen-router control: replication rate needs two "
                            "seeds of both lngram_r16 vs lngram_r16_frozen (0 paired)")


def test_an_undefined_rho_is_not_a_missing_analysis(fake_root):
  """Where the hidden state does not beat a reader, rho is None (id_readers.rho): the
  claim is judged on the settings where it is defined and says how many are not."""
  root, write = fake_root
  for s, ap in enumerate((0.30, 0.32, 0.34)):
    result = _id_knn(ap)
    result["layers"]["1"]["rho"]["document"] = None
    result["layers"]["1"]["rho_surface"]["document"] = None
    write(f"bytes/lngram_r16_s{s}", "id_knn", result)
  claims = {c: v for c, _, _, v in id_claims(root)}
  verdict = claims["ID-KNN keeps most of the hidden state's excess AP over the nuisance "
                   "reader (§3.2)"]
  assert verdict.startswith("reproduced: the arm's mean ρ vs nuisance over seeds > 50% in "
                            "3/3 arm × settings where it is defined; undefined in 1/4")
  assert "before the surface readers" not in verdict
  # Undefined everywhere: not evaluable, and still not called an old analysis.
  for key in ("bytes/lngram_r16_s0", "bytes/lngram_r16_s1", "bytes/lngram_r16_s2",
              "bytes/lngram_r64_s0"):
    result = _id_knn(0.3)
    result["layers"]["1"]["rho_surface"] = dict.fromkeys(LEVELS)
    write(key, "id_knn", result)
  verdict = {c: v for c, _, _, v in id_claims(root)}[
      "... and over the best surface reader (bytes alone)"]
  assert verdict.startswith("not evaluable: ρ vs best surface undefined in every arm")


def test_a_rho_over_a_noise_denominator_is_unresolved(fake_root):
  """H_model barely above the surface reader: ρ vs best surface is huge and meaningless.
  Where more than 2.5% of the document resamples leave it undefined it is printed in
  parentheses and counted with the undefined ones; ρ vs nuisance is untouched."""
  root, write = fake_root
  result = _id_knn(0.36)
  result["n_boot"] = 500
  result["layers"]["1"]["rho_surface"]["document"] = -21.09
  result["layers"]["1"]["bootstrap"]["document"]["rho_surface_undefined"] = 265
  result["layers"]["1"]["bootstrap"]["local"]["rho_surface_undefined"] = 12   # 2.4%: kept
  write("bytes/lngram_r64_s0", "id_knn", result)
  text = report_ids.id_section(root)
  assert "| bytes/lngram_r64 (1) | 1 | document |" in text
  assert "(-2109.00%) unresolved" in text and "73.33% [-20.00%, 50.00%]" in text
  claims = {c: (ours, v) for c, _, ours, v in id_claims(root)}
  ours, verdict = claims["... and over the best surface reader (bytes alone)"]
  assert "-2109" not in ours and "bytes/lngram_r64 (n=1) mean ρ vs best surface per setting 73.33%" in ours
  assert verdict.endswith("in 1/3 arm × settings where it is defined; undefined in 1/4 (in no "
                          "seed does the hidden state beat that reader beyond resampling noise, "
                          "so nothing is there to retain)")
  # Over seeds: the unresolved seed is left out of the mean and named in the cell.
  for s, ap in enumerate((0.30, 0.32, 0.34)):
    r16 = _id_knn(ap)
    r16["n_boot"] = 500
    if s == 0:
      r16["layers"]["1"]["rho_surface"]["local"] = 9.0
      r16["layers"]["1"]["bootstrap"]["local"]["rho_surface_undefined"] = 100
    write(f"bytes/lngram_r16_s{s}", "id_knn", r16)
  text = report_ids.id_section(root)
  assert "53.33% ± 9.43% (1 seed unresolved)" in text


def test_older_results_print_without_the_new_columns(fake_root):
  root, write = fake_root
  old = _id_knn(0.3, boot=False, protocol=False)
  for key in ("rho_surface", "best_surface"):
    del old["layers"]["1"][key]
  del old["layers"]["1"]["ap"]["surface_byte"]
  write("bytes/lngram_r64_s0", "id_knn", old)
  text = report_ids.id_section(root)
  assert "| bytes/lngram_r64 (1) | 1 | local | 0.4000 | 0.3500 | 0.3000 | 0.1000 | 0.2500 | – |" in text
  assert "1 of the 7 id_knn results predate this protocol" in text
  claims = {c: v for c, _, _, v in id_claims(root)}
  assert claims["... and over the best surface reader (bytes alone)"].startswith("pending")


def test_nothing_finished_is_pending(tmp_path, monkeypatch):
  monkeypatch.setattr(reproduce, "plan", lambda: [])
  assert "pending: no Lngram v2 run" in report_ids.id_section(tmp_path)
  assert all(v.startswith("pending") for *_, v in id_claims(tmp_path))
