"""The report's analysis parts beyond the ID section (experiments.tools.report.analyses): the
`analyze` jobs of the queue, the insertion comparison (App. B stability and injection),
the utilisation / association / signature claims, and pending cells, from fake run files."""

import json
import subprocess

import pytest

from experiments.configs import load_config
from experiments.tools import reproduce
from experiments.tools.report import analyses as report_analyses
from experiments.tools.report import document as report
from experiments.tools.report import ids as report_ids

BY_KEY = {r.key: r for r in reproduce.plan()}
SCRATCH, INSERTED = "bytes/lngram_r16_s0", "bytes/inserted_low_s0"


def _fake_run(root, key, final, steps=None):
  """A finished (or, with `steps` short of the run's, cut) run directory of this design."""
  run = BY_KEY[key]
  workdir = reproduce.run_dir(run, root)
  workdir.mkdir(parents=True)
  (workdir / reproduce.STAMP).write_text(json.dumps({"design": reproduce.DESIGN}))
  rows = [{"step": 10, "train/tokens_per_s": 5.0},
          {"step": steps or reproduce.steps(run), "eval/bits_per_byte": final}]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return workdir


def _write(workdir, name, result):
  (workdir / "analysis").mkdir(exist_ok=True)
  (workdir / "analysis" / f"{name}.json").write_text(
      result if isinstance(result, str) else json.dumps(result))


def _utilisation(dead=0):
  return {"codes_per_route": 16, "layers": {str(layer): {
      "n_eff": 9.5, "normalised_entropy": 0.81, "top_freq": 0.3, "dead_codes": dead,
      "total_codes": 256} for layer in (1, 2)}}


def _associations():
  example = {"expression": "C_{1,3}=7 ⇒ def", "level": "local", "P": 0.4, "P0": 0.1,
             "delta": 0.3, "n": 25}
  return {"total": {"candidates": 40, "evaluable": 30, "replicated": 12, "rate": 0.4},
          "by_layer_level": {"1/local": {"rate": 0.55}}, "examples": [example] * 3}


def _distributed():
  return {"layers": {"1": {"ms": [1, 2, 4], "rho": {"local": 0.3, "document": 0.9},
                           "rho_id_knn": {"local": 0.6, "document": 0.7},
                           "ratio": {"local": 1.5, "document": 2.5}}}}


def _stability(steps, agreement):
  """Primary-protocol rows between adjacent `steps`: the last interval's code agreement
  (estimate, lo, hi) per layer is `agreement[layer]`, earlier ones 0.5; an `own` row too."""
  rows = []
  for a, b in zip(steps, steps[1:], strict=False):
    for layer, ca in agreement.items():
      ca = ca if b == steps[-1] else (0.5, 0.49, 0.51)
      rows.append({"protocol": "fixed", "layer": layer, "from_step": a, "to_step": b,
                   "code_agreement": list(ca), "hamming": [0.1, 0.09, 0.11],
                   "survival_2": [0.6, 0.59, 0.61], "survival_3": [0.5, 0.49, 0.51]})
      rows.append({**rows[-1], "protocol": "own", "code_agreement": [0.1, 0.0, 0.2]})
  return {"steps": list(steps), "rows": rows, "primary": "fixed"}


def _injection(scale):
  row = {"immediate_R": 0.1 * scale, "final_R": 0.2 * scale, "final_retention": 1.5,
         "logit_R": 0.05 * scale, "js": 0.01, "top1_agreement": 0.9}
  return {"layers": [1, 2], "interventions": {
      "1": row, "2": row, "all": {**row, "immediate_R": None, "final_retention": None}}}


def _row(text, start):
  [line] = [line for line in text.splitlines() if line.startswith(start)]
  return line


