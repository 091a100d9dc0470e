"""Run records (experiments/tools/reproduce/records.py): what the report reads outlives the run directory;
the queue counts a recorded run as done unless another run needs its checkpoint."""

import json
import math
import subprocess
import time

import numpy as np
import pytest

from experiments.data.validation import write_per_doc
from experiments.tools import reproduce
from experiments.tools.report import collect as results
from experiments.tools.report import document as report
from experiments.tools.report import provenance
from experiments.tools.reproduce import records as run_records


def _finished(root, run, final, *, per_doc=True, analyses=()):
  """A finished LM run directory as the trainer and `analyze` leave it."""
  workdir = reproduce.run_dir(run, root)
  (workdir / "checkpoints" / "600").mkdir(parents=True)
  (workdir / "checkpoints" / "600" / "state").write_bytes(b"x" * 1000)
  (workdir / reproduce.STAMP).write_text(json.dumps(reproduce.stamp(run)))
  (workdir / "corpus_manifest.json").write_text(json.dumps(
      {"content_sha256": "ab" * 32, "files": ["x"] * 100}))
  # 1 s a step over the logged intervals: 600 s in all (evaluation rows carry no time).
  rows = [{"step": 10, "train/tokens_per_s": 5.0, "time/step_s": 1.0},
          {"step": 20, "train/tokens_per_s": 7.0, "time/step_s": 1.0},
          {"step": 200, "eval/bits_per_byte": final + 0.3},
          {"step": reproduce.steps(run), "eval/bits_per_byte": final, "time/step_s": 1.0}]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  if per_doc:
    tokens = np.array([100.0, 300.0])
    write_per_doc(workdir, reproduce.steps(run), "byte", ["a.py", "b.py"],
                  final * tokens * math.log(2), tokens)
  for name in analyses:
    (workdir / "analysis").mkdir(exist_ok=True)
    (workdir / "analysis" / f"{name}.json").write_text(json.dumps(
        {"source": {"step": reproduce.steps(run)}, "protocol": {"version": 99}}))
  return workdir


def _assert_same(a: dict, b: dict):
  assert a.keys() == b.keys()
  for key in a:
    if key == "per_doc":
      assert a[key].keys() == b[key].keys()
      for k in a[key]:
        np.testing.assert_array_equal(a[key][k], b[key][k])
    else:
      assert a[key] == b[key], key


@pytest.fixture
def by_key():
  return {r.key: r for r in reproduce.plan()}


def test_a_record_reads_like_its_run_and_keeps_nothing_big(tmp_path, by_key, capsys):
  run = by_key["bytes/lngram_r16_s0"]
  workdir = _finished(tmp_path, run, 2.0, analyses=("id_knn",))
  written = reproduce.record(run, tmp_path)
  kept = reproduce.run_dir(run, reproduce.records_root(tmp_path))
  assert kept == tmp_path / "records" / "bytes" / "lngram_r16_s0"
  assert set(written) == {"repro.json", "metrics.jsonl", "eval_per_doc.json",
                          "analysis/id_knn.json", run_records.PROVENANCE}
  assert not (kept / "checkpoints").exists() and not (kept / "corpus_manifest.json").exists()
  assert run_records.run_provenance(kept) == {"corpus": "ab" * 32, "tokenizer": None,
                                              "train_s": 600.0}
  assert reproduce.recorded(run, tmp_path) and reproduce.finished(run, kept.parent.parent)
  here = results.collect(tmp_path)["bytes"]["lngram_r16"]["seeds"][0]
  there = results.collect(kept.parent.parent)["bytes"]["lngram_r16"]["seeds"][0]
  _assert_same(here, there)
  assert there["final"] == pytest.approx(2.0) and there["train_s"] == 600.0
  assert reproduce.record(run, tmp_path) == []          # nothing new: nothing rewritten
  # The run directory gone (another machine), the record still answers.
  import shutil
  shutil.rmtree(workdir)
  assert reproduce.status(run, tmp_path) == "done"
  assert reproduce.main(["list", f"--root={tmp_path}", "--only=bytes"]) == 0
  listed = [line for line in capsys.readouterr().out.splitlines()
            if "--workdir=" + str(workdir) + " " in line]
  assert listed[0].startswith("done  ") and listed[0].endswith("# recorded; no checkpoint here")
  _assert_same(results.collect(kept.parent.parent)["bytes"]["lngram_r16"]["seeds"][0], there)


def test_records_refuse_nothing_to_keep_and_their_own_directory(tmp_path, by_key):
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="none of the files"):
    run_records.write_record(tmp_path / "empty", tmp_path / "out")
  workdir = _finished(tmp_path, by_key["bytes/pkm_s0"], 2.0)
  with pytest.raises(ValueError, match="into itself"):
    run_records.write_record(workdir, workdir)
  assert reproduce.record(by_key["bytes/pkm_s1"], tmp_path) == []   # not finished


def test_the_repository_root_keeps_its_records_in_the_repository():
  assert reproduce.records_root(reproduce.ROOT) == reproduce.RECORDS
  assert reproduce.records_root(None) == reproduce.RECORDS
  assert reproduce.RECORDS.parts[:2] == ("experiments", "results")


