"""A tiny trained run shared by the experiment tests (made once per session)."""

import json
import shutil
import sys

import pytest

from experiments.configs import load_config


def smoke_config(name="lm_lngram", **train):
  """The smoke config of a config file, with train.* overrides."""
  config = load_config(f"experiments/configs/{name}.py:smoke")
  config.train.update(progress=False, **train)
  return config


@pytest.fixture(name="smoke_config", scope="session")
def smoke_config_fixture():
  """`smoke_config(name="lm_lngram", **train_overrides)` for tests that train."""
  return smoke_config


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
  """A 2-step lm_lngram smoke run with checkpoints at steps 1 and 2."""
  from experiments.jobs import run_train as train

  workdir = tmp_path_factory.mktemp("smoke_run")
  result = train(smoke_config(steps=2, ckpt_every=1, eval_every=2), workdir)
  return workdir, result


@pytest.fixture
def smoke_run_copy(smoke_run, tmp_path):
  """A private copy of the smoke run (for tests that damage or extend it)."""
  workdir, result = smoke_run
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  return copy, result


@pytest.fixture(name="recording_callbacks")
def recording_callbacks_fixture():
  """`recording_callbacks(fingerprint, stop_at)` for kill-and-resume tests."""
  return recording_callbacks


def recording_callbacks(fingerprint, stop_at):
  """Training callbacks for kill-and-resume tests: (seen_full, full_cb, seen_cut, cut_cb).

  Both record (step, fingerprint(batch)); `cut_cb` also sends SIGTERM to this
  process at step `stop_at`, which the loop turns into save-and-stop.
  """
  import signal

  seen_full, seen_cut = [], []

  def full(step, batch):
    seen_full.append((step, fingerprint(batch)))

  def cut(step, batch):
    seen_cut.append((step, fingerprint(batch)))
    if step == stop_at:
      signal.raise_signal(signal.SIGTERM)

  return seen_full, full, seen_cut, cut


@pytest.fixture
def notebook_kernel(tmp_path, monkeypatch) -> str:
  """The name of a Jupyter kernel spec that runs this interpreter (via JUPYTER_PATH).

  The default `python3` spec may point at another interpreter (or none) on a
  fresh CI machine; this one always starts the venv running the tests.
  """
  name = "lngram-test-python"
  spec_dir = tmp_path / "jupyter" / "kernels" / name
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": name, "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  return name
