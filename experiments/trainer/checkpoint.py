"""Run checkpoints: orbax steps with digests; save (optionally async), verify, fall back.

A run keeps its steps under `<workdir>/checkpoints/<step>/`, each holding:
  params     a pytree of arrays (an nnx state as a pure dict)
  opt_state  the optax state (optional)
  meta       step and a digest per array leaf (digests.py); checkpoints written before
             the loop stopped keeping an unused PRNG key also hold "rng", never read
  data       the data iterator's state (JSON, {} if none)
  config     whatever rebuilds the model (JSON, {} if none)

Restoring recomputes the digests: a mismatch, like any read error, marks the
step corrupt. Restoring the latest step falls back to the previous valid one
with one warning line per step tried (naming the step tried next); a step asked
for by number, or no valid step at all, is an error. A step that disappears
while it is read (a `train` running in the same workdir keeps only its newest
`max_to_keep` steps) is not corrupt: it is skipped with a note and the steps
are listed again, so the newest readable one is used. Nor is a read that a
Ctrl-C stopped: it raises KeyboardInterrupt. orbax's own logging and
Python warnings stay off the terminal during reads (quiet.py); their full text
goes to `log_file` if one is given (`train` gives `<workdir>/checkpoints.log`;
the read-only paths give none, so they write nothing into the run).
`restore_latest_valid(quarantine=True)` (the training loop, which holds the
workdir lock) renames the corrupt steps newer than the one restored to
`<step>.corrupt` (never deletes them), so that the retrained step is saved again.

A failed save (disk full, read-only directory) raises CheckpointSaveError naming
the step and the cause; orbax's half-written `<step>.orbax-checkpoint-tmp-*`
directory is removed, so the previous step stays the latest, and closing the
Checkpointer ends the save's threads still waiting (save_threads.py).

Asynchronous saves snapshot the arrays before returning, so a training step
may donate and overwrite its device buffers right away: single-device arrays
are copied to host, multi-device ones are copied on their own devices (a host
copy would gather them).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import traceback
import warnings
import weakref
from pathlib import Path

import jax
import numpy as np

from experiments.trainer import quiet
from experiments.trainer.digests import DIGEST_KIND, DigestMismatch, tree_digests, verify
from experiments.trainer.errors import (  # re-exported: the names callers catch
  CheckpointError,
  CheckpointSaveError,
  ConfigMismatchError,
  CorruptCheckpointError,
  MissingStepError,
  VanishedStepError,
  WorkdirLockedError,
  cause,
  config_diff,
  short,
)
from experiments.trainer.save_threads import end_abandoned_save_threads

with quiet.absl_root_guard():   # absl logs while orbax imports (see quiet.py)
  import orbax.checkpoint as ocp

log = logging.getLogger("experiments")
ARRAY_ITEMS = ("params", "opt_state")
JSON_ITEMS = ("meta", "data", "config")
_TMP_SUFFIX = ".orbax-checkpoint-tmp"
_OPEN: weakref.WeakSet = weakref.WeakSet()   # for `close_open_checkpointers`
__all__ = ["CheckpointError", "CheckpointSaveError", "Checkpointer", "ConfigMismatchError",
           "CorruptCheckpointError", "MissingStepError", "VanishedStepError",
           "WorkdirLockedError", "absolute", "close_open_checkpointers", "config_diff",
           "run_checkpointer"]


def absolute(path) -> Path:
  """Orbax needs absolute paths."""
  return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def run_checkpointer(workdir, *, log_file=None, **kwargs) -> Checkpointer:
  """The Checkpointer of a run directory (`<workdir>/checkpoints`).

  `log_file`: where the full text of read/save failures goes; `train` passes
  `<workdir>/checkpoints.log`, readers pass nothing (or a path of their own).
  """
  workdir = Path(workdir).expanduser().resolve()
  return Checkpointer(workdir / "checkpoints", log_file=log_file, **kwargs)


def close_open_checkpointers() -> None:
  """Closes every Checkpointer still open (an interrupted command), newest first,
  so that orbax's threads end before the interpreter does."""
  for ckpt in sorted(_OPEN, key=lambda c: -c.opened):
    with contextlib.suppress(BaseException):
      ckpt.close()


