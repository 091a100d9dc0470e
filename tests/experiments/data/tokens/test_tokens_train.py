"""Training on token data: vocabulary from the manifest, evaluation on its validation
split, and a run killed with SIGKILL resumes bit-identically."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from tokens_inputs import VAL_FRACTION

from experiments.cli.commands.sample import sample_checkpoint
from experiments.data.tokens import prepare
from experiments.jobs import run_train
from experiments.jobs.lm.evaluate import evaluate_run
from experiments.jobs.restore import restore

STEPS = 8   # killed once step 4 is saved: the resume trains on past the save of step 6
ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def token_dir(corpus_inputs, tmp_path_factory):
  spec, _, tokenizer = corpus_inputs
  out = tmp_path_factory.mktemp("train_data")
  prepare(spec, str(tokenizer), str(out), val_fraction=VAL_FRACTION, progress=False)
  return out


def overrides(token_dir):
  return {"data.kind": "tokens", "data.path": str(token_dir), "train.steps": STEPS,
          "train.ckpt_every": 2, "train.eval_every": 1000, "train.max_to_keep": 2,
          "train.progress": False}


def params(workdir):
  model, _ = restore(workdir)
  return jax.tree.leaves(jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param))))


@pytest.mark.slow
def test_kill_9_during_training_then_resume_is_bit_identical(token_dir, smoke_config,
                                                            tmp_path):
  config = smoke_config()
  for field, value in overrides(token_dir).items():
    block, name = field.split(".")
    config[block][name] = value
  straight = run_train(config, tmp_path / "straight")
  assert straight["step"] == STEPS
  model, _ = restore(tmp_path / "straight")
  assert model.config.vocab_size == 320   # the manifest's
  metrics = evaluate_run(tmp_path / "straight")
  assert metrics["eval/loss"] == pytest.approx(straight["eval"]["eval/loss"], rel=1e-6)
  # Sampling encodes the prompt with the run's tokenizer and decodes token ids to text.
  [text], _, note = sample_checkpoint(tmp_path / "straight", ["alpha beta"], max_new_tokens=4,
                                      greedy=True)
  assert isinstance(text, str) and note == ""

  killed = tmp_path / "killed"
  argv = [sys.executable, "-m", "experiments", "train",
          "--config=experiments/configs/lm_lngram.py:smoke", f"--workdir={killed}"]
  argv += [f"--config.{k}={v}" for k, v in overrides(token_dir).items()]
  child = subprocess.Popen(argv, start_new_session=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
  deadline = time.monotonic() + 300
  while not (killed / "checkpoints" / "4").is_dir():
    assert child.poll() is None, child.stderr.read().decode()[-2000:]
    assert time.monotonic() < deadline
    time.sleep(0.02)
  os.killpg(child.pid, signal.SIGKILL)
  child.wait()
  saved = sorted(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
  assert saved and saved[-1] < STEPS, "the run ended before it could be killed"
  # The resume needs no process of its own: in this one it reuses the straight run's compiles.
  assert run_train(config, killed)["step"] == STEPS
  for a, b in zip(params(tmp_path / "straight"), params(killed), strict=True):
    np.testing.assert_array_equal(a, b)
