"""The optional Weights & Biases writer (experiments/trainer/writers.py, `WandbRun`).

The runs here use W&B's offline mode (WANDB_MODE=offline): nothing is sent or
downloaded; the test reads the run's local transaction log (`run-<id>.wandb`).
"""

import importlib.util
import json
import os
import sys

import pytest

from experiments.trainer import writers

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed (the `track` extra)")
REFUSAL = "train.wandb_project needs wandb: pip install 'lngram-jax[track]'"


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """W&B offline, its files under tmp_path (WANDB_DIR: the returned folder), no other
  WANDB_* variable of the calling environment in effect."""
  for name in list(os.environ):
    if name.startswith("WANDB_"):
      monkeypatch.delenv(name)
  root = tmp_path / "wandb_home"
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  for name in ("CONFIG", "CACHE", "DATA", "ARTIFACT"):
    monkeypatch.setenv(f"WANDB_{name}_DIR", str(root / name.lower()))
  monkeypatch.setenv("WANDB_DIR", str(root / "runs"))
  (root / "runs").mkdir(parents=True)
  return root / "runs"


def _records(path):
  """The protobuf records of a W&B transaction log (`run-<id>.wandb`): a 7-byte header
  (":W&B", magic, version), then LevelDB-log records in 32 KiB blocks."""
  from wandb.proto import wandb_internal_pb2 as pb
  raw = path.read_bytes()
  assert raw[:4] == b":W&B", path
  pos, block, pending = 7, 32768, b""
  while pos + 7 <= len(raw):
    if block - pos % block < 7:   # a block's tail too short for a header: padding
      pos += block - pos % block
      continue
    length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
    pending += raw[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):   # FULL, or LAST of a record split over blocks
      record = pb.Record()
      record.ParseFromString(pending)
      pending = b""
      yield record


def _read_run(run_dir, timeout_s: float = 60.0):
  """{"run": the run record, "config": {key: value}, "history": [{key: value}],
  "exit_code"} of one finished offline run directory. W&B's service process writes the
  log: `finish()` returns once the service has the exit record, which it may write to
  disk a moment later (on a busy machine, seconds), so the log is read until it holds it."""
  import time
  deadline = time.monotonic() + timeout_s
  while True:
    out = _read_log(run_dir)
    if out["exit_code"] is not None or time.monotonic() > deadline:
      return out
    time.sleep(0.2)


def _read_log(run_dir):
  [log] = run_dir.glob("run-*.wandb")
  out = {"run": None, "config": {}, "history": [], "exit_code": None}
  # An item names its key in `key` or (W&B's choice) in `nested_key`.
  items = lambda items: {i.key or ".".join(i.nested_key): json.loads(i.value_json)
                         for i in items}
  for record in _records(log):
    kind = record.WhichOneof("record_type")
    if kind == "run":
      out["run"] = record.run
    elif kind == "config":
      out["config"].update(items(record.config.update))
    elif kind == "history":
      out["history"].append(items(record.history.item))
    elif kind == "exit":
      out["exit_code"] = record.exit.exit_code
  return out


def _offline_runs(wandb_dir, run_id):
  return sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}"))