@pytest.fixture(scope="module")
def full(tmp_path_factory):
  """The insertion pair with every analysis, its continued baseline, the report's text."""
  root = tmp_path_factory.mktemp("repro")
  _fake_run(root, "bytes/baseline_s0", 2.20)
  _fake_run(root, "bytes/continued_low_s0", 2.08)
  scratch = _fake_run(root, SCRATCH, 2.10)
  inserted = _fake_run(root, INSERTED, 2.05)
  for name, result in (("utilisation", _utilisation()), ("associations", _associations()),
                       ("distributed", _distributed())):
    _write(scratch, name, result)
  _write(scratch, "stability", _stability((200, 400, 600), {1: (0.8, 0.79, 0.81),
                                                            2: (0.7, 0.69, 0.71)}))
  _write(inserted, "stability", _stability(reproduce.STABILITY_STEPS[INSERTED],
                                           {1: (0.9, 0.88, 0.92), 2: (0.9, 0.88, 0.92)}))
  _write(scratch, "injection", _injection(1.0))
  _write(inserted, "injection", _injection(2.0))
  return root, report.report(root, root / "plots")


def test_analysis_names_are_those_of_lngram_exp_analyze():
  from experiments.analysis.run import LM_ANALYSES
  assert reproduce.ANALYSES == LM_ANALYSES
  assert set(reproduce.INSERTION_ANALYSES) <= set(LM_ANALYSES)
  assert report_ids.RECORD_NAMES == reproduce.RECORD_ANALYSES
  assert set(reproduce.INSERTION_PAIR) <= set(BY_KEY)
  assert set(report_ids.ID_ARMS) | set(report_ids.CONTROL_ARMS) <= set(reproduce.ID_ARMS)
  assert set(reproduce.ID_ARMS) <= set(reproduce.ARMS[reproduce.ID_SETTING])


def test_analyze_runs_lngram_exp_analyze_per_job(tmp_path, monkeypatch, capsys):
  run = _fake_run(tmp_path, "bytes/lngram_r64_s0", 2.0)
  calls = []
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
  assert reproduce.analyze(dry_run=True, root=tmp_path) == 0 and not calls
  out = capsys.readouterr().out
  assert f"lngram-exp analyze --workdir={run} --which=utilisation,id_knn" in out
  assert f"skip {INSERTED}: not finished" in out
  assert reproduce.analyze(root=tmp_path) == 0
  [call] = calls
  assert call[1:4] == ["-m", "experiments", "analyze"] and call[4] == f"--workdir={run}"
  assert "--step=600" in call and (run / "analysis" / "analyze.log").exists()
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: 3)
  assert reproduce.analyze(root=tmp_path) == 3


def test_the_inserted_run_is_measured_over_the_from_scratch_run_s_interval():
  """The inserted run's stability interval (own steps) is one of its kept checkpoint pairs
  and as long as the from-scratch run's last interval (its last two kept checkpoints)."""
  inserted, scratch = (BY_KEY[k] for k in reproduce.INSERTION_PAIR)
  command = reproduce.analyze_command(inserted, ("stability", "injection"))
  first, last = reproduce.STABILITY_STEPS[inserted.key]
  assert command[-2:] == [f"--step={reproduce.steps(inserted)}",
                          f"--stability_steps={first},{last}"]
  assert not any(c.startswith("--stability_steps") for c in
                 reproduce.analyze_command(scratch, ("stability", "injection")))
  assert not any(c.startswith("--stability_steps") for c in
                 reproduce.analyze_command(inserted, ("injection",)))
  train = load_config(f"{reproduce.CONFIGS}/{scratch.config}").train
  every = int(next(o for o in inserted.overrides if "ckpt_every" in o).split("=")[1])
  n = reproduce.steps(inserted)
  kept = set(range(n, 0, -every)[:train.max_to_keep])
  assert {first, last} <= kept and last == n
  assert last - first == train.ckpt_every and reproduce.steps(scratch) == train.steps
  assert reproduce.step_offset(inserted) == reproduce.steps(BY_KEY[inserted.after])