def test_a_recorded_run_is_done_unless_a_run_starts_from_its_checkpoint(tmp_path, by_key):
  base, inserted = by_key["bytes/baseline_s0"], by_key["bytes/inserted_low_s0"]
  pkm = by_key["bytes/pkm_s0"]
  for run in (base, pkm):
    run_records.write_record(_finished(tmp_path / "elsewhere", run, 2.0),
                         reproduce.run_dir(run, reproduce.records_root(tmp_path)))
  order = reproduce.training_order([base, inserted, pkm], by_key)
  done = reproduce.queue_done(order, by_key, tmp_path)
  assert pkm.key in done and base.key not in done       # the insertion needs its checkpoint
  assert reproduce.queue_done([base, pkm], by_key, tmp_path) >= {base.key, pkm.key}
  # Once the inserted run is recorded too, nothing needs the baseline's checkpoint.
  run_records.write_record(_finished(tmp_path / "elsewhere", inserted, 1.9),
                       reproduce.run_dir(inserted, reproduce.records_root(tmp_path)))
  assert reproduce.queue_done(order, by_key, tmp_path) >= {base.key, inserted.key, pkm.key}


def test_a_recorded_run_trained_again_for_its_analyses_needs_its_base_again(tmp_path,
                                                                           by_key):
  """With `then_analyze`, a recorded insertion without its analyses trains again, and with
  it the recorded baseline it starts from (whose checkpoint only its record lacked)."""
  base, inserted = by_key["bytes/baseline_s1"], by_key["bytes/inserted_low_s1"]
  for run in (base, inserted):
    run_records.write_record(_finished(tmp_path / "elsewhere", run, 2.0),
                             reproduce.run_dir(run, reproduce.records_root(tmp_path)))
  order = reproduce.training_order([base, inserted], by_key)
  assert reproduce.queue_done(order, by_key, tmp_path) >= {base.key, inserted.key}
  assert "stability" in reproduce.wanted_analyses(inserted)[0]
  done = reproduce.queue_done(order, by_key, tmp_path, then_analyze=True)
  assert base.key not in done and inserted.key not in done
  # Once the baseline finished here, only the insertion is left to train.
  _finished(tmp_path, base, 2.0)
  assert base.key in reproduce.queue_done(order, by_key, tmp_path, then_analyze=True)


def test_a_rebuilt_checkpoint_is_used_right_after_it_trains(tmp_path, by_key, monkeypatch):
  """A run that starts from another trains right after it, not after the rest of its
  seed: a recorded baseline rebuilt for its insertions does not wait, unused (and lost
  with the machine), behind every other run of the seed."""
  base, pkm = by_key["bytes/baseline_s0"], by_key["bytes/pkm_s0"]
  low, full = by_key["bytes/inserted_low_s0"], by_key["bytes/inserted_full_s0"]
  base1, engram = by_key["bytes/baseline_s1"], by_key["bytes/engram_s0"]
  order = reproduce.training_order([pkm, low, base1, full, base, engram], by_key)
  assert [r.key for r in order] == [pkm.key, base.key, low.key, full.key, engram.key,
                                    base1.key]
  run_records.write_record(_finished(tmp_path / "elsewhere", base, 2.0),
                           reproduce.run_dir(base, reproduce.records_root(tmp_path)))
  trained = []

  def train(command, **kw):
    workdir = next(a.split("=", 1)[1] for a in command if a.startswith("--workdir="))
    run = next(r for r in order if str(reproduce.run_dir(r, tmp_path)) == workdir)
    trained.append(run.key)
    _finished(tmp_path, run, 2.0)
    return 0

  monkeypatch.setattr(subprocess, "call", train)
  assert reproduce.run_queue([pkm, low, full, base, engram], tmp_path, claim=True) == 0
  assert trained == [pkm.key, base.key, low.key, full.key, engram.key]


def test_with_analyze_a_record_without_its_analyses_trains_again(tmp_path, by_key):
  r16 = by_key["bytes/lngram_r16_s1"]
  kept = reproduce.run_dir(r16, reproduce.records_root(tmp_path))
  run_records.write_record(_finished(tmp_path / "elsewhere", r16, 2.0), kept)
  assert r16.key in reproduce.queue_done([r16], by_key, tmp_path)
  assert r16.key not in reproduce.queue_done([r16], by_key, tmp_path, then_analyze=True)
  jobs, skipped = reproduce.analysis_jobs(tmp_path)
  assert not jobs and (r16.key, "recorded without its analyses and not finished here "
                                "(`run --analyze` trains it again to analyse it)") in skipped
  run_records.write_record(_finished(tmp_path / "again", r16, 2.0,
                                 analyses=reproduce.RECORD_ANALYSES), kept)
  assert r16.key in reproduce.queue_done([r16], by_key, tmp_path, then_analyze=True)
  _, skipped = reproduce.analysis_jobs(tmp_path)
  assert (r16.key, "recorded with its analyses") in skipped


def test_the_queue_records_each_run_it_trains_and_skips_recorded_ones(tmp_path, by_key,
                                                                      monkeypatch, capsys):
  pkm0, pkm1 = by_key["bytes/pkm_s0"], by_key["bytes/pkm_s1"]
  run_records.write_record(_finished(tmp_path / "elsewhere", pkm1, 2.2),
                       reproduce.run_dir(pkm1, reproduce.records_root(tmp_path)))
  calls = []

  def train(command, **kw):   # the trainer: leaves a finished run directory
    calls.append(command)
    workdir = reproduce.run_dir(pkm0, tmp_path)
    (workdir / "metrics.jsonl").write_text(json.dumps(
        {"step": reproduce.steps(pkm0), "eval/bits_per_byte": 2.1}) + "\n")
    return 0

  monkeypatch.setattr(subprocess, "call", train)
  assert reproduce.run_queue([pkm0, pkm1], tmp_path, claim=True) == 0
  assert len(calls) == 1 and f"--workdir={tmp_path}/bytes/pkm_s0" in calls[0]
  assert "record bytes/pkm_s0: repro.json, metrics.jsonl" in capsys.readouterr().out
  assert reproduce.recorded(pkm0, tmp_path)
  text = report.report(reproduce.records_root(tmp_path), tmp_path / "plots")
  [row] = [line for line in text.splitlines() if line.startswith("| pkm | `repro_lm.py")]
  assert "| 0, 1 |" in row


