"""Orbax checkpoints with digests: save (optionally async), verify, fall back on corruption.

The one checkpoint format of the project: training runs (through
`experiments.checkpoint`) and the sharded layer (`lngram_jax.sharding.checkpoint`)
both write it. A step directory under `directory/<step>/` holds:
  params     a pytree of arrays (an nnx state as a pure dict)
  opt_state  the optax state (optional)
  meta       step, the PRNG key (optional) and a digest per array leaf
  data       the data iterator's state (JSON, {} if none)
  config     whatever rebuilds the model (JSON, {} if none)

orbax detects a truncated array file but not a flipped byte inside one, so
`meta` records a digest of every array leaf at save time and restoring
recomputes it: a mismatch, like any read error, marks the step corrupt.
Restoring the latest step falls back to the previous valid one with a
warning; a step asked for by number, or no valid step at all, is an error.

Digest ("shardsum"): for every element, a 128-bit mix of its GLOBAL flat index
and its bits, summed modulo 2^64 per lane. A sum needs no order, so each
addressable shard is hashed on its own (one shard at a time on the host, never
the whole table) and the result does not depend on the layout: a table saved
from 8 devices verifies when restored onto 4 or 1. Replicas are counted once
(replica_id 0). Arrays that are not fully addressable (multi-host) are not
digested: their leaf is recorded as "unverified" and restoring skips it
(orbax still checks those files' structure). Checkpoints written before the
shardsum digests (meta without "digest_kind") are verified with the older
whole-array sha256 (`tree_digest`).

Asynchronous saves snapshot the arrays before returning, so a training step
may donate and overwrite its device buffers right away: single-device arrays
are copied to host, multi-device ones are copied on their own devices (a host
copy would gather them).
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger("lngram_jax")
ARRAY_ITEMS = ("params", "opt_state")
JSON_ITEMS = ("meta", "data", "config")
DIGEST_KIND = "shardsum-v1"
UNVERIFIED = "unverified"
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


class CheckpointError(RuntimeError):
  """No usable checkpoint (missing, or every candidate unreadable)."""


class CorruptCheckpointError(CheckpointError):
  """One step's files cannot be read back, or do not match their digest."""


def _splitmix64(z):
  # Vectorised SplitMix64 finaliser (uint64 arithmetic wraps, as intended).
  with np.errstate(over="ignore"):
    z = (z + np.uint64(0x9E3779B97F4A7C15)) & _M64
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
    return z ^ (z >> np.uint64(31))


def _element_bits(a: np.ndarray) -> np.ndarray:
  """Each element's bits as uint64 (floats of any width, ints, bools)."""
  a = np.ascontiguousarray(a)
  unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
  return a.view(unsigned).astype(np.uint64)


def _global_flat_index(index: tuple, shape: tuple) -> np.ndarray:
  """Global C-order flat index of every element of the block `index` of `shape`."""
  flat = np.zeros((), np.uint64)
  stride = 1
  ranges = [np.arange(*s.indices(n), dtype=np.uint64) for s, n in zip(index, shape, strict=True)]
  for dim in reversed(range(len(shape))):
    view = [1] * len(shape)
    view[dim] = -1
    flat = flat + ranges[dim].reshape(view) * np.uint64(stride)
    stride *= shape[dim]
  return flat


def _block_sums(block: np.ndarray, index: tuple, shape: tuple) -> tuple[int, int]:
  if block.size == 0:
    return 0, 0
  flat = np.broadcast_to(_global_flat_index(index, shape), block.shape).reshape(-1)
  bits = _element_bits(block).reshape(-1)
  lane1 = _splitmix64(flat ^ _splitmix64(bits))
  lane2 = _splitmix64(lane1 ^ np.uint64(0x5851F42D4C957F2D) ^ bits)
  return int(lane1.sum(dtype=np.uint64)), int(lane2.sum(dtype=np.uint64))


def leaf_digest(x) -> str:
  """The layout-independent digest of one array (see the module doc)."""
  if isinstance(x, jax.Array):
    if not x.is_fully_addressable:
      return UNVERIFIED
    shape, dtype = tuple(x.shape), np.dtype(x.dtype)
    blocks = [(np.asarray(s.data), s.index) for s in x.addressable_shards if s.replica_id == 0]
  else:
    a = np.asarray(x)
    shape, dtype = a.shape, a.dtype
    blocks = [(a, tuple(slice(None) for _ in shape))]
  s1 = s2 = 0
  for block, index in blocks:
    b1, b2 = _block_sums(block, index, shape)
    s1, s2 = (s1 + b1) % 2**64, (s2 + b2) % 2**64
  return f"{dtype.name}|{shape}|{s1:016x}{s2:016x}"


