"""`lngram-exp train --config=experiments/configs/hf_lngram.py:smoke --config.init_from=hf:DIR`
through the command line: the step-0 model is the checkpoint's, a kill -9 after a checkpoint
resumes bit-identical to an uninterrupted run. Reference logits come live from
`transformers` (tests/experiments/hf/conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import restore
from experiments.cli import run_main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[3]
CONFIG = "--config=experiments/configs/hf_lngram.py:smoke"
TOKENS_BxT = np.random.default_rng(1).integers(3, 256, (2, 16))


def _train_args(path, workdir, *extra, config=CONFIG):
  return ["train", config, f"--config.init_from=hf:{path}", f"--workdir={workdir}",
          "--config.train.progress=False", *extra]


def _params(workdir):
  model, _ = restore(workdir)
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow   # one short training run with its compiles per arm
@pytest.mark.parametrize("arm", ["", "pkm", "engram", "v1", "sparse_ffn"])
def test_cli_step_0_is_the_checkpoint(hf_checkpoints, tmp_path, capsys, arm):
  """The warm-up starts at learning rate 0, so the checkpoint of step 1 holds every
  parameter as loaded: its logits are transformers' (Lngram v2's output projection
  and conv start at zero; each other arm of hf_lngram.py starts at zero output too)."""
  path, hf = hf_checkpoints["qwen3"]
  run = tmp_path / "run"
  config = CONFIG + (f",{arm}" if arm else "")
  assert run_main(["lngram-exp", *_train_args(
      path, run, "--config.train.steps=2", "--config.train.eval_every=2",
      "--config.train.ckpt_every=1", "--config.train.max_to_keep=2", config=config)]) == 0
  err = capsys.readouterr().err
  assert "memory per device on 1 device (fsdp): parameters " in err   # before allocating
  model, config = restore(run, 1)
  assert model.config.memory_layers == (1,) and config.init_from == f"hf:{path}"
  with torch.no_grad():
    want = hf(torch.tensor(TOKENS_BxT)).logits.numpy()
  got = np.asarray(model(jnp.asarray(TOKENS_BxT)))
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
  if arm:
    return
  # export-hf writes the Lngram v2 branch beside the backbone, under the authors' names.
  out = tmp_path / "export"
  assert run_main(["lngram-exp", "export-hf", f"--workdir={run}", f"--out={out}"]) == 0
  from experiments.hf.safetensors_io import SafetensorsFile
  meta = json.loads((out / "lngram_v2_config.json").read_text())
  assert meta["layers"] == [1] and meta["kwargs"]["conv_dilation"] == 3
  names = set(SafetensorsFile(out / "lngram_v2.safetensors").entries)
  assert "model.layers.1.lngram.tables.ngram_2.weight" in names
  assert "model.layers.1.lngram.short_conv.conv.weight" in names


@pytest.mark.slow   # two training runs and a killed one
def test_cli_kill_9_after_a_checkpoint_resumes_bit_identical(hf_checkpoints, tmp_path):
  path, _ = hf_checkpoints["qwen3"]
  steps = ["--config.train.steps=12", "--config.train.ckpt_every=2",
           "--config.train.eval_every=12", "--config.train.max_to_keep=3"]
  reference = tmp_path / "reference"
  assert run_main(["lngram-exp", *_train_args(path, reference, *steps)]) == 0

  workdir = tmp_path / "killed"
  child = subprocess.Popen(
      [sys.executable, "-m", "experiments", *_train_args(path, workdir, *steps)],
      cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  checkpoints = workdir / "checkpoints"
  deadline = time.time() + 300
  try:
    # Kill once a step at or after 2 is committed (not an orbax temporary).
    while time.time() < deadline and child.poll() is None:
      if checkpoints.is_dir() and any(p.name.isdigit() and int(p.name) >= 2
                                      for p in checkpoints.iterdir()):
        break
      time.sleep(0.002)
  finally:
    child.kill()
    child.wait()
  assert child.returncode == -signal.SIGKILL, "the training ended before it could be killed"

  assert run_main(["lngram-exp", *_train_args(path, workdir, *steps)]) == 0
  for x, y in zip(_params(reference), _params(workdir), strict=True):
    np.testing.assert_array_equal(x, y)


def test_cli_hf_lngram_without_init_from_is_one_line(tmp_path, capsys):
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "train", CONFIG, f"--workdir={run}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "init_from=hf:DIR" in err and "\n" not in err
  assert not run.exists()