def _log_failure(log_file: Path | None, message: str, exc: BaseException) -> None:
  if log_file is None:
    return
  try:
    with open(log_file, "a") as f:
      f.write(f"{message}\n")
      f.writelines(traceback.format_exception(type(exc), exc, exc.__traceback__))
  except OSError:
    pass


def _wraps_interrupt(exc: BaseException | None) -> bool:
  """Whether a KeyboardInterrupt is in `exc`'s chain of causes: orbax turns whatever
  stops a shard read, Ctrl-C included, into `Exception(...) from e`."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    if isinstance(exc, KeyboardInterrupt):
      return True
    seen.add(id(exc))
    exc = exc.__cause__ or exc.__context__
  return False


def _snapshot(x):
  # The device buffers may be donated by the next training step: copy them.
  if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1:
    return x.copy()
  return np.array(x, copy=True)


class Checkpointer:
  """An orbax CheckpointManager over numbered steps in `directory`."""

  _count = 0
  _manager = None
  _saving: int | None = None
  _log_route: quiet.OrbaxLogRoute | None = None
  _save_failed_once = False
  unreadable_configs: dict[int, str] = {}

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
    quiet.hold_absl_root()   # released by close(), or when a Checkpointer never closed is freed
    self._release = weakref.finalize(self, quiet.release_absl_root)
    try:
      self._manager = self._open_manager(options)
    except BaseException:
      self._release()
      raise
    self._log_route = quiet.OrbaxLogRoute.install(self.log_file)
    Checkpointer._count += 1
    self.opened = Checkpointer._count
    _OPEN.add(self)

  def _open_manager(self, options, tries: int = 5):
    """orbax's manager; it reads every step's metadata, so a step deleted meanwhile
    (a `train` running in this workdir) fails it: list the steps again."""
    for attempt in range(tries):
      try:
        with quiet.quiet_logging(self.log_file):
          return ocp.CheckpointManager(self.directory, options=options)
      except FileNotFoundError as e:
        vanished = Path(e.filename or "").parent == self.directory
        if not vanished or attempt + 1 == tries:
          raise

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, *, params, opt_state=None, data_state: dict | None = None,
           config: dict | None = None) -> bool:
    """Starts saving `step` (asynchronously if so built); False if that step exists."""
    arrays = {"params": params} if opt_state is None else {"params": params,
                                                           "opt_state": opt_state}
    if self.async_save:
      arrays = jax.tree.map(_snapshot, arrays)
    meta = {"step": int(step), "digest_kind": DIGEST_KIND,
            "digests": {name: tree_digests(tree) for name, tree in arrays.items()}}
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
      log.debug("checkpoint: saving step %d to %s", step, self.directory)
    return saved

  def _save_failed(self, step: int, e: BaseException) -> CheckpointSaveError:
    """Removes the half-written step and says what happened."""
    _log_failure(self.log_file, f"saving checkpoint step {step} failed:", e)
    self._save_failed_once = True
    leftovers = [p for p in self.directory.glob(f"{step}{_TMP_SUFFIX}*")]
    for path in leftovers:
      shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(Exception):
      self._manager.reload()
    root = cause(e)
    latest = self.latest_step()
    hint = ("free some space" if isinstance(root, OSError) and root.errno == errno.ENOSPC
            else "check that the directory is writable and has space")
    return CheckpointSaveError(
        f"could not save checkpoint step {step} in {self.directory}: "
        f"{type(root).__name__}: {short(root)}. The previous checkpoint "
        f"(step {latest}) is intact and is where a rerun resumes; {hint}, then rerun.")

  def wait(self) -> None:
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # an asynchronous save failed
      step, self._saving = self._saving, None
      raise self._save_failed(step if step is not None else -1, e) from e
    self._saving = None

  def close(self) -> None:
    if self._manager is None:
      return
    try:
      self.wait()
    finally:
      with contextlib.suppress(Exception):
        self._manager.close()
      _OPEN.discard(self)
      if self._save_failed_once:
        end_abandoned_save_threads()
      # After a failed save its abandoned threads may still report for a while:
      # their records stay routed to the log file, and the root guard stays.
      if not self._save_failed_once:
        if self._log_route is not None:
          self._log_route.remove()
        self._release()
      self._log_route = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
    return False

  # --- reading --------------------------------------------------------------------------

  def _listed(self) -> list[int]:
    """The steps on disk now (orbax caches its list; a running train changes it)."""
    # orbax warns (through absl) about a step being written or deleted meanwhile,
    # and fails if one is deleted while it reads the steps' metadata: try again.
    with quiet.quiet_logging(self.log_file):
      for _ in range(3):
        try:
          self._manager.reload()
          break
        except Exception:  # noqa: BLE001 - the previous list stands
          continue
    return self.all_steps()

  def _vanished(self, step: int) -> bool:
    return not (self.directory / str(step)).is_dir()

  def _vanished_error(self, step: int) -> VanishedStepError:
    return VanishedStepError(
        f"checkpoint step {step} in {self.directory} was deleted while it was read (a "
        f"`train` running in this workdir keeps only its newest steps); have "
        f"{self._listed() or 'none'}.")

  def _read(self, step: int, args, what: str) -> dict:
    """orbax restore of `args` from `step`, quietly; read errors as one-line exceptions."""
    self._require(step)
    error = None
    with quiet.quiet_reads(self.log_file):
      try:
        restored = self._manager.restore(step, args=args)
      except Exception as e:  # orbax/tensorstore raise many types; all mean unreadable
        if _wraps_interrupt(e):   # Ctrl-C inside the read, not a bad checkpoint
          raise KeyboardInterrupt from e
        if self._vanished(step):
          error = self._vanished_error(step)
        else:
          error = CorruptCheckpointError(
              f"checkpoint step {step} in {self.directory}{what} is unreadable "
              f"({type(e).__name__}: {short(e)}{self._see_log()}).")
          _log_failure(self.log_file, str(error), e)
    if error is not None:
      raise error
    return restored

  def read_json(self, step: int, item: str) -> dict:
    """One JSON item (`config`, `data` or `meta`) of a step."""
    if item not in JSON_ITEMS:
      raise ValueError(f"item={item!r} is not one of {JSON_ITEMS}.")
    restored = self._read(step, ocp.args.Composite(**{item: ocp.args.JsonRestore()}),
                          f": item {item!r}")
    return restored[item]

  def _see_log(self) -> str:
    return f"; details in {self.log_file}" if self.log_file is not None else ""

  def _require(self, step: int) -> None:
    steps = self.all_steps()
    if int(step) not in steps or self._vanished(step):
      steps = self._listed()
      if int(step) not in steps:
        raise MissingStepError(
            f"no checkpoint step {step} in {self.directory}; have {steps or 'none'}.")

  def restore_step(self, step: int, *, abstract_params, abstract_opt_state=None) -> dict:
    """Restores and verifies one step: params, opt_state (if asked), meta, data, config.

    `abstract_*` are trees of jax.ShapeDtypeStruct (with shardings) that fix
    structure, dtypes and placement. Raises CorruptCheckpointError, or
    MissingStepError (VanishedStepError if it was deleted while read).
    """
    items = {"params": ocp.args.StandardRestore(abstract_params)}
    if abstract_opt_state is not None:
      items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
    for name in JSON_ITEMS:
      items[name] = ocp.args.JsonRestore()
    restored = dict(self._read(step, ocp.args.Composite(**items), ""))
    meta = restored["meta"]
    for name in ARRAY_ITEMS:
      if name in items:
        try:
          verify(name, meta, restored[name])
        except DigestMismatch as e:
          raise CorruptCheckpointError(f"checkpoint step {step} in {self.directory}: {e}") from None
    return restored

  def _skip_vanished(self, error: VanishedStepError) -> None:
    log.warning("note: %s Using the newest step still there.", error)

  def _newest_first(self, tried: set):
    """Yields (step, the step after it or None), newest first, listing the steps again
    each time: steps deleted while read drop out, steps saved meanwhile join."""
    while candidates := [s for s in reversed(self._listed()) if s not in tried]:
      tried.add(candidates[0])
      yield candidates[0], (candidates[1] if len(candidates) > 1 else None)

  def _all_vanished(self) -> CheckpointError:
    return CheckpointError(f"no checkpoint found in {self.directory} (its steps were "
                           "deleted while they were read).")

  def restore_latest_valid(self, *, abstract_params, abstract_opt_state=None,
                           step: int | None = None, quarantine: bool = False,
                           skip: dict[int, str] | None = None) -> dict:
    """`step` if given (errors are fatal), else the newest step that restores cleanly.

    The result's "step" is the step restored. With `quarantine`, the corrupt
    steps newer than it are renamed `<step>.corrupt` (see `move_aside`) so
    that training saves them again; the warning says where they went. A step
    deleted while read is neither corrupt nor quarantined: the steps are
    listed again. `skip` ({step: reason}) are steps already found unreadable
    (e.g. by `newest_readable_config`): not tried again nor warned about again.
    """
    if not self.all_steps():
      raise CheckpointError(f"no checkpoint found in {self.directory}.")
    if step is not None:
      restored = self.restore_step(step, abstract_params=abstract_params,
                                   abstract_opt_state=abstract_opt_state)
      restored["step"] = int(step)
      return restored
    skip = skip or {}
    tried, bad, failures = set(skip), [], []
    for s in reversed(self.all_steps()):
      if s in skip:
        bad.append(s)
        failures.append(skip[s])
    for candidate, after in self._newest_first(tried):
      try:
        restored = self.restore_step(candidate, abstract_params=abstract_params,
                                     abstract_opt_state=abstract_opt_state)
      except VanishedStepError as e:
        self._skip_vanished(e)
        continue
      except MissingStepError:   # deleted between listing and the read's start
        continue
      except CorruptCheckpointError as e:
        failures.append(str(e))
        bad.append(candidate)
        if after is not None and not quarantine:
          warnings.warn(f"{e} Trying the previous checkpoint, step {after}.",
                        RuntimeWarning, stacklevel=2)
        continue
      if quarantine:
        for bad_step, reason in zip(bad, failures, strict=True):
          if bad_step < candidate or self._vanished(bad_step):
            continue   # older than the step resumed from: never overwritten, leave it
          moved = self.move_aside(bad_step)
          warnings.warn(
              f"{reason} Moved it aside to {moved.name} (kept, not deleted); resuming from "
              f"step {candidate}, and step {bad_step} will be saved again.",
              RuntimeWarning, stacklevel=2)
      restored["step"] = int(candidate)
      return restored
    if not failures:
      raise self._all_vanished()
    raise CheckpointError(
        f"no valid checkpoint in {self.directory}; tried steps {sorted(bad, reverse=True)}:\n  "
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
    ({step: reason}), for `restore_latest_valid(skip=...)`. Steps deleted
    while read are skipped (listed again), as in `restore_latest_valid`.
    """
    if not self._listed():
      raise CheckpointError(f"no checkpoint found in {self.directory}.")
    failures = []
    self.unreadable_configs = {}
    for candidate, after in self._newest_first(set()):
      try:
        return candidate, self.read_json(candidate, "config")
      except VanishedStepError as e:
        self._skip_vanished(e)
      except MissingStepError:
        pass
      except CorruptCheckpointError as e:
        failures.append(str(e))
        self.unreadable_configs[candidate] = str(e)
        if warn and after is not None:
          warnings.warn(f"{e} Trying the previous checkpoint, step {after}.",
                        RuntimeWarning, stacklevel=2)
    if not failures:
      raise self._all_vanished()
    raise CheckpointError(f"no readable checkpoint config in {self.directory}: {failures}")
