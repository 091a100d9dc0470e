"""Checkpoints: corrupt or truncated steps fall back to the previous valid one."""

import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.checkpoint import Checkpointer, CheckpointError, CorruptCheckpointError, restore


def _largest_file(directory: Path) -> Path:
  return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _params(model):
  return jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _assert_same(model_a, model_b):
  for a, b in zip(_params(model_a), _params(model_b), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_flipped_byte_falls_back_to_previous_step(smoke_run_copy):
  workdir, _ = smoke_run_copy
  step1, _ = restore(workdir, step=1)
  target = _largest_file(workdir / "checkpoints" / "2" / "params")
  data = bytearray(target.read_bytes())
  data[len(data) // 2] ^= 0x40  # orbax alone would not notice this
  target.write_bytes(bytes(data))

  with pytest.warns(RuntimeWarning, match=r"step 2 .*digest.*previous checkpoint"):
    model, config = restore(workdir)
  _assert_same(model, step1)
  assert config.train.steps == 2
  with pytest.raises(CorruptCheckpointError, match="step 2"):
    restore(workdir, step=2)


# orbax abandons its other pending array reads when one fails; their
# never-awaited coroutines are reported at garbage collection.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_truncated_files_everywhere_is_a_clear_error(smoke_run_copy):
  workdir, _ = smoke_run_copy
  for step in ("1", "2"):
    target = _largest_file(workdir / "checkpoints" / step / "params")
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    with pytest.raises(CheckpointError, match=r"no valid checkpoint .*tried steps \[2, 1\]"):
      restore(workdir)


def test_corrupt_latest_config_uses_previous(smoke_run_copy):
  workdir, _ = smoke_run_copy
  for path in (workdir / "checkpoints" / "2" / "config").rglob("*"):
    if path.is_file() and path.name != "commit_success.txt":
      path.write_text('{"experiment": ')
  with pytest.warns(RuntimeWarning, match="step 2"):
    model, _ = restore(workdir)
  _assert_same(model, restore(workdir, step=1)[0])


def test_missing_run_is_a_clear_error(tmp_path):
  with pytest.raises(CheckpointError, match="no checkpoint directory"):
    restore(tmp_path / "nothing")
  Checkpointer(tmp_path)  # creates an empty checkpoints/ folder
  with pytest.raises(CheckpointError, match="no checkpoint found"):
    restore(tmp_path)