def test_report_analysis_sections_and_claims(full):
  root, text = full
  ins = text[text.index("#### Insertion vs from scratch"):]
  assert ("inserted 2.0500, from step 0 2.1000, continued baseline "
          "(`bytes/continued_low_s0`) 2.0800") in ins
  # Steps on the backbone's clock: the inserted run's own 100 -> 300 are 700 -> 900.
  assert "| 1 | inserted | 700→900 | 0.9000 [0.8800, 0.9200] |" in ins
  assert "| 2 | from step 0 | 400→600 | 0.7000 [0.6900, 0.7100] |" in ins
  assert "| layer 1 | inserted | 0.2 | 0.4 | 1.5 | 0.1 | 0.01 | 0.9 |" in ins
  stability = _row(text, "| inserted Lngram has more stable addresses")
  # In the paper's direction, but the inserted backbone trained at 0.05x the LR: no
  # "reproduced" until the LR-matched control is recorded.
  assert "| confounded by the learning rate: inserted more stable" in stability
  assert "the LR-matched control is pending (bytes/inserted_young_low" in stability
  assert "0 of 3 seeds recorded" in stability
  assert "over 200 vs 200 steps" in stability and "L1 0.9000 vs 0.8000" in stability
  assert "Verdict (B.2): confounded by the learning rate" in ins
  injection = _row(text, "| inserted Lngram injects more")
  assert "one seed: inserted larger in all 3 measures (the paper's direction)" in injection
  assert "immediate R L1 0.2 vs 0.1" in injection
  assert _row(text, "| the codes are used").endswith(
      "| reproduced: no dead code, normalised entropy 0.810 over 1 run |")
  assert "not reproduced: at most half replicate in every run (40.00% over 1 run" in _row(
      text, "| single-code associations")
  assert "reproduced: AP_R > AP_1 in 2/2 run × settings" in _row(text, "| the full signature")
  assert "inconclusive at this scale: S_dict ρ below ID-KNN ρ in 1/2" in _row(
      text, "| the joint signature")


def test_utilisation_verdict_few_dead_codes_are_no_collapse_many_are(tmp_path):
  workdir = _fake_run(tmp_path, SCRATCH, 2.1)

  def verdict(dead):
    _write(workdir, "utilisation", _utilisation(dead))
    claims = {c: v for c, _, _, v in report_analyses.analysis_claims(tmp_path)}
    return claims["the codes are used, not collapsed (C.1)"]

  assert verdict(1).startswith("reproduced: no collapse (normalised entropy 0.810 over 1 "
                               "run), but up to 2 / 512 codes dead (paper 0)")
  assert verdict(10).startswith("not reproduced: up to 20 / 512 codes dead")


def _last(agreement, span):
  return {"1": {"code_agreement": agreement, "from": 600 + 300 - span, "to": 900}}


def test_stability_verdict_weighs_the_interval_lengths():
  scratch = {"1": {"code_agreement": [0.8, 0.79, 0.81], "from": 400, "to": 600}}
  more, less, overlap = [0.9, 0.88, 0.92], [0.6, 0.59, 0.61], [0.75, 0.6, 0.9]
  verdict = report_analyses.stability_verdict
  assert verdict(_last(more, 200), scratch).startswith("reproduced (one seed, CIs disjoint)")
  # More stable over a shorter interval (less time to move): no credit.
  assert verdict(_last(more, 100), scratch).startswith(
      "inconclusive at this scale: inserted more stable at every layer")
  assert verdict(_last(less, 200), scratch).startswith("not reproduced (one seed, CIs")
  # Less stable over a longer interval (more time to move): no verdict against it.
  assert verdict(_last(less, 300), scratch).startswith(
      "inconclusive at this scale: inserted less stable")
  assert verdict(_last(overlap, 200), scratch).startswith(
      "inconclusive at this scale: more stable at 0, less at 0 of 1")
  assert verdict({}, scratch).startswith("pending")