def test_a_vlm_base_s_time_left_follows_its_phases_not_its_step_count(tmp_path, by_key):
  # Stage 0's 2,000 steps of every count cost 12x its 1,800 of 1-2 objects: at step 1,800
  # ~93% of the prior time is left, not 53%.
  base, margin = by_key["vlm_long/base_s0"], reproduce.DEADLINE_MARGIN
  assert base.steps == 3800
  workdir = reproduce.run_dir(base, tmp_path)
  workdir.mkdir(parents=True)
  for done, left_s in ((900, 900 * 0.85 + 2000 * 10.2), (1800, 2000 * 10.2),
                       (2800, 1000 * 10.2), (3800, 0.0)):
    (workdir / "metrics.jsonl").write_text(json.dumps({"step": done}) + "\n")
    assert reproduce.vlm_prior_s(base, done) == pytest.approx(left_s)
    assert reproduce.expected_train_s(base, tmp_path, factor=1.0) == pytest.approx(
        left_s * margin)


def test_a_recorded_vlm_base_times_the_other_bases_not_the_stage_i_arms(tmp_path, by_key):
  base0, base1, sft0 = (by_key[k] for k in ("vlm_long/base_s0", "vlm_long/base_s1",
                                            "vlm_long/sft_pvm_s0"))
  workdir = reproduce.run_dir(base0, tmp_path / "elsewhere")
  workdir.mkdir(parents=True)
  (workdir / reproduce.STAMP).write_text(json.dumps(reproduce.stamp(base0)))
  (workdir / "metrics.json").write_text(json.dumps({"train_seconds": 1.0,
                                                    "eval_seconds": 0.0}))
  rows = [{"step": s, "time/step_s": 2.0 if s <= 1800 else 20.0} for s in range(20, 3801, 20)]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  run_records.write_record(workdir, reproduce.run_dir(base0, reproduce.records_root(tmp_path)))
  assert reproduce.recorded(base0, tmp_path)
  margin = reproduce.DEADLINE_MARGIN
  base_s = pytest.approx(1800 * 2.0 + 2000 * 20.0, rel=0.01)
  assert reproduce.expected_train_s(base1, tmp_path, factor=1.0) / margin == base_s
  # A Stage I arm with no Stage I run recorded keeps its prior, not a base's 10x time.
  assert reproduce.expected_train_s(sft0, tmp_path, factor=1.0) == pytest.approx(
      reproduce.vlm_prior_s(sft0) * margin)


def test_until_starts_only_runs_their_arm_s_recorded_wall_time_says_end_before_it(
    tmp_path, by_key, monkeypatch, capsys):
  pkm0, pkm1, pkm2 = (by_key[f"bytes/pkm_s{s}"] for s in range(3))
  run_records.write_record(_finished(tmp_path / "elsewhere", pkm1, 2.2),   # wall 600 s
                           reproduce.run_dir(pkm1, reproduce.records_root(tmp_path)))
  margin = reproduce.DEADLINE_MARGIN
  assert reproduce.expected_train_s(pkm0, tmp_path) == pytest.approx(600.0 * margin)
  # Nothing of the token setting recorded: its arm's time on bytes; of an arm not
  # recorded anywhere, the longest LM run; the VLM rerun's one-core timings.
  assert reproduce.expected_train_s(by_key["tokens/pkm_s0"], tmp_path) == pytest.approx(
      600.0 * margin)
  assert reproduce.expected_train_s(by_key["vlm_long/base_s0"], tmp_path) == pytest.approx(
      (1800 * 0.85 + 2000 * 10.2) * margin)
  assert reproduce.expected_train_s(by_key["vlm_long/sft_mlp_s1"], tmp_path) == pytest.approx(
      600 * 3.5 * margin)
  assert reproduce.expected_train_s(by_key["tokens/pkm_s0"], tmp_path / "none") is None
  # An arm not yet recorded: the setting's longest run.
  engram = by_key["bytes/engram_s0"]
  run_records.write_record(_finished(tmp_path / "elsewhere", engram, 2.0),
                           reproduce.run_dir(engram, reproduce.records_root(tmp_path)))
  (reproduce.run_dir(engram, reproduce.records_root(tmp_path)) / "provenance.json").write_text(
      json.dumps({"train_s": 900.0}))
  assert reproduce.expected_train_s(by_key["bytes/sparse_ffn_s0"], tmp_path) == pytest.approx(
      900.0 * margin)
  assert reproduce.expected_train_s(pkm0, tmp_path) == pytest.approx(600.0 * margin)
  assert reproduce.expected_train_s(by_key["tokens/sparse_ffn_s0"], tmp_path) == pytest.approx(
      900.0 * margin)
  # Half trained here: half the time left.
  half = reproduce.run_dir(pkm2, tmp_path)
  half.mkdir(parents=True)
  (half / reproduce.STAMP).write_text(json.dumps(reproduce.stamp(pkm2)))
  (half / "metrics.jsonl").write_text(json.dumps({"step": 300}) + "\n")
  assert reproduce.expected_train_s(pkm2, tmp_path) == pytest.approx(300.0 * margin)
  calls = []
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 1)
  now = time.time()
  assert reproduce.run_queue([pkm0, pkm2], tmp_path, claim=True, until=now + 450) == 1
  out = capsys.readouterr().out
  assert f"skip bytes/pkm_s0: would take ~{600 * margin / 60:.0f} min" in out
  assert len(calls) == 1 and f"--workdir={half}" in calls[0]   # the half-done one fits
  calls.clear()
  assert reproduce.run_queue([pkm0], tmp_path, until=now + 100) == 0 and not calls
  assert reproduce.parse_until("+90", now=1000.0) == 1000.0 + 5400.0
  assert reproduce.parse_until("2026-12-02T00:05+00:00") == 1796169900.0
  assert reproduce.parse_until(None) is None
  with pytest.raises(SystemExit, match="--until"):
    reproduce.parse_until("tomorrow")


