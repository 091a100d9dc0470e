"""Training checkpoints with orbax: save asynchronously, verify, fall back on corruption.

One step directory holds five items:
  params     the model's nnx.Param state (pure dict of arrays)
  opt_state  the optax state
  meta       step, the PRNG key, and a sha256 per array item (see below)
  data       the data iterator's state (JSON)
  config     the experiment config and the resolved model config (JSON)

orbax detects a truncated array file but not a flipped byte inside one, so
`meta` records a digest of every array item at save time and restoring
recomputes it: any mismatch, like any read error, marks the step corrupt.
Restoring the latest step falls back to the previous valid one with a
warning; a step asked for by number, or no valid step at all, is an error.

Arrays are copied to host before the (asynchronous) save returns, so the
training step may donate and overwrite its device buffers right away.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger("experiments")
_ARRAY_ITEMS = ("params", "opt_state")
_JSON_ITEMS = ("meta", "data", "config")


class CheckpointError(RuntimeError):
  """No usable checkpoint (missing, or every candidate unreadable)."""


class CorruptCheckpointError(CheckpointError):
  """One step's files cannot be read back, or do not match their digest."""


def tree_digest(tree) -> str:
  """sha256 over every leaf's path, dtype, shape and bytes (host arrays)."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _to_host(tree):
  # A real copy: the device buffers may be donated by the next training step.
  return jax.tree.map(lambda x: np.array(x, copy=True), tree)


class Checkpointer:
  """An orbax CheckpointManager under `<workdir>/checkpoints` (absolute path)."""

  def __init__(self, workdir, *, max_to_keep: int = 3, async_save: bool = True,
               create: bool = True):
    self.directory = (Path(workdir).expanduser().resolve() / "checkpoints")
    if not create and not self.directory.is_dir():
      raise CheckpointError(f"no checkpoint directory {self.directory}.")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=create, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, *, params, opt_state, rng, data_state: dict, config: dict) -> bool:
    """Starts an asynchronous save of `step`; False if that step already exists."""
    params, opt_state = _to_host(params), _to_host(opt_state)
    meta = {
        "step": int(step),
        "rng": np.asarray(jax.random.key_data(rng)).tolist(),
        "digests": {"params": tree_digest(params), "opt_state": tree_digest(opt_state)},
    }
    saved = self._manager.save(int(step), args=ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        opt_state=ocp.args.StandardSave(opt_state),
        meta=ocp.args.JsonSave(meta),
        data=ocp.args.JsonSave(data_state),
        config=ocp.args.JsonSave(config)))
    if saved:
      log.info("checkpoint: saving step %d to %s", step, self.directory)
    return saved

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def read_json(self, step: int, item: str) -> dict:
    """One JSON item (`config`, `data` or `meta`) of a step."""
    if item not in _JSON_ITEMS:
      raise ValueError(f"item={item!r} is not one of {_JSON_ITEMS}.")
    try:
      restored = self._manager.restore(
          step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))
    except Exception as e:  # orbax raises many types; all mean unreadable here
      raise CorruptCheckpointError(
          f"checkpoint step {step} in {self.directory}: item {item!r} is unreadable "
          f"({type(e).__name__}: {_short(e)}).") from e
    return restored[item]

  def restore_step(self, step: int, *, abstract_params, abstract_opt_state=None) -> dict:
    """Restores and verifies one step: params, opt_state (if asked), meta, data, config.

    `abstract_*` are trees of jax.ShapeDtypeStruct (with shardings) that fix
    structure, dtypes and placement. Raises CorruptCheckpointError.
    """
    items = {"params": ocp.args.StandardRestore(abstract_params)}
    if abstract_opt_state is not None:
      items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
    for name in _JSON_ITEMS:
      items[name] = ocp.args.JsonRestore()
    where = f"checkpoint step {step} in {self.directory}"
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax/tensorstore raise many types; all mean unreadable
      raise CorruptCheckpointError(
          f"{where} is unreadable ({type(e).__name__}: {_short(e)}).") from e
    digests = restored["meta"].get("digests", {})
    for name in _ARRAY_ITEMS:
      if name not in items:
        continue
      got = tree_digest(jax.device_get(restored[name]))
      if digests.get(name) != got:
        raise CorruptCheckpointError(
            f"{where}: item {name!r} does not match the digest recorded at save time "
            "(the files were modified or damaged after saving).")
    return dict(restored)

  def restore_latest_valid(self, *, abstract_params, abstract_opt_state=None,
                           step: int | None = None) -> dict:
    """`step` if given (errors are fatal), else the newest step that restores cleanly."""
    steps = self.all_steps()
    if not steps:
      raise CheckpointError(f"no checkpoint found in {self.directory}.")
    if step is not None:
      if step not in steps:
        raise CheckpointError(f"no checkpoint step {step} in {self.directory}; have {steps}.")
      return self.restore_step(step, abstract_params=abstract_params,
                               abstract_opt_state=abstract_opt_state)
    failures = []
    for candidate in reversed(steps):
      try:
        restored = self.restore_step(candidate, abstract_params=abstract_params,
                                     abstract_opt_state=abstract_opt_state)
      except CorruptCheckpointError as e:
        failures.append(str(e))
        warnings.warn(f"{e} Trying the previous checkpoint.", RuntimeWarning, stacklevel=2)
        continue
      return restored
    raise CheckpointError(
        f"no valid checkpoint in {self.directory}; tried steps {list(reversed(steps))}:\n  "
        + "\n  ".join(failures))

  def newest_readable_config(self) -> tuple[int, dict]:
    """(step, config JSON) of the newest step whose config item reads."""
    if not self.all_steps():
      raise CheckpointError(f"no checkpoint found in {self.directory}.")
    failures = []
    for candidate in reversed(self.all_steps()):
      try:
        return candidate, self.read_json(candidate, "config")
      except CorruptCheckpointError as e:
        failures.append(str(e))
    raise CheckpointError(f"no readable checkpoint config in {self.directory}: {failures}")


def _short(e: Exception, limit: int = 300) -> str:
  text = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  return text if len(text) <= limit else text[:limit] + "..."
