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
Restoring the latest step falls back to the previous valid one with one
warning line per step tried (naming the step tried next); a step asked for by
number, or no valid step at all, is an error. orbax's own logging, Python
warnings and the asyncio noise of an abandoned read are kept off the terminal
during reads: their full text goes to `log_file` (a run's
`<workdir>/checkpoints.log`). `restore_latest_valid(quarantine=True)` (the
training loop, which holds the workdir lock) renames the corrupt steps newer
than the one restored to `<step>.corrupt` (never deletes them), so that the
retrained step is saved again.

A failed save (disk full, read-only directory) raises CheckpointError naming
the step and the cause; orbax's half-written `<step>.orbax-checkpoint-tmp-*`
directory is removed, so the previous step stays the latest.

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

import contextlib
import errno
import gc
import hashlib
import logging
import os
import shutil
import sys
import threading
import traceback
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


class MissingStepError(CheckpointError):
  """A step asked for by number is not on disk (the message lists those that are)."""


class ConfigMismatchError(CheckpointError):
  """The workdir holds a run of another model, or resuming would change its optimiser/steps."""


class WorkdirLockedError(CheckpointError):
  """Another process (or a lock not known to be stale) holds the workdir."""


class CheckpointSaveError(CheckpointError):
  """A step could not be written (disk full, read-only directory, ...)."""


def config_diff(old, new, prefix: str = "") -> list[tuple[str, object, object]]:
  """[(dotted path, old, new)] of the leaves that differ between two JSON-like trees."""
  if isinstance(old, dict) and isinstance(new, dict):
    out = []
    for key in sorted(set(old) | set(new), key=str):
      path = f"{prefix}.{key}" if prefix else str(key)
      out += config_diff(old.get(key, "<absent>"), new.get(key, "<absent>"), path)
    return out
  norm = (lambda x: list(x) if isinstance(x, tuple) else x)
  return [] if norm(old) == norm(new) else [(prefix, old, new)]


# orbax logs through absl (the "absl" python logger) and its own module loggers.
_NOISY_LOGGERS = ("absl", "orbax", "jax._src.distributed", "asyncio", "tensorstore")


@contextlib.contextmanager
def quiet_reads(log_file: Path | None):
  """Keeps orbax/asyncio logging, Python warnings and unraisable-exception reports
  (the never-awaited coroutines of an abandoned read) off the terminal; their
  text goes to `log_file` (if it can be opened), else nowhere."""
  handler = None
  if log_file is not None:
    try:
      handler = logging.FileHandler(log_file)
      handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    except OSError:
      handler = None
  sink = handler.stream if handler is not None else None
  saved = []
  for name in _NOISY_LOGGERS:
    logger = logging.getLogger(name)
    saved.append((logger, logger.propagate, list(logger.handlers), logger.level))
    logger.propagate = False
    logger.handlers = [handler] if handler is not None else [logging.NullHandler()]
  previous_hook = sys.unraisablehook

  def to_log(unraisable):
    if sink is not None:
      sink.write(f"unraisable: {unraisable.err_msg or ''} {unraisable.object!r}\n")
      if unraisable.exc_type is not None:
        sink.writelines(traceback.format_exception(
            unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))

  sys.unraisablehook = to_log
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      yield handler
      gc.collect()   # report abandoned coroutines here, into the log
    if sink is not None:
      for w in caught:
        sink.write(f"warning: {w.category.__name__}: {w.message}\n")
  finally:
    sys.unraisablehook = previous_hook
    for logger, propagate, handlers, level in saved:
      logger.propagate, logger.handlers = propagate, handlers
      logger.setLevel(level)
    if handler is not None:
      handler.close()


