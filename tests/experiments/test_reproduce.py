"""The reproduction plan (experiments.reproduce), the runs it wrote (experiments.results) and
its report (experiments.report, experiments.report_analyses)."""

import json
import statistics

from experiments import report, report_analyses, reproduce, results
from experiments.configs import load_config
from experiments.models import lm_config


def test_plan_commands_are_valid_and_distinct():
  runs = reproduce.plan()
  assert len({r.key for r in runs}) == len(runs)
  keys = {r.key for r in runs}
  for run in runs:
    lm_config(load_config(f"{reproduce.CONFIGS}/{run.config}"))
    assert run.after is None or run.after in keys
    command = run.command()
    assert command[:2] == ["lngram-exp", "train"]
    assert f"--config.train.seed={run.seed}" in command
  main = [r for r in runs if r.experiment == "main"]
  assert {r.name for r in main} == {"baseline", "lngram_r16", "lngram_r64", "lngram_v1", "pkm",
                                    "engram", "sparse_ffn"}
  assert all(sorted(r.seed for r in main if r.name == n) == [0, 1, 2] for n in {"pkm"})


def _fake_run(root, key, finals, steps=600):
  experiment, name = key.split("/")
  workdir = root / experiment / name
  workdir.mkdir(parents=True)
  rows = [{"step": 10, "train/tokens_per_s": 1.0}, {"step": 20, "train/tokens_per_s": 100.0},
          {"step": 30, "train/tokens_per_s": 300.0}]
  rows += [{"step": s, "eval/bits_per_byte": v} for s, v in finals]
  (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return workdir


def test_report_from_run_files(tmp_path):
  root = tmp_path / "repro"
  _fake_run(root, "main/baseline_s0", [(300, 2.5), (600, 2.20)])
  _fake_run(root, "main/baseline_s1", [(300, 2.6), (600, 2.30)])
  _fake_run(root, "main/lngram_r16_s0", [(300, 2.4)])   # still running
  text = report.report(root, tmp_path / "plots")
  want = f"{statistics.mean([2.2, 2.3]):.4f} ± {statistics.stdev([2.2, 2.3]):.4f}"
  [baseline] = [line for line in text.splitlines() if line.startswith("| baseline ")]
  assert want in baseline and "| 0, 1 |" in baseline and "| 200 |" in baseline
  [lngram] = [line for line in text.splitlines() if line.startswith("| lngram_r16 ")]
  assert "running: [0]" in lngram and "4.556M / 0.102M" in lngram
  assert (tmp_path / "plots" / "main.png").read_bytes()[:4] == b"\x89PNG"


def test_finished_means_the_final_evaluation_was_written(tmp_path, monkeypatch):
  monkeypatch.setattr(reproduce, "ROOT", tmp_path)
  done, cut = (next(r for r in reproduce.plan() if r.key == key)
               for key in ("main/pkm_s0", "main/pkm_s1"))
  _fake_run(tmp_path, "main/pkm_s0", [(600, 2.1)])
  _fake_run(tmp_path, "main/pkm_s1", [(200, 2.9), (400, 2.4)])
  assert reproduce.finished(done) and not reproduce.finished(cut)


def test_verdicts():
  assert report.verdict([2.0, 2.01], [2.2, 2.21]).startswith("reproduced")
  assert report.verdict([2.2, 2.21], [2.0, 2.01]).startswith("not reproduced")
  assert report.verdict([2.0, 2.2], [2.05, 2.25]).startswith("inconclusive")
  assert report.verdict([2.0], [2.2, 2.3]).startswith("pending")


def test_shared_runs_have_the_config_of_the_run_they_read():
  """A run that reads another's directory must be the same training: equal config, seed."""
  runs = reproduce.plan()
  by_key = {r.key: r for r in runs}
  shared = [r for r in runs if r.same_as]
  assert {r.key for r in shared} >= {"sink/sink_s0", "surrogate/onebit_s1", "routes/r16_kv2_s0"}
  for run in shared:
    original = by_key[run.same_as]
    assert original.same_as is None and original.seed == run.seed
    assert original.overrides == run.overrides
    assert (load_config(f"{reproduce.CONFIGS}/{run.config}").to_dict()
            == load_config(f"{reproduce.CONFIGS}/{original.config}").to_dict())
    assert run.workdir == original.workdir


def test_training_order_is_seed_major_and_trains_a_shared_run_once():
  runs = reproduce.plan()
  by_key = {r.key: r for r in runs}
  order = reproduce.training_order(runs, by_key)
  assert [r.seed for r in order] == sorted(r.seed for r in order)
  assert len({r.key for r in order}) == len(order) and all(r.same_as is None for r in order)
  assert len(order) == len([r for r in runs if r.same_as is None])
  keys = [r.key for r in order]
  assert keys.index("insertion/baseline_300_s0") < keys.index("insertion/inserted_300_s0")
  # Selecting only the sink study still trains the main r16 runs it reads.
  sink_only = reproduce.training_order(reproduce.select(runs, "sink"), by_key)
  assert [r.key for r in sink_only] == ["main/lngram_r16_s0", "sink/nosink_s0",
                                        "main/lngram_r16_s1", "sink/nosink_s1",
                                        "main/lngram_r16_s2", "sink/nosink_s2"]


def test_report_reads_a_shared_run_from_the_directory_it_shares(tmp_path):
  root = tmp_path / "repro"
  _fake_run(root, "main/lngram_r16_s0", [(600, 2.05)])
  collected = results.collect(root)
  assert collected["sink"]["sink"]["seeds"][0]["final"] == 2.05
  assert collected["surrogate"]["onebit"]["seeds"][0]["final"] == 2.05


# --- `reproduce analyze` and the report's analysis sections, on fake runs and analyses.

def _write_analysis(workdir, name, result):
  (workdir / "analysis").mkdir(exist_ok=True)
  (workdir / "analysis" / f"{name}.json").write_text(json.dumps(result))


def _utilisation(dead=0):
  return {"codes_per_route": 16, "layers": {str(layer): {
      "n_eff": 9.5, "normalised_entropy": 0.81, "top_freq": 0.3, "dead_codes": dead,
      "total_codes": 256} for layer in (1, 2)}}


def _id_knn(p_document=0.002):
  levels = ("local", "document")
  layer = {"ap": {r: dict.fromkeys(levels, v) for r, v in
                  (("H_model", 0.3), ("Q_route", 0.25), ("ID", 0.2), ("nuisance", 0.1))},
           "rho": {"local": 0.5, "document": 0.8125},
           "ordering": dict.fromkeys(levels, True),
           "permutation": {"local": {"p": 0.002, "observed": 0.3, "null_max": 0.1},
                           "document": {"p": p_document, "observed": 0.2, "null_max": 0.25}}}
  return {"n_perm": 500, "layers": {"1": layer}}


def _associations():
  example = {"expression": "C_{1,3}=7 ⇒ def", "level": "local", "P": 0.4, "P0": 0.1,
             "delta": 0.3, "n": 25}
  return {"total": {"candidates": 40, "evaluable": 30, "replicated": 12, "rate": 0.4},
          "by_layer_level": {"1/local": {"rate": 0.55}, "1/document": {"rate": 0.2}},
          "examples": [example] * 15}


def _distributed():
  return {"layers": {"1": {"ms": [1, 2, 4], "rho": {"local": 0.3, "document": 0.9},
                           "rho_id_knn": {"local": 0.6, "document": 0.7},
                           "ratio": {"local": 1.5, "document": 2.5}}}}


def _stability(steps, agreements):
  """Rows of the primary protocol between adjacent `steps`, agreement (estimate, lo, hi)
  per layer for the last interval; the earlier intervals get 0.5."""
  rows = []
  for a, b in zip(steps, steps[1:], strict=False):
    for layer, ca in agreements.items():
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


def test_analysis_jobs_best_run_insertion_pair_and_skips(tmp_path):
  root = tmp_path / "repro"
  _fake_run(root, "main/lngram_r16_s0", [(600, 2.05)])
  best = _fake_run(root, "main/lngram_r64_s0", [(600, 2.00)])
  _fake_run(root, "main/lngram_r64_s1", [(400, 1.90)])            # cut: not a candidate
  _fake_run(root, "main/pkm_s0", [(600, 1.50)])                   # not Lngram v2
  _fake_run(root, "insertion/inserted_300_s0", [(200, 2.4)])       # not finished
  _write_analysis(root / "main" / "lngram_r16_s0", "stability", {})
  run, value = reproduce.best_lngram_run(root)
  assert (run.key, value) == ("main/lngram_r64_s0", 2.00)
  jobs, skipped = reproduce.analysis_jobs(root)
  assert [(r.key, names) for r, names, _ in jobs] == [
      ("main/lngram_r64_s0", reproduce.ANALYSES), ("main/lngram_r16_s0", ("injection",))]
  assert dict(skipped)["insertion/inserted_300_s0"].endswith("not finished")
  assert "stability" in dict(skipped)["main/lngram_r16_s0"]
  jobs, _ = reproduce.analysis_jobs(root, force=True)
  assert jobs[1][1] == ("stability", "injection")
  assert reproduce.analyze_command(jobs[0][0], jobs[0][1], root) == [
      "lngram-exp", "analyze", f"--workdir={best}",
      "--which=utilisation,id_knn,associations,distributed,stability,injection", "--step=600"]
  # A result computed from another checkpoint than the final one is stale: redone.
  _write_analysis(root / "main" / "lngram_r16_s0", "stability", {"source": {"step": 400}})
  jobs, _ = reproduce.analysis_jobs(root)
  assert [(r.key, names) for r, names, _ in jobs][1] == (
      "main/lngram_r16_s0", ("stability", "injection"))
  _write_analysis(root / "main" / "lngram_r16_s0", "stability", {"source": {"step": 600}})
  jobs, _ = reproduce.analysis_jobs(root)
  assert [(r.key, names) for r, names, _ in jobs][1] == ("main/lngram_r16_s0", ("injection",))
  # When the best run is one of the pair, it is analysed once, with everything.
  _fake_run(root, "main/lngram_r16_s1", [(600, 1.95)])
  (root / "insertion" / "inserted_300_s0" / "metrics.jsonl").write_text(
      json.dumps({"step": 300, "eval/bits_per_byte": 2.1}) + "\n")
  jobs, _ = reproduce.analysis_jobs(root, force=True)
  assert [(r.key, names) for r, names, _ in jobs] == [
      ("main/lngram_r16_s1", reproduce.ANALYSES),
      ("insertion/inserted_300_s0", ("stability", "injection")),
      ("main/lngram_r16_s0", ("stability", "injection"))]


def test_analysis_names_are_those_of_lngram_exp_analyze():
  from experiments.analysis.run import LM_ANALYSES
  assert reproduce.ANALYSES == LM_ANALYSES
  assert set(reproduce.INSERTION_ANALYSES) <= set(LM_ANALYSES)
  keys = {r.key for r in reproduce.plan()}
  assert set(reproduce.INSERTION_PAIR) <= keys


def test_analyze_runs_lngram_exp_analyze_per_job(tmp_path, monkeypatch, capsys):
  root = tmp_path / "repro"
  best = _fake_run(root, "main/lngram_r64_s0", [(600, 2.00)])
  calls = []
  monkeypatch.setattr(reproduce.subprocess, "call",
                      lambda cmd, **kw: calls.append(cmd) or 0)
  assert reproduce.analyze(dry_run=True, root=root) == 0 and not calls
  assert f"lngram-exp analyze --workdir={best}" in capsys.readouterr().out
  assert reproduce.analyze(root=root) == 0
  [call] = calls
  assert call[1:4] == ["-m", "experiments", "analyze"] and call[4] == f"--workdir={best}"
  assert (best / "analysis" / "analyze.log").exists()
  monkeypatch.setattr(reproduce.subprocess, "call", lambda cmd, **kw: 3)
  assert reproduce.analyze(root=root) == 3


def _full_fixture(root, inserted_agreement=(0.9, 0.88, 0.92), inserted_steps=(100, 200, 300)):
  _fake_run(root, "main/baseline_s0", [(600, 2.20)])
  scratch = _fake_run(root, "main/lngram_r16_s0", [(600, 2.10)])
  best = _fake_run(root, "main/lngram_r64_s0", [(600, 2.00)])
  inserted = _fake_run(root, "insertion/inserted_300_s0", [(300, 2.05)])
  for name, result in (("utilisation", _utilisation()), ("id_knn", _id_knn()),
                       ("associations", _associations()), ("distributed", _distributed())):
    _write_analysis(best, name, result)
  _write_analysis(scratch, "stability", _stability((200, 400, 600), {1: (0.8, 0.79, 0.81),
                                                                     2: (0.7, 0.69, 0.71)}))
  _write_analysis(inserted, "stability", _stability(inserted_steps, {1: inserted_agreement,
                                                                      2: inserted_agreement}))
  _write_analysis(scratch, "injection", _injection(1.0))
  _write_analysis(inserted, "injection", _injection(2.0))
  return best, scratch, inserted


def _row(text, start):
  [line] = [line for line in text.splitlines() if line.startswith(start)]
  return line


def test_report_analysis_sections_and_claims(tmp_path):
  root = tmp_path / "repro"
  _full_fixture(root)
  text = report.report(root, tmp_path / "plots")
  ids = text[text.index("#### ID analyses on the best run"):]
  assert "`main/lngram_r64_s0`: final validation 2.0000 bits/byte" in ids
  assert "lowest of the 2 finished" in ids
  assert "Computed from checkpoint" not in ids   # these results hold no `source`
  _write_analysis(root / "main" / "lngram_r64_s0", "utilisation",
                  {**_utilisation(), "source": {"step": 600}})
  assert "Computed from checkpoint step 600 of `main/lngram_r64_s0`." in report.report(
      root, tmp_path / "plots")
  assert "9.50 effective codes of 16" in ids and "12 replicated: 40.00%" in ids
  assert "| 1 | document | 0.3000 | 0.2500 | 0.2000 | 0.1000 | 81.25% | 0.002 |" in ids
  assert ids.count("`C_{1,3}=7 ⇒ def` | local | 40.00% | 10.00% | +30.00 pp | 25 |") == 15
  assert "AP_R / AP_1 1.50–2.50 (R = 4 routes)" in ids
  assert "ρ above 100%" not in ids
  # Claims from the analysis files.
  assert _row(text, "| the codes are used").endswith("| reproduced: no dead code, normalised "
                                                     "entropy 0.810 |")
  assert ("| reproduced: p ≤ 0.05 in 2/2 layer × target settings, above every permutation in "
          "1/2 |") in _row(text, "| the IDs alone")
  assert "inconclusive at this scale: ρ > 50% in 1/2" in _row(text, "| ID-KNN keeps most")
  assert "not reproduced: fewer than half replicate (40.00%; paper 65.85%)" in _row(text, "| single-code")
  assert "reproduced: AP_R > AP_1 in 2/2" in _row(text, "| the full signature")
  assert "inconclusive at this scale: S_dict ρ below ID-KNN ρ in 1/2" in _row(
      text, "| the joint signature")
  # Insertion: steps of the inserted run counted from the backbone's start (300 + own).
  ins = text[text.index("#### Insertion vs from scratch"):]
  assert "inserted 2.0500, from step 0 2.1000, baseline (`main/baseline_s0`) 2.2000" in ins
  assert "| 1 | inserted | 500→600 | 0.9000 [0.8800, 0.9200] |" in ins
  assert "| 2 | from step 0 | 400→600 | 0.7000 [0.6900, 0.7100] |" in ins
  stability = _row(text, "| inserted Lngram has more stable addresses")
  assert "inconclusive at this scale: inserted more stable at every layer" in stability
  assert "over 100 vs 200 steps" in stability
  injection = _row(text, "| inserted Lngram injects more")
  assert "one seed: inserted larger in all 3 measures (the paper's direction)" in injection
  assert "immediate R L1 0.2 vs 0.1" in injection
  assert "| layer 1 | inserted | 0.2 | 0.4 | 1.5 | 0.1 | 0.01 | 0.9 |" in ins
  assert "one seed: inserted_300 lower by 0.0500 (the paper's direction), no spread" in _row(
      text, "| inserting Lngram")
  # A few dead codes are no collapse; many are. A setting at p > 0.05 makes it inconclusive.
  best = root / "main" / "lngram_r64_s0"
  _write_analysis(best, "utilisation", _utilisation(dead=1))
  _write_analysis(best, "id_knn", _id_knn(p_document=0.2))
  claims = {claim: verdict for claim, _, _, verdict in report_analyses.analysis_claims(root)}
  assert claims["the codes are used, not collapsed (C.1)"] == (
      "reproduced: no collapse (normalised entropy 0.810), but 2 / 512 codes dead (paper 0)")
  assert claims["the IDs alone carry the semantics: ID-KNN above the permutation null "
                "(§3.2)"].startswith("inconclusive at this scale: p ≤ 0.05 in 1/2")
  _write_analysis(best, "utilisation", _utilisation(dead=10))
  claims = {claim: verdict for claim, _, _, verdict in report_analyses.analysis_claims(root)}
  assert claims["the codes are used, not collapsed (C.1)"].startswith(
      "not reproduced: 20 / 512 codes dead")


def test_stability_verdict_weighs_the_interval_lengths(tmp_path):
  root = tmp_path / "repro"
  # Equal intervals (200 steps each: the inserted run kept steps 100 and 300): reproduced.
  _full_fixture(root, inserted_steps=(100, 300))
  assert "reproduced (one seed, CIs disjoint): inserted more stable" in _row(
      report.report(root, tmp_path / "p"), "| inserted Lngram has more stable")
  root2 = tmp_path / "repro2"
  _full_fixture(root2, inserted_agreement=(0.6, 0.59, 0.61))
  assert "not reproduced (one seed, CIs disjoint): inserted less stable" in _row(
      report.report(root2, tmp_path / "p"), "| inserted Lngram has more stable")
  root3 = tmp_path / "repro3"
  _full_fixture(root3, inserted_agreement=(0.75, 0.6, 0.9))
  assert "inconclusive at this scale: more stable at 0, less at 0 of 2" in _row(
      report.report(root3, tmp_path / "p"), "| inserted Lngram has more stable")


def test_report_marks_missing_and_broken_analyses_pending(tmp_path):
  root = tmp_path / "repro"
  best, scratch, inserted = _full_fixture(root)
  (best / "analysis" / "distributed.json").unlink()
  _write_analysis(best, "utilisation", {"layers": {"1": {}}})          # lacks its keys
  (inserted / "metrics.jsonl").write_text(json.dumps({"step": 200, "eval/bits_per_byte": 2}))
  knn = _id_knn()
  knn["layers"]["1"]["rho"]["local"] = 1.2
  _write_analysis(best, "id_knn", knn)
  assert "ρ above 100% (layer 1 local)" in report.report(root, tmp_path / "plots")
  (best / "analysis" / "id_knn.json").write_text("{not json")
  text = report.report(root, tmp_path / "plots")
  assert "pending: id_knn.json unreadable" in _row(text, "| the IDs alone")
  assert "pending: distributed not run on lngram_r64_s0" in _row(text, "| the full signature")
  assert "pending: analysis file lacks" in _row(text, "| the codes are used")
  assert _row(text, "| inserted Lngram has more stable").endswith(
      "| – | pending: insertion/inserted_300_s0 not finished |")
  assert "| – | inserted | pending: insertion/inserted_300_s0 not finished |" in text
  assert "| 1 | from step 0 | 400→600 |" in text      # the finished half still shows
  # No run at all of main's Lngram v2 arms: the sections say why.
  root4 = tmp_path / "repro4"
  _fake_run(root4, "main/baseline_s0", [(600, 2.2)])
  text = report.report(root4, tmp_path / "plots")
  assert "pending: no Lngram v2 run of main has finished." in text
  assert "pending: no Lngram v2 run of main has finished" in _row(text, "| the codes are used")


def test_single_seed_routes_claims(tmp_path):
  root = tmp_path / "repro"
  _fake_run(root, "main/lngram_r64_s0", [(600, 2.00)])
  _fake_run(root, "routes/r16_mem128_s0", [(600, 2.10)])
  _fake_run(root, "routes/r16_kv1_s0", [(600, 2.00)])
  _fake_run(root, "routes/r16_kv4_s0", [(400, 2.30)])
  text = report.report(root, tmp_path / "plots")
  assert _row(text, "| at equal table parameters").endswith(
      "| one seed: r64_mem32 lower by 0.1000 (the paper's direction), no spread |")
  assert _row(text, "| more KV heads").endswith("| pending: routes/r16_kv4 not finished |")
  assert "One seed per arm" in text
  assert report.single_seed_verdict("a", [2.1], "b", [2.0]) == (
      "one seed: b lower by 0.1000 (against the paper), no spread")


def test_the_inserted_run_is_measured_over_the_from_scratch_run_s_interval():
  """Own steps 100 -> 300 of the run inserted at 300 = backbone steps 400 -> 600, the last
  interval of the 600-step run it is compared with."""
  by_key = {r.key: r for r in reproduce.plan()}
  inserted, scratch = (by_key[k] for k in reproduce.INSERTION_PAIR)
  command = reproduce.analyze_command(inserted, ("stability", "injection"))
  assert command[-2:] == ["--step=300", "--stability_steps=100,300"]
  assert not any(c.startswith("--stability_steps") for c in
                 reproduce.analyze_command(scratch, ("stability", "injection")))
  assert not any(c.startswith("--stability_steps") for c in
                 reproduce.analyze_command(inserted, ("injection",)))
  offset = reproduce.steps(by_key[inserted.after])
  first, last = reproduce.STABILITY_STEPS[inserted.key]
  assert (offset + first, offset + last) == (400, reproduce.steps(scratch))


def test_the_inserted_run_s_curve_continues_its_backbone_s(tmp_path):
  root = tmp_path / "repro"
  _fake_run(root, "insertion/baseline_300_s0", [(100, 2.9), (300, 2.4)], steps=300)
  _fake_run(root, "insertion/inserted_300_s0", [(100, 2.3), (300, 2.1)], steps=300)
  _fake_run(root, "main/lngram_r16_s0", [(600, 2.0)])
  insertion = results.collect(root)["insertion"]
  assert insertion["baseline_300"]["seeds"][0]["curve"] == [(100, 2.9), (300, 2.4)]
  assert insertion["inserted_300"]["seeds"][0]["curve"] == [(400, 2.3), (600, 2.1)]
  assert insertion["from_step_0"]["seeds"][0]["final"] == 2.0   # main/lngram_r16_s0
  by_key = {r.key: r for r in reproduce.plan()}
  assert reproduce.step_offset(by_key["insertion/inserted_300_s0"]) == 300
  assert reproduce.step_offset(by_key["insertion/baseline_300_s0"]) == 0