def test_b2_is_reproduced_only_with_its_lr_matched_control():
  reading = ("reproduced (one seed, CIs disjoint): inserted more stable (L1 0.9 vs 0.8) over "
             "200 vs 200 steps")
  verdict = report_analyses.b2_verdict
  pending = verdict(reading, ("pending", "the control: 1 of 3 seeds recorded"))
  assert pending.startswith("confounded by the learning rate: inserted more stable")
  assert pending.endswith("the LR-matched control is pending (the control: 1 of 3 seeds "
                          "recorded)")
  assert verdict(reading, ("supported", "Δ +0.05")).startswith(
      "reproduced (LR-matched control): at 0.05x the LR the mature backbone's insertion is "
      "more stable than the young one's (Δ +0.05)")
  assert verdict(reading, ("reversed", "Δ -0.05")).startswith("not reproduced at an equal LR")
  assert verdict(reading, ("not shown", "Δ +0.01")).startswith("not shown at an equal LR")
  # Against the paper (the LR favours the inserted run) or inconclusive: as read.
  against = "not reproduced (one seed, CIs disjoint): inserted less stable"
  assert verdict(against, ("pending", "")) == against
  unsure = "inconclusive at this scale: x"
  assert verdict(unsure, ("pending", "")) == unsure


def test_the_lr_matched_control_is_read_from_the_declared_family(tmp_path):
  state, text = report_analyses.lr_matched_control(tmp_path)
  assert state == "pending" and "0 of 3 seeds recorded" in text
  assert "bytes/inserted_young_low" in text and "controls_v3" in text


def test_report_marks_missing_and_broken_analyses_pending(tmp_path):
  claims = {c: v for c, _, _, v in report_analyses.analysis_claims(tmp_path)}
  assert claims["the codes are used, not collapsed (C.1)"].startswith(
      "pending: no Lngram v2 run")
  scratch = _fake_run(tmp_path, SCRATCH, 2.1)
  _fake_run(tmp_path, INSERTED, 2.4, steps=200)        # cut: not finished
  _write(scratch, "utilisation", {"layers": {"1": {}}})          # lacks its keys
  _write(scratch, "stability", "{not json")
  _write(scratch, "injection", {"layers": [1]})                 # lacks interventions
  claims = {c: v for c, _, _, v in report_analyses.analysis_claims(tmp_path)}
  assert claims["the codes are used, not collapsed (C.1)"].startswith(
      "pending: analysis file lacks")
  assert claims["the full signature beats its best single route (C.3)"].startswith(
      "pending: distributed not run on lngram_r16_s0")
  for claim in ("inserted Lngram has more stable addresses (B.2)",
                "inserted Lngram injects more into the backbone (B.3)"):
    assert claims[claim] == f"pending: {INSERTED} not finished"
  text = report_analyses.insertion_section(tmp_path)
  assert f"| – | inserted | pending: {INSERTED} not finished |" in text
  assert "| – | from step 0 | pending: stability.json unreadable (JSONDecodeError) |" in text
  assert "continued baseline (`bytes/continued_low_s0`) pending" in text
  # The inserted run finishes: the from-scratch half's broken files now decide the cells.
  (reproduce.run_dir(BY_KEY[INSERTED], tmp_path) / "metrics.jsonl").write_text(
      json.dumps({"step": 300, "eval/bits_per_byte": 2.0}) + "\n")
  _write(reproduce.run_dir(BY_KEY[INSERTED], tmp_path), "injection", _injection(2.0))
  claims = {c: v for c, _, _, v in report_analyses.analysis_claims(tmp_path)}
  assert claims["inserted Lngram injects more into the backbone (B.3)"].startswith(
      "pending: analysis file lacks")
  assert claims["inserted Lngram has more stable addresses (B.2)"].startswith(
      "pending: stability not run on inserted_low_s0")