def test_train_seconds_is_the_steady_step_time_not_pauses_or_compilation(tmp_path):
  rows = [{"step": 10, "time/step_s": 9.0},                        # compiling
          {"step": 20, "time/step_s": 1.0}, {"step": 20, "eval/bits_per_byte": 3.0},
          {"step": 30, "time/step_s": 1.0}, {"step": 30, "time/step_s": 1.0},   # resumed
          {"step": 40, "time/step_s": 250.0},                      # stopped for 40 min
          {"step": 50, "time/step_s": 1.2}, {"step": 60, "time/step_s": 0.8}]
  (tmp_path / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 70, "time/st')   # cut by a kill
  assert run_records.train_seconds(tmp_path) == pytest.approx(1.1 * 60)
  assert run_records.train_seconds(tmp_path / "none") is None


def test_vlm_train_seconds_follow_its_phases_and_span_resumes(tmp_path):
  # 30 cheap intervals (1 s/step), then 30 costly ones (12 s/step) with a compilation
  # after a resume and a 40-minute pause; 10 steps an interval, then a 20 s evaluation.
  rows = [{"step": 10 * (i + 1), "time/step_s": 1.0} for i in range(30)]
  rows += [{"step": 10 * (i + 31), "time/step_s": 12.0} for i in range(30)]
  rows[40]["time/step_s"] = 90.0                                   # compiling (resumed)
  rows[50]["time/step_s"] = 250.0                                  # stopped for 40 min
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  # Its own train_seconds counts only the segment after the last resume.
  (tmp_path / "metrics.json").write_text(json.dumps({"train_seconds": 100.0,
                                                     "eval_seconds": 20.0}))
  expected = 300 * 1.0 + 300 * 12.0 + 20.0
  assert run_records.train_seconds(tmp_path) == pytest.approx(expected, rel=0.05)
  # The single-median rule would price the cheap phase at 12 s/step.
  assert 600 * 12.0 > 1.5 * expected
  assert run_records.run_provenance(tmp_path)["train_s"] == run_records.train_seconds(tmp_path)
  # No step time logged: its own account of training and of its final evaluation.
  (tmp_path / "metrics.jsonl").unlink()
  assert run_records.train_seconds(tmp_path) == 120.0
  assert run_records.run_provenance(tmp_path) == {"corpus": None, "tokenizer": None,
                                                  "train_s": 120.0}


def test_the_stamp_keeps_every_xla_flags_a_run_trained_under(tmp_path, by_key, monkeypatch):
  pkm = by_key["bytes/pkm_s0"]
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: 1)
  monkeypatch.setenv("XLA_FLAGS", "--b")
  reproduce.queue._train(pkm, tmp_path, smoke=False)
  monkeypatch.setenv("XLA_FLAGS", "--a")
  reproduce.queue._train(pkm, tmp_path, smoke=False)        # resumed under other flags
  monkeypatch.delenv("XLA_FLAGS")
  reproduce.queue._train(pkm, tmp_path, smoke=False)
  workdir = reproduce.run_dir(pkm, tmp_path)
  assert reproduce.xla_flags_seen(workdir) == ["", "--a", "--b"]
  # ... and the CPU it trained on (resumed elsewhere: both).
  assert reproduce.cpus_seen(workdir) == [reproduce.cpu_signature()]
  assert reproduce.cpu_signature().endswith(")")
  stamp = json.loads((workdir / reproduce.STAMP).read_text())
  (workdir / reproduce.STAMP).write_text(json.dumps(stamp | {"cpus": ["Other CPU (avx2)"]}))
  reproduce.queue._train(pkm, tmp_path, smoke=False)
  assert reproduce.cpus_seen(workdir) == sorted(["Other CPU (avx2)", reproduce.cpu_signature()])
  line = provenance._flags_line([{"xla_flags": ["--a"], "cpus": ["X (avx2)"]},
                             {"xla_flags": ["--a"], "cpus": ["X (avx2)"]}, {}])
  assert line == ("XLA_FLAGS `--a` (2 runs), not recorded (1 run); CPUs CPU not recorded "
                  "(1 run), X (avx2) (2 runs)")
  # A run whose flags or CPU differ from the rest of its seed's is named (its pairs'
  # rounding differs).
  def seed(flags, final=2.0, cpu="X (avx512)"):
    return {"final": final, "xla_flags": flags, "cpus": [cpu]}
  results = {"bytes": {"baseline": {"seeds": {0: seed(["--a"]), 1: seed(["--a"])}},
                       "pkm": {"seeds": {0: seed(["--a"]), 1: seed(None)}},
                       "engram": {"seeds": {0: seed(["--a"]), 1: seed(["--a"], None)}}}}
  note = provenance.flag_mismatches(results)
  assert note.endswith("bytes seed 1: pkm (not recorded on X (avx512)), the other 1 under "
                       "`--a` on X (avx512).")
  assert "seed 0" not in note and "engram" not in note    # unfinished runs are not counted
  results["bytes"]["pkm"]["seeds"][1] = seed(["--a"])
  assert provenance.flag_mismatches(results) == ""
  results["bytes"]["pkm"]["seeds"][1] = seed(["--a"], cpu="Y (avx2)")
  assert "pkm (`--a` on Y (avx2))" in provenance.flag_mismatches(results)


