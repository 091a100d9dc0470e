"""How an analysis writes into a run directory: atomically, with its source, under a lock.

Every result file (JSON, Markdown, PNG, the records cache) is written to a
private temporary file beside its destination and renamed over it, so a killed
`analyze` leaves each file either as it was or complete, never truncated. Every
result carries `source`: the checkpoint step it read, the digest of that
checkpoint's saved config and the seeds (the analysis' sampling seed and the
run's training seed), so a result left from an earlier step or run config is
told apart from a new one. `analysis_lock(workdir)` holds `<workdir>/.analyze.lock`
while an `analyze` writes: two of them on one run directory would interleave
their files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from experiments.trainer import durable
from experiments.trainer.lock import AnalysisLock


def config_digest(saved: dict) -> str:
  """sha256 of a checkpoint's saved config JSON (keys sorted): equal configs, equal digest."""
  text = json.dumps(saved, sort_keys=True, separators=(",", ":"), default=str)
  return hashlib.sha256(text.encode()).hexdigest()


def source(saved: dict, step: int, seed: int | None) -> dict:
  """What a result was computed from: {"step", "config_sha256", "seed", "train_seed"}."""
  train = (saved.get("experiment") or {}).get("train") or {}
  return {"step": int(step), "config_sha256": config_digest(saved),
          "seed": None if seed is None else int(seed), "train_seed": train.get("seed")}


def atomic_write(path, write: Callable[[Path], object]) -> Path:
  """write(tmp) into a temporary file beside `path`, then renames it onto `path`.

  The rename is atomic on one file system: a reader (or a kill -9 at any
  moment) sees the old file or the whole new one. On an error the temporary
  file is removed and `path` is untouched.
  """
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  # Hidden, and not ending in the destination's suffix, so that no reader listing
  # `*.json` or `*.npz` sees a half-written file (writers name formats explicitly).
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  try:
    write(tmp)
    with open(tmp, "rb+") as f:
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  durable.sync_dir(path.parent)   # the rename too survives a power cut
  return path


def remove_leftovers(folder) -> list[Path]:
  """Deletes the temporary files a killed writer left in `folder` (call under the lock)."""
  folder = Path(folder)
  found = sorted(folder.glob(".*.[0-9]*.tmp")) if folder.is_dir() else []
  for path in found:
    path.unlink(missing_ok=True)
  return found


def write_text(path, text: str) -> Path:
  return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_json(path, result: dict, *, allow_nan: bool = False) -> Path:
  """`result` as JSON; strict by default (the LM analyses write NaN as null)."""
  return write_text(path, json.dumps(result, indent=1, allow_nan=allow_nan))


def analysis_lock(workdir) -> AnalysisLock:
  """The lock one `analyze` holds on a run directory while it writes (see the module doc)."""
  return AnalysisLock(workdir)