def _jsonl(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@needs_wandb
@pytest.mark.slow
def test_offline_run_logs_the_metrics_and_the_config(tmp_path, offline, smoke_config):
  from experiments.jobs import run_train
  workdir = tmp_path / "run"
  config = smoke_config(steps=2, ckpt_every=2, eval_every=2, wandb_project="lngram-test",
                        wandb_run_name="tiny", wandb_tags="smoke, ci")
  result = run_train(config, workdir)
  assert result["step"] == 2 and not result["interrupted"]

  run_id = (workdir / writers.WANDB_ID_FILE).read_text().strip()
  [run_dir] = _offline_runs(offline, run_id)   # WANDB_DIR, not the workdir
  assert not (workdir / "wandb").exists()
  run = _read_run(run_dir)
  assert run["run"].run_id == run_id and run["run"].project == "lngram-test"
  assert run["run"].display_name == "tiny" and list(run["run"].tags) == ["smoke", "ci"]
  assert run["exit_code"] == 0   # finished
  # The config: the run's experiment config, flattened to plain values.
  assert run["config"]["train.steps"] == 2 and run["config"]["kind"] == "lm"
  assert run["config"]["model.d_model"] == 32
  assert run["config"]["model.memory_layers"] == [1]
  assert run["config"]["train.wandb_project"] == "lngram-test"
  # The metrics: what metrics.jsonl holds, at the same steps.
  logged = {}
  for row in run["history"]:
    logged.setdefault(row["_step"], {}).update(row)
  for row in _jsonl(workdir):
    for key, value in row.items():
      if key != "step":
        assert logged[row["step"]][key] == pytest.approx(value), (row["step"], key)
  assert sorted(logged) == [1, 2]
  assert "train/loss" in logged[1] and "eval/bits_per_byte" in logged[2]


@needs_wandb
@pytest.mark.slow
def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, offline, smoke_config,
                                                    recording_callbacks, monkeypatch):
  """SIGTERM after step 2 (save, stop, the W&B run finished), then the same command:
  the second training logs steps 3 and 4 into the W&B run of the first. Without
  WANDB_DIR the files go to the run directory."""
  from experiments.jobs import run_train
  monkeypatch.delenv("WANDB_DIR")
  workdir = tmp_path / "run"
  config = smoke_config(steps=4, ckpt_every=100, eval_every=100, wandb_project="lngram-test")
  _, _, _, stop_at_two = recording_callbacks(lambda batch: None, stop_at=2)
  first = run_train(config, workdir, callback=stop_at_two)
  assert first["interrupted"] and first["step"] == 2
  run_id = (workdir / writers.WANDB_ID_FILE).read_text().strip()
  second = run_train(config, workdir)
  assert second["step"] == 4 and not second["interrupted"]
  assert (workdir / writers.WANDB_ID_FILE).read_text().strip() == run_id

  runs = [_read_run(d) for d in _offline_runs(workdir, run_id)]
  assert len(runs) == 2, list((workdir / "wandb").iterdir())
  assert [r["run"].run_id for r in runs] == [run_id, run_id]
  assert [r["exit_code"] for r in runs] == [0, 0]
  assert [[h["_step"] for h in r["history"] if "train/loss" in h] for r in runs] == [[1, 2],
                                                                                     [3, 4]]
  assert runs[1]["config"]["train.steps"] == 4


@needs_wandb
def test_a_failed_training_marks_the_wandb_run_failed(tmp_path, offline):
  """The writer alone: a run closed after an error exits non-zero; its id file is kept."""
  tc = {"wandb_project": "lngram-test", "wandb_tags": ["a", "b"]}
  run = writers.WandbRun(tmp_path, tc, config={"train": {"steps": 3, "seq": (1, 2)}})
  writer = writers.MetricsWriter(tmp_path, wandb=run)
  writer.write(1, {"train/loss": 2.5})
  writer.close(failed=True)
  run_id = (tmp_path / writers.WANDB_ID_FILE).read_text().strip()
  [run_dir] = _offline_runs(offline, run_id)
  logged = _read_run(run_dir)
  assert logged["exit_code"] == 1 and list(logged["run"].tags) == ["a", "b"]
  assert logged["config"]["train.steps"] == 3 and logged["config"]["train.seq"] == [1, 2]
  assert logged["history"][0]["train/loss"] == 2.5


def test_without_wandb_a_project_is_refused_in_one_line(tmp_path, monkeypatch, smoke_config):
  """wandb missing (its import fails): `train`'s checks refuse before anything is built,
  naming the extra (the one check of the train.wandb_* fields); a run started without
  them is refused in the same words when the trainer makes the W&B run, before the
  first step, and the run directory is not created. `plan` of the same config does not
  need wandb."""
  from experiments.cli.preflight import check_train_config
  from experiments.jobs import check_experiment_config, run_train
  monkeypatch.setitem(sys.modules, "wandb", None)   # `import wandb` raises ImportError
  config = smoke_config(steps=2, wandb_project="lngram-test")
  with pytest.raises(ValueError) as refused:
    check_train_config(config)
  assert str(refused.value) == REFUSAL
  with pytest.raises(ValueError, match=r"needs wandb: pip install 'lngram-jax\[track\]'"):
    run_train(config, tmp_path / "run")
  assert not (tmp_path / "run").exists()
  check_experiment_config(config)   # the numbers alone (what plan checks) need no wandb
  check_train_config(smoke_config(steps=2))   # no project: W&B is off, nothing needed