def test_a_token_run_s_provenance_names_its_shards_and_tokenizer_not_its_path(tmp_path):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "token_data.json").write_text(json.dumps(
      {"path": "/some/machine/data", "shards_sha256": "cd" * 32,
       "tokenizer": {"sha256": "ef" * 32, "vocab_size": 4096}}))
  (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps(
      {"step": 10, "time/step_s": 1.5}) + "\n")   # one interval: its time
  run_records.write_record(tmp_path / "run", tmp_path / "kept")
  assert run_records.run_provenance(tmp_path / "kept") == {
      "corpus": "cd" * 32, "tokenizer": "ef" * 32, "train_s": 15.0}
  assert "/some/machine" not in "".join(p.read_text() for p in (tmp_path / "kept").iterdir())
  results = {"bytes": {"a": {"seeds": {0: {"corpus": "ab" * 32}, 1: {"corpus": "ab" * 32}}}},
             "tokens": {"a": {"seeds": {0: {"corpus": "cd" * 32, "tokenizer": "ef" * 32},
                                        1: {"corpus": "00" * 32, "tokenizer": "ef" * 32}}}}}
  line = provenance._data_line(results)
  assert line.startswith("bytes data sha256 abababababababab… (all 2 runs); tokens data "
                         "sha256 0000000000000000…, cdcdcdcdcdcdcdcd… (DIFFERENT across its "
                         "2 runs); tokens tokenizer sha256 efefefefefefefef… (all 2 runs)")


def test_the_report_describes_each_setting_s_validation_set():
  def seed(names, tokens):
    return {"final": 2.0, "per_doc": {"names": names, "tokens": np.asarray(tokens, float)}}
  same = {"bytes": {"baseline": {"seeds": {0: seed(["a", "b"], [900, 100])}},
                    "pkm": {"seeds": {0: seed(["a", "b"], [900, 100]),
                                      1: {"final": None, "per_doc": None}}}}}
  line = provenance.validation_line(same)
  assert line == ("bytes validation 2 documents, 1,000 scored units, the largest 90.0% "
                  "(ABOVE the 10% cap)")
  same["tokens"] = {"pkm": {"seeds": {0: seed([str(i) for i in range(20)], [5] * 20),
                                      1: seed([str(i) for i in range(10)], [5] * 10)}}}
  line = provenance.validation_line(same)
  assert line.endswith("tokens validation 20 documents, 100 scored units, the largest 5.0% / "
                       "10 documents, 50 scored units, the largest 10.0% (DIFFERENT sets "
                       "across its runs: 2)")


def test_list_says_which_recorded_runs_train_again_and_the_training_left(tmp_path, by_key,
                                                                         capsys):
  base, pkm = by_key["bytes/baseline_s0"], by_key["bytes/pkm_s0"]
  for run in (base, pkm):
    run_records.write_record(_finished(tmp_path / "elsewhere", run, 2.0),
                             reproduce.run_dir(run, reproduce.records_root(tmp_path)))
  assert reproduce.main(["list", f"--root={tmp_path}", "--only=bytes"]) == 0
  lines = capsys.readouterr().out.splitlines()

  def line_of(run):
    return next(x for x in lines if f"--workdir={reproduce.run_dir(run, tmp_path)} " in x)

  starting = [r.key for r in reproduce.plan() if r.after == base.key]
  assert len(starting) == 4
  assert line_of(base).startswith("done  ")
  margin = reproduce.DEADLINE_MARGIN
  assert line_of(base).endswith("# recorded; no checkpoint here; trained again first: "
                                + ", ".join(starting) + " start from it; "
                                f"~{600 * margin / 60:.0f} min")   # its expected time
  assert line_of(pkm).endswith("# recorded; no checkpoint here")
  n = len(reproduce.select(reproduce.plan(), "bytes"))
  # Every run left (the todo ones and the baseline trained again) is expected to take the
  # longest recorded time of its setting, 600 s, x DEADLINE_MARGIN; pkm is not counted;
  # the young baselines are timed like the baseline (TIMED_LIKE), 600 s x 200 / 600 steps.
  young = [r for r in reproduce.plan() if r.name == reproduce.YOUNG_BASE]
  assert len(young) == 3 and line_of(young[0]).endswith(f"# ~{200 * margin / 60:.0f} min")
  left_h = ((n - 1 - len(young)) * 600 + len(young) * 200) * margin / 3600
  # The runs given analyses (every seed of the ID arms, the insertion pair, the mature and
  # young insertions of the LR-matched B.2 control), at the prior.
  analysed = [r for r in reproduce.select(reproduce.plan(), "bytes")
              if reproduce.wanted_analyses(r)[0]]
  assert len(analysed) == 5 + 3 + 3 + 1 + 2 + 3
  analyses_h = len(analysed) * reproduce.ANALYSIS_PRIOR_S["record"] / 3600
  assert lines[-1] == (f"queue: 2 done, {n - 2} todo of {n} runs (1 done to train again for "
                       f"the runs that start from them); ~{left_h:.1f} core-hours of "
                       f"training left by the recorded times (x1.00 for this machine's "
                       f"speed, x{reproduce.DEADLINE_MARGIN} for start-up, evaluation and "
                       f"checkpoints; one core a run); ~{analyses_h:.1f} more for the "
                       "analyses `run --analyze` gives them")


