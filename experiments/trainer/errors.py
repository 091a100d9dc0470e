"""The run checkpointing's errors, and the config comparison a resume is judged by.

Every error is a CheckpointError, which the CLI prints as one `error:` line.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
  """No usable checkpoint (missing, or every candidate unreadable)."""


class CorruptCheckpointError(CheckpointError):
  """One step's files cannot be read back, or do not match their digest."""


class MissingStepError(CheckpointError):
  """A step asked for by number is not on disk (the message lists those that are)."""


class VanishedStepError(MissingStepError):
  """A step was deleted while it was read (retention by a running `train`)."""


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


def cause(e: BaseException) -> BaseException:
  """The innermost OSError under orbax's wrappers (else `e`)."""
  seen = e
  while seen is not None:
    if isinstance(seen, OSError):
      return seen
    seen = seen.__cause__ or seen.__context__
  return e


def short(e: BaseException, limit: int = 300) -> str:
  text = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
  # tensorstore appends a bound-method repr of its spec: noise on a terminal.
  text = text.split(" See full TensorStore details")[0].rstrip(".")
  return text if len(text) <= limit else text[:limit] + "..."