class _OrbaxLogRoute:
  """While a Checkpointer with a log file is open, orbax's own log records
  (through absl: errors of background save threads, with tracebacks) go to that
  file instead of the terminal; the Checkpointer reports failures itself."""

  _LOGGERS = ("absl", "orbax")

  def __init__(self, handler):
    self.handler = handler
    self.saved = []
    for name in self._LOGGERS:
      logger = logging.getLogger(name)
      self.saved.append((logger, logger.propagate))
      logger.addHandler(handler)
      logger.propagate = False

  @classmethod
  def install(cls, log_file: Path | None):
    if log_file is None or not log_file.parent.is_dir():
      return None
    try:
      handler = logging.FileHandler(log_file, delay=True)
    except OSError:
      return None
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    return cls(handler)

  def remove(self) -> None:
    for logger, propagate in self.saved:
      logger.removeHandler(self.handler)
      logger.propagate = propagate
    self.handler.close()


def _is_late_loop_noise(exc) -> bool:
  return isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc)


def _note_noise(exc) -> None:
  if _noise_log is not None:
    with contextlib.suppress(OSError), open(_noise_log, "a") as f:
      f.write(f"late asyncio report after a failed read: {exc}\n")


class _LateLoopNoise(logging.Filter):
  """Drops asyncio's logged "Event loop is closed" reports (into the log file)."""

  def filter(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    if _is_late_loop_noise(exc) or "Event loop is closed" in record.getMessage():
      _note_noise(exc or record.getMessage())
      return False
    return True


def _filter_late_asyncio_noise(log_file: Path | None) -> None:
  """After a failed read, orbax's abandoned asyncio work can still report
  "Event loop is closed" from another thread, seconds later, through any of
  four channels: an unraisable exception, an uncaught exception in a thread,
  asyncio's logger, or `sys.excepthook` (tensorstore's C++ threads print a
  failed `call_soon_threadsafe` callback with PyErr_Print, which calls it).
  Those reports (only those) go to the log file for the rest of the process.

  Installed before every read, not after a failure: the reports can start
  while the failing read is still unwinding, and a filter installed after it
  let a handful of tracebacks through on a loaded machine."""
  global _noise_log
  _noise_log = log_file
  if getattr(sys.unraisablehook, "_lngram_filter", False):
    return
  unraisable_hook, thread_hook, except_hook = (sys.unraisablehook, threading.excepthook,
                                               sys.excepthook)

  def unraisable(report):
    if _is_late_loop_noise(report.exc_value):
      return _note_noise(report.exc_value)
    unraisable_hook(report)

  def thread(args):
    if _is_late_loop_noise(args.exc_value):
      return _note_noise(args.exc_value)
    thread_hook(args)

  def uncaught(exc_type, exc_value, exc_tb):
    if _is_late_loop_noise(exc_value):
      return _note_noise(exc_value)
    except_hook(exc_type, exc_value, exc_tb)

  unraisable._lngram_filter = True
  sys.unraisablehook, threading.excepthook, sys.excepthook = unraisable, thread, uncaught
  logging.getLogger("asyncio").addFilter(_LateLoopNoise())


_noise_log: Path | None = None


def _log_failure(log_file: Path | None, message: str, exc: BaseException) -> None:
  if log_file is None:
    return
  try:
    with open(log_file, "a") as f:
      f.write(f"{message}\n")
      f.writelines(traceback.format_exception(type(exc), exc, exc.__traceback__))
  except OSError:
    pass


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
               create: bool = True, log_file=None):
    self.directory = absolute(directory)
    # Where the full text of read/save failures goes (the terminal gets one line).
    self.log_file = absolute(log_file) if log_file is not None else None
    if not create and not self.directory.is_dir():
      raise CheckpointError(f"no checkpoint directory {self.directory}.")
    self.async_save = async_save
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=create, enable_async_checkpointing=async_save)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._log_route = _OrbaxLogRoute.install(self.log_file)

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
    # orbax waits for the previous asynchronous save anyway; waiting here first
    # attributes its failure to its own step.
    self.wait()
    self._saving = int(step)
    try:
      saved = self._manager.save(int(step), args=ocp.args.Composite(
          **items, meta=ocp.args.JsonSave(meta), data=ocp.args.JsonSave(data_state or {}),
          config=ocp.args.JsonSave(config or {})))
    except Exception as e:  # orbax wraps OSError in several types; all mean "not written"
      raise self._save_failed(int(step), e) from e
    if saved:
      log.info("checkpoint: saving step %d to %s", step, self.directory)
    return saved

  _saving: int | None = None
  _log_route: _OrbaxLogRoute | None = None
  _save_failed_once = False
  unreadable_configs: dict[int, str] = {}

  def _save_failed(self, step: int, e: BaseException) -> CheckpointSaveError:
    """Removes the half-written step and says what happened."""
    _log_failure(self.log_file, f"saving checkpoint step {step} failed:", e)
    self._save_failed_once = True
    # The abandoned save's coroutines are reported when collected, maybe at exit.
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                            category=RuntimeWarning)
    leftovers = [p for p in self.directory.glob(f"{step}{_TMP_SUFFIX}*")]
    for path in leftovers:
      shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(Exception):
      self._manager.reload()
    cause = _cause(e)
    latest = self.latest_step()
    hint = ("free some space" if isinstance(cause, OSError) and cause.errno == errno.ENOSPC
            else "check that the directory is writable and has space")
    return CheckpointSaveError(
        f"could not save checkpoint step {step} in {self.directory}: "
        f"{type(cause).__name__}: {_short(cause)}. The previous checkpoint "
        f"(step {latest}) is intact and is where a rerun resumes; {hint}, then rerun.")

  def wait(self) -> None:
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # an asynchronous save failed
      step, self._saving = self._saving, None
      raise self._save_failed(step if step is not None else -1, e) from e
    self._saving = None

  def close(self) -> None:
    try:
      self.wait()
    finally:
      with contextlib.suppress(Exception):
        self._manager.close()
      # After a failed save its abandoned threads keep reporting (timeouts)
      # for a while: their records stay routed to the log file.
      if self._log_route is not None and not self._save_failed_once:
        self._log_route.remove()
      self._log_route = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False

  def read_json(self, step: int, item: str) -> dict:
    """One JSON item (`config`, `data` or `meta`) of a step."""
    if item not in JSON_ITEMS:
      raise ValueError(f"item={item!r} is not one of {JSON_ITEMS}.")
    self._require(step)
    error = None
    _filter_late_asyncio_noise(self.log_file)
    with quiet_reads(self.log_file):
      try:
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))
      except Exception as e:  # orbax raises many types; all mean unreadable here
        error = CorruptCheckpointError(
            f"checkpoint step {step} in {self.directory}: item {item!r} is unreadable "
            f"({type(e).__name__}: {_short(e)}{self._see_log()}).")
        _log_failure(self.log_file, str(error), e)
    if error is not None:
      raise error
    return restored[item]

  def _see_log(self) -> str:
    return f"; details in {self.log_file.name}" if self.log_file is not None else ""

  def _require(self, step: int) -> None:
    steps = self.all_steps()
    if int(step) not in steps:
      raise MissingStepError(
          f"no checkpoint step {step} in {self.directory}; have {steps or 'none'}.")

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
    self._require(step)
    where = f"checkpoint step {step} in {self.directory}"
    error = None
    _filter_late_asyncio_noise(self.log_file)
    with quiet_reads(self.log_file):
      try:
        restored = dict(self._manager.restore(step, args=ocp.args.Composite(**items)))
      except Exception as e:  # orbax/tensorstore raise many types; all mean unreadable
        error = CorruptCheckpointError(
            f"{where} is unreadable ({type(e).__name__}: {_short(e)}{self._see_log()}).")
        _log_failure(self.log_file, str(error), e)
    if error is not None:
      raise error
    meta = restored["meta"]
    for name in ARRAY_ITEMS:
      if name in items:
        _verify(where, name, meta, restored[name])
    return restored

  def restore_latest_valid(self, *, abstract_params, abstract_opt_state=None,
                           step: int | None = None, quarantine: bool = False,
                           skip: dict[int, str] | None = None) -> dict:
    """`step` if given (errors are fatal), else the newest step that restores cleanly.

    The result's "step" is the step restored. With `quarantine`, the corrupt
    steps newer than it are renamed `<step>.corrupt` (see `move_aside`) so
    that training saves them again; the warning says where they went.
    `skip` ({step: reason}) are steps already found unreadable (e.g. by
    `newest_readable_config`): not tried again nor warned about again.
    """
    steps = self.all_steps()
    if not steps:
      raise CheckpointError(f"no checkpoint found in {self.directory}.")
    if step is not None:
      restored = self.restore_step(step, abstract_params=abstract_params,
                                   abstract_opt_state=abstract_opt_state)
      restored["step"] = int(step)
      return restored
    skip = skip or {}
    failures = [skip[s] for s in reversed(steps) if s in skip]
    bad = [s for s in reversed(steps) if s in skip]
    candidates = [s for s in reversed(steps) if s not in skip]
    for i, candidate in enumerate(candidates):
      try:
        restored = self.restore_step(candidate, abstract_params=abstract_params,
                                     abstract_opt_state=abstract_opt_state)
      except CorruptCheckpointError as e:
        failures.append(str(e))
        bad.append(candidate)
        if i + 1 < len(candidates) and not quarantine:
          warnings.warn(f"{e} Trying the previous checkpoint, step {candidates[i + 1]}.",
                        RuntimeWarning, stacklevel=2)
        continue
      if quarantine:
        for bad_step, reason in zip(bad, failures, strict=True):
          if bad_step < candidate:
            continue   # older than the step resumed from: never overwritten, leave it
          moved = self.move_aside(bad_step)
          warnings.warn(
              f"{reason} Moved it aside to {moved.name} (kept, not deleted); resuming from "
              f"step {candidate}, and step {bad_step} will be saved again.",
              RuntimeWarning, stacklevel=2)
      restored["step"] = int(candidate)
      return restored
    raise CheckpointError(
        f"no valid checkpoint in {self.directory}; tried steps {list(reversed(steps))}:\n  "
        + "\n  ".join(failures) + (f"\nDetails in {self.log_file}." if self.log_file else ""))

  def move_aside(self, step: int) -> Path:
    """Renames step `step` to `<step>.corrupt` (`.corrupt-2`, ... if taken); the new path."""
    source = self.directory / str(step)
    target = self.directory / f"{step}.corrupt"
    n = 1
    while target.exists():
      n += 1
      target = self.directory / f"{step}.corrupt-{n}"
    os.rename(source, target)
    self._manager.reload()   # orbax caches its list of steps
    return target

  def newest_readable_config(self, *, warn: bool = True) -> tuple[int, dict]:
    """(step, config JSON) of the newest step whose config item reads.

    The newer steps whose config did not read are left in `unreadable_configs`
    ({step: reason}), for `restore_latest_valid(skip=...)`.
    """
    steps = list(reversed(self.all_steps()))
    if not steps:
      raise CheckpointError(f"no checkpoint found in {self.directory}.")
    failures = []
    self.unreadable_configs = {}
    for i, candidate in enumerate(steps):
      try:
        return candidate, self.read_json(candidate, "config")
      except CorruptCheckpointError as e:
        failures.append(str(e))
        self.unreadable_configs[candidate] = str(e)
        if warn and i + 1 < len(steps):
          warnings.warn(f"{e} Trying the previous checkpoint, step {steps[i + 1]}.",
                        RuntimeWarning, stacklevel=2)
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


_TMP_SUFFIX = ".orbax-checkpoint-tmp"


def _cause(e: BaseException) -> BaseException:
  """The innermost OSError under orbax's wrappers (else `e`)."""
  seen = e
  while seen is not None:
    if isinstance(seen, OSError):
      return seen
    seen = seen.__cause__ or seen.__context__
  return e


def _short(e: BaseException, limit: int = 300) -> str:
  text = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  # tensorstore appends a bound-method repr of its spec: noise on a terminal.
  text = text.split(" See full TensorStore details")[0].rstrip(".")
  return text if len(text) <= limit else text[:limit] + "..."