def test_the_deadline_check_scales_the_records_to_this_machine_s_speed(tmp_path, by_key,
                                                                       capsys, monkeypatch):
  """Records come from other machines: a run being trained here, compared with its arm's
  records, says how much faster this machine is; a run with steps logged here goes by
  its own step time."""
  margin = reproduce.DEADLINE_MARGIN
  pkm0, pkm1, engram0 = by_key["bytes/pkm_s0"], by_key["bytes/pkm_s1"], by_key["bytes/engram_s0"]
  for run in (pkm0, engram0):        # both 1 s a step elsewhere: 600 s
    run_records.write_record(_finished(tmp_path / "elsewhere", run, 2.0),
                             reproduce.run_dir(run, reproduce.records_root(tmp_path)))
  assert reproduce.speed_factor(tmp_path) == 1.0
  # pkm seed 1, cut at step 100 here at 0.5 s a step (the first interval compiles).
  here = reproduce.run_dir(pkm1, tmp_path)
  here.mkdir(parents=True)
  (here / reproduce.STAMP).write_text(json.dumps(reproduce.stamp(pkm1)))
  rows = [{"step": 10, "time/step_s": 4.0}] + [{"step": s, "time/step_s": 0.5}
                                               for s in range(20, 101, 10)]
  (here / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert run_records.step_time(here) == 0.5
  assert run_records.step_time(here, min_intervals=11) is None
  assert reproduce.speed_factor(tmp_path) == pytest.approx(0.5)
  assert reproduce.expected_train_s(pkm1, tmp_path) == pytest.approx(500 * 0.5 * margin)
  # Runs not started here: their arm's records (or the setting's longest) at this speed.
  assert reproduce.expected_train_s(by_key["bytes/engram_s1"], tmp_path) == pytest.approx(
      600 * 0.5 * margin)
  assert reproduce.expected_train_s(by_key["bytes/sparse_ffn_s0"], tmp_path) == pytest.approx(
      600 * 0.5 * margin)
  # Finished and recorded here, the run is still compared with its arm's other seeds,
  # not with its own record (which would say 1.0).
  rows = [{"step": s, "time/step_s": 0.5} for s in range(110, 601, 10)]
  with open(here / "metrics.jsonl", "a") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows)
            + json.dumps({"step": 600, "eval/bits_per_byte": 2.0}) + "\n")
  reproduce.record(pkm1, tmp_path)
  assert reproduce.recorded(pkm1, tmp_path)
  assert run_records.run_provenance(reproduce.run_dir(pkm1, reproduce.records_root(tmp_path)))[
      "train_s"] == pytest.approx(300.0)
  assert reproduce.speed_factor(tmp_path) == pytest.approx(0.5)
  assert reproduce.expected_train_s(pkm1, tmp_path) == 0.0
  # A stale directory (an older design) says nothing about this machine.
  (here / reproduce.STAMP).unlink()
  assert reproduce.speed_factor(tmp_path) == 1.0
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: pytest.fail(cmd))
  assert reproduce.main(["run", f"--root={tmp_path}", "--only=bytes", "--until=+1"]) == 0
  assert (f"skip bytes/engram_s1: would take ~{600 * margin / 60:.0f} min (its recorded or "
          "measured time, x1.00 for this machine), past --until") in capsys.readouterr().out


def test_the_deadline_check_counts_the_analyses_a_run_is_then_given(tmp_path, by_key,
                                                                    monkeypatch):
  """With --analyze a run of the ID arms is followed by its record analyses: the deadline
  check adds their time, first the prior x this machine's speed, then as timed here."""
  r16, r64, pkm = by_key["bytes/lngram_r16_s1"], by_key["bytes/lngram_r64_s1"], by_key[
      "bytes/pkm_s1"]
  prior = reproduce.ANALYSIS_PRIOR_S["record"]
  assert reproduce.expected_analysis_s(r16, tmp_path) == prior            # factor 1.0
  assert reproduce.expected_analysis_s(r16, tmp_path, factor=0.5) == prior * 0.5
  assert reproduce.expected_analysis_s(pkm, tmp_path) == 0.0              # given none
  assert reproduce.expected_analysis_s(by_key["vlm_long/base_s0"], tmp_path) == (
      reproduce.ANALYSIS_PRIOR_S["vlm"])
  # r16 trains here and `analyze` times its four analyses (the subprocess writes them).
  workdir = _finished(tmp_path, r16, 2.0)
  clock = iter([100.0, 250.0])
  monkeypatch.setattr(time, "monotonic", lambda: next(clock))

  def call(cmd, **kw):
    for name in reproduce.RECORD_ANALYSES:
      (workdir / "analysis" / f"{name}.json").write_text(json.dumps(
          {"source": {"step": 600}, "protocol": {"version": 99}}))
    return 0

  monkeypatch.setattr(subprocess, "call", call)
  assert reproduce.analyze(root=tmp_path, keys={r16.key}) == 0
  monkeypatch.undo()
  assert reproduce.analysis_seconds(r16, tmp_path) == {
      ",".join(reproduce.RECORD_ANALYSES): 150.0}
  assert not (reproduce.run_dir(r16, reproduce.records_root(tmp_path))
              / reproduce.ANALYSIS_SECONDS).exists()     # machine timing: not recorded
  assert reproduce.expected_analysis_s(r16, tmp_path) == 0.0              # has them all
  assert reproduce.expected_analysis_s(r64, tmp_path) == 150.0            # timed here
  # The same analyses timed elsewhere here win over others of their kind.
  frozen = by_key["bytes/lngram_r16_frozen_s1"]
  reproduce.run_dir(frozen, tmp_path).mkdir(parents=True)
  (reproduce.run_dir(frozen, tmp_path) / reproduce.ANALYSIS_SECONDS).write_text(json.dumps(
      {"id_knn": 10.0, "stability,injection": 20.0}))
  assert reproduce.expected_analysis_s(r64, tmp_path) == 150.0
  (reproduce.run_dir(r16, tmp_path) / reproduce.ANALYSIS_SECONDS).unlink()
  assert reproduce.expected_analysis_s(r64, tmp_path) == 20.0             # upper median
  (reproduce.run_dir(r16, tmp_path) / reproduce.ANALYSIS_SECONDS).write_text(json.dumps(
      {",".join(reproduce.RECORD_ANALYSES): 150.0}))
  assert reproduce.expected_analysis_s(by_key["vlm_long/base_s0"], tmp_path) == (
      reproduce.ANALYSIS_PRIOR_S["vlm"])                                  # another kind
  # r64 would train ~600 s x margin, then analyse 150 s: 60 s of slack past the training
  # is not enough for the analyses, 200 s is.
  train = reproduce.expected_train_s(r64, tmp_path)
  assert train == pytest.approx(600.0 * reproduce.DEADLINE_MARGIN)
  now = time.time()
  assert reproduce.past_deadline(r64, tmp_path, now + train + 60, then_analyze=False) is None
  late = reproduce.past_deadline(r64, tmp_path, now + train + 60, then_analyze=True)
  assert late == (f"skip {r64.key}: would take ~{train / 60:.0f} min and ~2 min of analyses "
                  "(its recorded or measured time, x1.00 for this machine), past --until")
  assert reproduce.past_deadline(r64, tmp_path, now + train + 200, then_analyze=True) is None