def tree_digests(tree) -> dict[str, str]:
  """{leaf path: leaf_digest} of a pytree."""
  return {jax.tree_util.keystr(path): leaf_digest(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tree_digest(tree) -> str:
  """The older whole-tree sha256 (host arrays), kept to verify older checkpoints."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _snapshot(x):
  # The device buffers may be donated by the next training step: copy them.
  if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1:
    return x.copy()
  return np.array(x, copy=True)


def absolute(path) -> Path:
  """Orbax needs absolute paths."""
  return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


class Checkpointer:
  """An orbax CheckpointManager over numbered steps in `directory`."""

  def __init__(self, directory, *, max_to_keep: int | None = 3, async_save: bool = True,
               create: bool = True):
    self.directory = absolute(directory)
    if not create and not self.directory.is_dir():
      raise CheckpointError(f"no checkpoint directory {self.directory}.")
    self.async_save = async_save
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=create, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, *, params, opt_state=None, rng=None, data_state: dict | None = None,
           config: dict | None = None) -> bool:
    """Starts saving `step` (asynchronously if so built); False if that step exists."""
    arrays = {"params": params} if opt_state is None else {"params": params,
                                                           "opt_state": opt_state}
    if self.async_save:
      arrays = jax.tree.map(_snapshot, arrays)
    meta = {"step": int(step), "digest_kind": DIGEST_KIND,
            "digests": {name: tree_digests(tree) for name, tree in arrays.items()}}
    if rng is not None:
      meta["rng"] = np.asarray(jax.random.key_data(rng)).tolist()
    items = {name: ocp.args.StandardSave(tree) for name, tree in arrays.items()}
    saved = self._manager.save(int(step), args=ocp.args.Composite(
        **items, meta=ocp.args.JsonSave(meta), data=ocp.args.JsonSave(data_state or {}),
        config=ocp.args.JsonSave(config or {})))
    if saved:
      log.info("checkpoint: saving step %d to %s", step, self.directory)
    return saved

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False

  def read_json(self, step: int, item: str) -> dict:
    """One JSON item (`config`, `data` or `meta`) of a step."""
    if item not in JSON_ITEMS:
      raise ValueError(f"item={item!r} is not one of {JSON_ITEMS}.")
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
    for name in JSON_ITEMS:
      items[name] = ocp.args.JsonRestore()
    where = f"checkpoint step {step} in {self.directory}"
    try:
      restored = dict(self._manager.restore(step, args=ocp.args.Composite(**items)))
    except Exception as e:  # orbax/tensorstore raise many types; all mean unreadable
      raise CorruptCheckpointError(
          f"{where} is unreadable ({type(e).__name__}: {_short(e)}).") from e
    meta = restored["meta"]
    for name in ARRAY_ITEMS:
      if name in items:
        _verify(where, name, meta, restored[name])
    return restored

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
        return self.restore_step(candidate, abstract_params=abstract_params,
                                 abstract_opt_state=abstract_opt_state)
      except CorruptCheckpointError as e:
        failures.append(str(e))
        warnings.warn(f"{e} Trying the previous checkpoint.", RuntimeWarning, stacklevel=2)
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
        warnings.warn(f"{e} Trying the previous checkpoint.", RuntimeWarning, stacklevel=2)
    raise CheckpointError(f"no readable checkpoint config in {self.directory}: {failures}")


def _verify(where: str, name: str, meta: dict, tree) -> None:
  recorded = meta.get("digests", {}).get(name)
  if meta.get("digest_kind") != DIGEST_KIND:   # written before shardsum digests
    if recorded != tree_digest(jax.device_get(tree)):
      raise CorruptCheckpointError(
          f"{where}: item {name!r} does not match the digest recorded at save time "
          "(the files were modified or damaged after saving).")
    return
  got = tree_digests(tree)
  if set(got) != set(recorded or {}):
    raise CorruptCheckpointError(f"{where}: item {name!r} holds other arrays than were saved.")
  for path, want in recorded.items():
    if UNVERIFIED in (want, got[path]):
      continue
    if got[path] != want:
      raise CorruptCheckpointError(
          f"{where}: item {name!r} array {path} does not match the digest recorded at save "
          "time (the files were modified or damaged after saving).")


def _short(e: Exception, limit: int = 300) -> str:
  text = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  return text if len(text) <= limit else text[:limit] + "..."
