"""Checkpoints: corrupt or truncated steps fall back to the previous valid one; digests."""

import gc
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    restore,
    run_checkpointer,
    tree_digests,
)
from lngram_jax.checkpoint import leaf_digest


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
  gc.collect()   # report those coroutines here, where the warning is filtered


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
  run_checkpointer(tmp_path)  # creates an empty checkpoints/ folder
  with pytest.raises(CheckpointError, match="no checkpoint found"):
    restore(tmp_path)


def test_digest_is_per_element_and_independent_of_the_layout():
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  a = np.random.default_rng(0).normal(size=(8, 6)).astype(np.float32)
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
  layouts = [jax.device_put(a, NamedSharding(mesh, spec))
             for spec in (P("x", "y"), P(None, "y"), P("y", None), P())]
  assert {leaf_digest(x) for x in layouts} == {leaf_digest(a)}
  b = a.copy()
  b[5, 1] = np.nextafter(b[5, 1], np.float32(1))   # one ulp
  assert leaf_digest(b) != leaf_digest(a)
  c = a.copy()
  c[[0, 1]] = c[[1, 0]]                            # same values, other places
  assert leaf_digest(c) != leaf_digest(a)
  assert leaf_digest(a.astype(np.float64)) != leaf_digest(a)
  tree = {"w": a, "b": np.zeros(3, np.int32)}
  assert set(tree_digests(tree)) == {"['b']", "['w']"}


def test_async_save_of_sharded_arrays_survives_donation(tmp_path):
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from lngram_jax.checkpoint import Checkpointer

  mesh = Mesh(np.asarray(jax.devices()[:4]), ("x",))
  sharding = NamedSharding(mesh, P("x"))
  table = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), sharding)
  want = np.asarray(table)
  step = jax.jit(lambda t: t * 0 - 1, donate_argnums=0)
  with Checkpointer(tmp_path, async_save=True) as ckpt:
    ckpt.save(1, params={"table": table})
    step(table)   # the training step donates and overwrites the saved buffers
    # jax 0.11 on CPU may keep a sharded input it was asked to donate; free it then, so the
    # save cannot have read from the live buffers whatever the version does.
    if not table.is_deleted():
      table.delete()
  assert table.is_deleted()
  abstract = {"table": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=sharding)}
  with Checkpointer(tmp_path, create=False) as ckpt:
    restored = ckpt.restore_step(1, abstract_params=abstract)
  np.testing.assert_array_equal(np.asarray(restored["params"]["table"]), want)
  assert restored["params"]["table"].sharding == sharding