@pytest.mark.slow
def test_the_cli_prints_the_refusal_as_one_error_line(tmp_path, monkeypatch):
  """`lngram-exp train --config.train.wandb_project=NAME` where wandb cannot be imported
  (a `wandb` package that raises ImportError shadows any installed one)."""
  from cli_runner import ROOT, run_cli
  shadow = tmp_path / "shadow" / "wandb"
  shadow.mkdir(parents=True)
  (shadow / "__init__.py").write_text("raise ImportError('wandb is not installed')\n")
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      [str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")]))
  done = run_cli("train", "--config=experiments/configs/lm_lngram.py:smoke",
                 f"--workdir={tmp_path / 'run'}", "--config.train.wandb_project=lngram-test",
                 cwd=ROOT)
  assert done.returncode == 2, done.stderr[-3000:]
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert errors == [f"error: {REFUSAL}"], done.stderr[-3000:]
  assert not (tmp_path / "run").exists()


def test_wandb_fields_from_the_command_line():
  """The four fields are strings, so `--config.train.wandb_*=...` sets them; tags are
  comma-separated there (a list or tuple in a config file)."""
  from experiments.cli.overrides import config_from_command_line
  config = config_from_command_line("lm_lngram.py:smoke", [
      ("train.wandb_project", "lngram"), ("train.wandb_entity", "team"),
      ("train.wandb_run_name", "arm-a"), ("train.wandb_tags", "smoke,lngram")])
  assert (config.train.wandb_project, config.train.wandb_entity,
          config.train.wandb_run_name) == ("lngram", "team", "arm-a")
  assert writers.wandb_tags(config.train.wandb_tags) == ["smoke", "lngram"]
  assert writers.wandb_tags(("a", " b ")) == ["a", "b"] and writers.wandb_tags("") == []


def test_bad_wandb_fields_are_refused_in_one_line():
  with pytest.raises(ValueError, match=r"train.wandb_entity=3 must be a string"):
    writers.check_wandb({"wandb_project": "p", "wandb_entity": 3})
  with pytest.raises(ValueError, match=r"train.wandb_tags=5 must be"):
    writers.check_wandb({"wandb_project": "p", "wandb_tags": 5})
  writers.check_wandb({"wandb_project": "", "wandb_entity": 3})   # off: nothing is checked


def test_a_bad_project_name_is_refused_before_the_run_naming_the_character():
  """'a/b c' (an entity/project path): refused in the check, by its '/', not with a
  login hint."""
  with pytest.raises(ValueError) as e:
    writers.check_wandb({"wandb_project": "a/b c"})
  text = str(e.value)
  assert "'/'" in text and "train.wandb_entity" in text and "login" not in text, text
  writers.check_wandb({"wandb_project": "a b-c_d.e"})   # spaces and dots are W&B's own


def test_the_wandb_hint_follows_the_cause(tmp_path, offline, monkeypatch):
  """A usage error (a bad setting) is fixed in the config; an offline run is not told to
  log in; only an online run's failed start is."""
  import wandb

  def refuse(**kwargs):
    raise wandb.errors.UsageError("Invalid entity 'x y'")

  monkeypatch.setattr(wandb, "init", refuse)
  with pytest.raises(ValueError) as e:
    writers.WandbRun(tmp_path, {"wandb_project": "p", "wandb_entity": "x y"})
  assert "Invalid entity" in str(e.value) and "login" not in str(e.value)
  comm = wandb.errors.CommError("network unreachable")
  assert "login" not in writers._wandb_hint(comm, wandb)   # WANDB_MODE=offline here
  monkeypatch.delenv("WANDB_MODE")
  assert "wandb login" in writers._wandb_hint(comm, wandb)


def test_flat_config_holds_plain_values():
  import ml_collections
  config = ml_collections.ConfigDict({"model": {"d": 4, "layers": (1, 2), "m": {"k": "x"}},
                                      "train": {"tags": None}})
  assert writers.flat_config(config) == {"model.d": 4, "model.layers": [1, 2],
                                         "model.m.k": "x", "train.tags": None}