def test_a_run_trained_again_is_compared_with_its_record_number_for_number(tmp_path):
  rows = [{"step": 20, "train/loss": 3.5, "train/param_norm": 40.0, "time/step_s": 1.0},
          {"step": 40, "train/loss": 3.25, "train/param_norm": 40.5, "time/step_s": 1.0},
          {"step": 40, "eval/loss": 3.0}]
  for name, step_s, last_loss in (("record", 1.0, 3.25), ("same", 9.0, 3.25),
                                  ("other", 1.0, 3.2500002)):
    (tmp_path / name).mkdir()
    lines = [json.dumps({**r, "time/step_s": step_s} if "time/step_s" in r else r)
             for r in rows]
    lines[1] = lines[1].replace("3.25", repr(last_loss))
    if name == "same":   # resumed: step 40 logged twice, and a line cut by a kill
      lines = lines[:2] + lines[1:] + ['{"step": 60, "train/lo']
    (tmp_path / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  assert run_records.first_difference(tmp_path / "same", tmp_path / "record") == (2, None)
  assert run_records.first_difference(tmp_path / "other", tmp_path / "record") == (
      1, {"step": 40, "key": "train/loss", "run": 3.2500002, "record": 3.25})
  assert run_records.first_difference(tmp_path / "none", tmp_path / "record") == (0, None)


def test_a_token_run_recorded_before_bits_per_token_reads_like_a_new_one(tmp_path, by_key):
  """Token runs logged their bits per token as `eval/bits_per_byte` before they had
  `eval/bits_per_token`; their records stay as they are and read like a new run's."""
  from experiments.trainer.writers import bits_unit, bits_value, read_metrics

  run = by_key["tokens/lngram_r16_s0"]
  steps = reproduce.steps(run)
  old = _finished(tmp_path / "old", run, 5.5)
  new = _finished(tmp_path / "new", run, 5.5)
  metrics = new / "metrics.jsonl"
  metrics.write_text(metrics.read_text().replace("eval/bits_per_byte", "eval/bits_per_token"))
  for workdir in (old, new):
    rows = read_metrics(workdir)
    assert reproduce.final_eval(rows, steps) == 5.5 and bits_value(rows[-1], "eval") == 5.5
    assert bits_unit(rows) == ("byte" if workdir == old else "token")
  for root in (tmp_path / "old", tmp_path / "new"):
    assert reproduce.finished(run, root) and reproduce.final_bits_per_byte(run, root) == 5.5
    seed = results.collect(root)["tokens"]["lngram_r16"]["seeds"][0]
    assert seed["final"] == pytest.approx(5.5)
    assert seed["curve"] == [(200, pytest.approx(5.8)), (steps, 5.5)]
  # A token run trained again, logging the new name, is compared with its old record.
  assert run_records.first_difference(new, old) == (4, None)
  metrics.write_text(metrics.read_text().replace('"eval/bits_per_token": 5.5',
                                                 '"eval/bits_per_token": 5.5000001'))
  assert run_records.first_difference(new, old) == (3, {
      "step": steps, "key": "eval/bits_per_token", "run": 5.5000001, "record": 5.5})


def test_a_retrain_that_differs_keeps_its_record_and_starts_nothing_from_it(
    tmp_path, by_key, monkeypatch, capsys):
  """Runs recorded from a checkpoint keep their pairing: a baseline trained again on
  another machine that ends differently replaces neither its record nor their base."""
  base, low = by_key["bytes/baseline_s0"], by_key["bytes/inserted_low_s0"]
  kept = reproduce.run_dir(base, reproduce.records_root(tmp_path))
  run_records.write_record(_finished(tmp_path / "elsewhere", base, 2.0), kept)
  before = (kept / "metrics.jsonl").read_bytes()
  # Trained again here, its last evaluation differs in the last digits.
  metrics = _finished(tmp_path, base, 2.0) / "metrics.jsonl"
  metrics.write_text(metrics.read_text().replace('"eval/bits_per_byte": 2.0',
                                                 '"eval/bits_per_byte": 2.0000001'))
  assert reproduce.diverged(base, tmp_path).startswith(
      f"trained again, it differs from its record at step {reproduce.steps(base)} "
      "(eval/bits_per_byte 2.0000001 vs 2.0; 3 logged steps agreed before it)")
  assert reproduce.record(base, tmp_path) == []
  assert (kept / "metrics.jsonl").read_bytes() == before
  assert f"record {base.key} kept: trained again" in capsys.readouterr().out

  monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("trained"))
  for claim in (False, True):
    assert reproduce.run_queue([base, low], tmp_path, claim=claim) == 0
    out = capsys.readouterr().out
    assert f"skip {low.key}: {base.key} trained again, it differs" in out
    assert "would not pair with them" in out
  assert reproduce.main(["list", f"--root={tmp_path}", "--only=bytes"]) == 0
  [line] = [line for line in capsys.readouterr().out.splitlines()
            if f"--workdir={reproduce.run_dir(base, tmp_path)} " in line]
  assert line.startswith("done  ") and "# DIFFERS: trained again, it differs" in line
  # The same numbers again (a retrain on the record's machine): the record is refreshed.
  _finished(tmp_path / "third", base, 2.0)
  (reproduce.run_dir(base, tmp_path) / "metrics.jsonl").write_bytes(
      (reproduce.run_dir(base, tmp_path / "third") / "metrics.jsonl").read_bytes())
  assert reproduce.diverged(base, tmp_path) is None


