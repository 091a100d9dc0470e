"""Checkpoints: corrupt or truncated steps fall back to the previous valid one; digests;
steps deleted while read (a running `train`) are skipped; restoring has no side effects."""

import gc
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.jobs.restore import restore
from experiments.trainer.checkpoint import (
  Checkpointer,
  CheckpointError,
  CorruptCheckpointError,
  MissingStepError,
  run_checkpointer,
)
from experiments.trainer.digests import leaf_digest, tree_digests

REPO = Path(__file__).resolve().parents[3]


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


def test_a_flipped_byte_in_a_shard_is_caught_on_another_mesh(tmp_path):
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  table = np.random.default_rng(1).normal(size=(1024, 16)).astype(np.float32)   # the largest file
  eight = NamedSharding(Mesh(np.asarray(jax.devices()[:8]), ("x",)), P("x"))
  with Checkpointer(tmp_path, async_save=False) as ckpt:
    ckpt.save(1, params={"table": jax.device_put(table, eight)})
  target = _largest_file(tmp_path / "1" / "params")
  data = bytearray(target.read_bytes())
  data[len(data) // 2] ^= 0x08
  target.write_bytes(bytes(data))
  four = NamedSharding(Mesh(np.asarray(jax.devices()[:4]), ("x",)), P("x"))
  abstract = {"table": jax.ShapeDtypeStruct(table.shape, table.dtype, sharding=four)}
  with Checkpointer(tmp_path, create=False) as ckpt, pytest.raises(CorruptCheckpointError,
                                                                    match="step 1 .*digest"):
    ckpt.restore_step(1, abstract_params=abstract)


# --- a step deleted while it is read (retention by a running `train`) ---------------------


def _steps_deleted_during_the_first_read(monkeypatch, ckpt, *, saved: tuple, deleted: tuple):
  """On orbax's first restore, what a `train` saving next to us does: new steps appear
  (copies of the newest), old ones go; then the read runs on the vanished files."""
  real = ckpt._manager.restore
  calls = []

  def restore(step, *args, **kwargs):
    if not calls:
      newest = ckpt.directory / str(max(ckpt.all_steps()))
      for new in saved:
        shutil.copytree(newest, ckpt.directory / str(new))
      for old in deleted:
        shutil.rmtree(ckpt.directory / str(old))
    calls.append(step)
    return real(step, *args, **kwargs)

  monkeypatch.setattr(ckpt._manager, "restore", restore)
  return calls


def test_a_step_deleted_while_read_is_skipped_not_called_corrupt(tmp_path, monkeypatch,
                                                                   caplog):
  want = np.arange(6, dtype=np.float32)
  saved = tmp_path / "saved"   # steps 2 and 4, saved once, copied for each case
  with Checkpointer(saved, async_save=False, max_to_keep=None) as ckpt:
    for step in (2, 4):
      ckpt.save(step, params={"w": want})
  abstract = {"w": jax.ShapeDtypeStruct((6,), jnp.float32)}
  for quarantine in (False, True):
    run = tmp_path / f"quarantine={quarantine}"
    shutil.copytree(saved, run)
    with Checkpointer(run, create=False, async_save=False) as ckpt:
      calls = _steps_deleted_during_the_first_read(monkeypatch, ckpt, saved=(6, 8),
                                                   deleted=(2, 4))
      with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "unreadable ... trying the previous" warning
        with caplog.at_level("WARNING", logger="experiments"):
          restored = ckpt.restore_latest_valid(abstract_params=abstract, quarantine=quarantine)
    assert restored["step"] == 8 and calls == [4, 8]
    np.testing.assert_array_equal(np.asarray(restored["params"]["w"]), want)
    assert "step 4" in caplog.text and "deleted while it was read" in caplog.text
    assert not list(run.glob("*.corrupt*"))   # never quarantined
    caplog.clear()


def test_a_config_deleted_while_read_is_skipped(tmp_path, monkeypatch):
  with Checkpointer(tmp_path, async_save=False, max_to_keep=None) as ckpt:
    for step in (2, 4):
      ckpt.save(step, params={"w": np.ones(2, np.float32)}, config={"at": step})
  with Checkpointer(tmp_path, create=False, async_save=False) as ckpt:
    _steps_deleted_during_the_first_read(monkeypatch, ckpt, saved=(6,), deleted=(2, 4))
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      assert ckpt.newest_readable_config() == (6, {"at": 4})
    assert ckpt.unreadable_configs == {}


def test_restore_while_train_deletes_the_step_uses_the_newest_readable(smoke_run_copy,
                                                                       monkeypatch):
  """`eval`/`restore` next to a `train` saving every 2 steps with max_to_keep=2: the
  step being read is deleted (and a newer one saved) mid-read."""
  workdir, _ = smoke_run_copy
  real_init = Checkpointer.__init__

  def init(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    real = self._manager.restore

    def restore_(step, *a, **k):
      if step == 2 and "params" in k["args"].keys():
        shutil.copytree(self.directory / "2", self.directory / "4")
        shutil.rmtree(self.directory / "1")
        shutil.rmtree(self.directory / "2")
      return real(step, *a, **k)

    self._manager.restore = restore_

  monkeypatch.setattr(Checkpointer, "__init__", init)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _, config = restore(workdir)
  assert config.restored_step == 4
  with pytest.raises(MissingStepError, match=r"no checkpoint step 2 .*have \[4\]"):
    restore(workdir, step=2)


# --- restoring changes nothing outside the call ------------------------------------------


def test_restore_leaves_hooks_loggers_and_the_run_directory_alone(smoke_run_copy):
  """A notebook's `restore()`, even one that falls back past a corrupt step, keeps the
  process's hooks and root logger as they were and writes nothing into the run."""
  workdir, _ = smoke_run_copy
  target = _largest_file(workdir / "checkpoints" / "2" / "params")
  data = bytearray(target.read_bytes())
  data[len(data) // 2] ^= 0x40
  target.write_bytes(bytes(data))
  before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*")}
  code = f"""
import logging, sys, threading, warnings
hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
from experiments import restore
assert logging.root.handlers == [], ("import", logging.root.handlers)
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  model, config = restore({str(workdir)!r})
assert config.restored_step == 1 and any("step 2" in str(w.message) for w in caught)
assert (sys.excepthook, threading.excepthook, sys.unraisablehook) == hooks, "hooks changed"
assert logging.root.handlers == [], ("restore", logging.root.handlers)
logging.basicConfig(level=logging.INFO, format="user: %(message)s")
logging.getLogger("mine").info("hello")
"""
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "user: hello" in done.stderr   # the user's own logging setup took effect
  assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*")} == before
  assert not (workdir / "checkpoints.log").exists()


# The abandoned reads' never-awaited coroutines, as in the truncated-files test above.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_restore_writes_failure_details_only_to_a_named_file(smoke_run_copy, tmp_path):
  workdir, _ = smoke_run_copy
  target = _largest_file(workdir / "checkpoints" / "2" / "params")
  target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
  details = tmp_path / "details.log"
  with pytest.warns(RuntimeWarning, match=r"step 2 .*details in .*details\.log"):
    _, config = restore(workdir, log_file=details)
  assert config.restored_step == 1
  assert "step 2" in details.read_text() and "Traceback" in details.read_text()
  assert not (workdir / "checkpoints.log").exists()
  gc.collect()


# --- Ctrl-C inside a read ------------------------------------------------------------------


def test_ctrl_c_inside_a_shard_read_is_an_interrupt_not_a_corrupt_step(tmp_path, monkeypatch):
  """orbax wraps whatever stops a shard read in `Exception(...) from e`; a Ctrl-C landing
  there must reach the caller as KeyboardInterrupt (the CLI's 130), not as a corrupt
  step (its exit 2) or a fall-back to an older one."""
  from orbax.checkpoint._src.serialization import serialization

  with Checkpointer(tmp_path, async_save=False, max_to_keep=None) as ckpt:
    for step in (2, 4):
      ckpt.save(step, params={"w": jnp.arange(6, dtype=jnp.float32)})

  async def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(serialization, "_read_shard", interrupted)
  abstract = {"w": jax.ShapeDtypeStruct((6,), jnp.float32)}
  with Checkpointer(tmp_path, create=False, async_save=False) as ckpt:
    with pytest.raises(KeyboardInterrupt):
      ckpt.restore_latest_valid(abstract_params=abstract)
  assert not list(tmp_path.glob("*.corrupt*"))