def test_a_recorded_insertion_trains_again_as_a_twin_for_the_analyses_it_lacks(
    tmp_path, by_key, monkeypatch, capsys):
  """A recorded insertion without its stability analysis trains again, for that analysis
  only, from its baseline trained again here even where that baseline differs from its
  record (another CPU's rounding): the record then keeps its numbers and takes the
  analysis, named in TWIN as a twin's with why and the base's early training."""
  base, low = by_key["bytes/baseline_s1"], by_key["bytes/inserted_low_s1"]
  assert reproduce.wanted_analyses(low)[0] == ["stability"]
  records = reproduce.records_root(tmp_path)
  for run in (base, low):
    run_records.write_record(_finished(tmp_path / "elsewhere", run, 2.0),
                             reproduce.run_dir(run, records))
  kept_metrics = (reproduce.run_dir(low, records) / "metrics.jsonl").read_bytes()
  here = _finished(tmp_path, base, 2.01) / "metrics.jsonl"
  here.write_text(here.read_text().replace('"time/step_s": 1.0}', '"time/step_s": 1.0, '
                                           '"train/loss": 2.91903547}', 1))
  old = reproduce.run_dir(base, records) / "metrics.jsonl"
  old.write_text(old.read_text().replace('"time/step_s": 1.0}', '"time/step_s": 1.0, '
                                         '"train/loss": 2.91903567}', 1))
  assert reproduce.diverged(base, tmp_path)
  # Without --analyze nothing starts from the differing baseline; with it, the twin does.
  monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("trained"))
  assert reproduce.run_queue([base, low], tmp_path, claim=True) == 0
  assert f"skip {low.key}" not in capsys.readouterr().out   # done: nothing to train
  trained, analysed = [], []

  def call(command, **kw):
    if command[3] == "analyze":
      analysed.append(command)
      _finished(tmp_path / "scratch", low, 2.0, analyses=("stability",))
      (reproduce.run_dir(low, tmp_path) / "analysis").mkdir(exist_ok=True)
      for name in ("stability.json",):
        (reproduce.run_dir(low, tmp_path) / "analysis" / name).write_bytes(
            (reproduce.run_dir(low, tmp_path / "scratch") / "analysis" / name).read_bytes())
      return 0
    trained.append(next(a for a in command if a.startswith("--workdir=")))
    metrics = _finished(tmp_path, low, 2.0) / "metrics.jsonl"   # differs at the last digit
    metrics.write_text(metrics.read_text().replace('"eval/bits_per_byte": 2.0,',
                                                   '"eval/bits_per_byte": 2.0000001,'))
    return 0

  monkeypatch.setattr(subprocess, "call", call)
  assert reproduce.run_queue([base, low], tmp_path, claim=True, then_analyze=True) == 0
  assert trained == [f"--workdir={reproduce.run_dir(low, tmp_path)}"] and analysed
  record = reproduce.run_dir(low, records)
  assert (record / "metrics.jsonl").read_bytes() == kept_metrics   # its numbers stay
  assert (record / "analysis" / "stability.json").exists()
  twin = json.loads((record / run_records.TWIN).read_text())
  assert twin["analyses"] == ["analysis/stability.json"]
  assert twin["differs"].startswith("trained again, it differs from its record")
  assert twin["base_training"] == [{"step": 10, "train/loss": 2.91903547}]
  assert twin["base_final"] == {"step": 600, "eval/bits_per_byte": 2.01}
  assert reproduce.analysed(low, "stability", tmp_path)
  # A second retrain never replaces the record's analyses, twin's or not.
  assert run_records.add_twin_analyses(reproduce.run_dir(low, tmp_path), record, "again") == []
  [line] = reproduce.declared.twin_lines(records)
  assert line.startswith(f"{low.key} (stability): trained again")
  assert line.endswith(f"Its base {base.key}, retrained, ends at 2.0100 against its "
                       "record's 2.0000 (Δ +0.0100)")
