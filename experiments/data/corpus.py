"""Text corpora as lists of files: listing, the train/validation split, the manifest.

Two sources:
  * "stdlib": the embedded default, the Python standard library's own source
    (`sysconfig.get_paths()["stdlib"]`, `*.py` files outside test folders and
    site-packages). Nothing is downloaded; it has strong local n-gram structure.
  * "folder": every text file under a directory given on the command line
    (hidden entries and binary files, those with a NUL byte, are skipped).

The split is by a hash of each file's path relative to the corpus root, so it
is the same on every run and machine and does not move when files are added.
The manifest pins exactly which bytes a run saw.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np

from experiments.trainer import durable

log = logging.getLogger("experiments")

SOURCES = ("stdlib", "folder")
# Folder names whose files are tests, not library source.
_TEST_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__"})
_SKIP_TOP = frozenset({"site-packages", "dist-packages"})
_SNIFF_BYTES = 8192


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Which files form a corpus and how they are split.

  Attributes:
    source: "stdlib" or "folder".
    path: root folder for source="folder"; ignored (and may be "") for "stdlib".
    val_fraction: share of files, by path hash, that go to validation.
    max_files: keep only the first files of each split in path order (train:
      max_files, validation: its val_fraction share, at least one); 0 keeps all.
      Tests use it for a tiny, still realistic slice.
  """

  source: str = "stdlib"
  path: str = ""
  val_fraction: float = 0.05
  max_files: int = 0

  def __post_init__(self):
    if self.source not in SOURCES:
      raise ValueError(f"CorpusSpec: source={self.source!r} is not one of {SOURCES}.")
    if self.source == "folder" and not self.path:
      raise ValueError("CorpusSpec: source='folder' needs path=<a folder of text files>.")
    if not 0.0 < self.val_fraction < 1.0:
      raise ValueError(f"CorpusSpec: val_fraction={self.val_fraction} must be in (0, 1).")
    if self.max_files < 0:
      raise ValueError(f"CorpusSpec: max_files={self.max_files} must be >= 0.")


@dataclasses.dataclass(frozen=True)
class Corpus:
  """The files of both splits, read into memory as uint8 arrays (path order)."""

  root: str
  train_paths: tuple[str, ...]
  val_paths: tuple[str, ...]
  train_docs: tuple[np.ndarray, ...]
  val_docs: tuple[np.ndarray, ...]
  manifest: dict

  @property
  def train_bytes(self) -> int:
    return int(sum(d.size for d in self.train_docs))

  @property
  def val_bytes(self) -> int:
    return int(sum(d.size for d in self.val_docs))


def corpus_root(spec: CorpusSpec) -> Path:
  if spec.source == "stdlib":
    return Path(sysconfig.get_paths()["stdlib"]).resolve()
  root = Path(spec.path).expanduser().resolve()
  if not root.is_dir():
    raise FileNotFoundError(f"data.path={spec.path!r} is not a folder.")
  return root


def list_files(spec: CorpusSpec) -> list[str]:
  """Relative paths (POSIX form, sorted) of the corpus files."""
  root = corpus_root(spec)
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    rel_dir = Path(dirpath).relative_to(root)
    # Prune in place so os.walk does not descend into skipped folders.
    dirnames[:] = [d for d in dirnames if _keep_dir(spec, rel_dir, d)]
    for name in filenames:
      if name.startswith("."):
        continue
      if spec.source == "stdlib" and not name.endswith(".py"):
        continue
      rel = (rel_dir / name).as_posix()
      if spec.source == "folder" and not _is_text(root / rel):
        continue
      found.append(rel)
  if not found:
    raise FileNotFoundError(f"no text files found under {root} (source={spec.source!r}).")
  return sorted(found)


def _keep_dir(spec: CorpusSpec, rel_dir: Path, name: str) -> bool:
  if name.startswith("."):
    return False
  if spec.source == "stdlib":
    return name not in _TEST_DIRS and not (rel_dir == Path(".") and name in _SKIP_TOP)
  return True


def _is_text(path: Path) -> bool:
  if not path.is_file():
    return False
  with open(path, "rb") as f:
    return b"\0" not in f.read(_SNIFF_BYTES)


def is_validation(rel_path: str, val_fraction: float) -> bool:
  """Stable split: the first 8 bytes of sha256(path) as a fraction of 2**64."""
  digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") < val_fraction * 2.0**64


def split_files(paths: list[str], spec: CorpusSpec) -> tuple[list[str], list[str]]:
  train = [p for p in paths if not is_validation(p, spec.val_fraction)]
  val = [p for p in paths if is_validation(p, spec.val_fraction)]
  if spec.max_files:
    train = train[: spec.max_files]
    val = val[: max(1, math.ceil(spec.max_files * spec.val_fraction))]
  if not train or not val:
    raise ValueError(
        f"corpus split is empty (train {len(train)} files, validation {len(val)}); "
        f"raise data.val_fraction={spec.val_fraction} or use more files.")
  return train, val


def load_corpus(spec: CorpusSpec) -> Corpus:
  """Lists, splits and reads the corpus, and builds its manifest."""
  root = corpus_root(spec)
  train_paths, val_paths = split_files(list_files(spec), spec)
  read = lambda rel: np.frombuffer((root / rel).read_bytes(), dtype=np.uint8)
  train_docs = tuple(read(p) for p in train_paths)
  val_docs = tuple(read(p) for p in val_paths)
  manifest = _manifest(spec, root, train_paths, train_docs, val_paths, val_docs)
  return Corpus(str(root), tuple(train_paths), tuple(val_paths), train_docs, val_docs, manifest)


def _manifest(spec, root, train_paths, train_docs, val_paths, val_docs) -> dict:
  """File list hash (sorted paths and byte counts), content hash, per-file bytes."""
  entries = sorted(
      [(p, int(d.size), "train") for p, d in zip(train_paths, train_docs, strict=True)]
      + [(p, int(d.size), "validation") for p, d in zip(val_paths, val_docs, strict=True)])
  list_hash = hashlib.sha256()
  for path, size, split in entries:
    list_hash.update(f"{path}\t{size}\t{split}\n".encode())
  docs = dict(zip(train_paths, train_docs, strict=True)) | dict(
      zip(val_paths, val_docs, strict=True))
  content_hash = hashlib.sha256()
  for path, _, _ in entries:
    content_hash.update(docs[path].tobytes())
  return {
      "source": spec.source,
      "root": str(root),
      "python": sys.version.split()[0],
      "val_fraction": spec.val_fraction,
      "max_files": spec.max_files,
      "file_list_sha256": list_hash.hexdigest(),
      "content_sha256": content_hash.hexdigest(),
      "train_files": len(train_paths),
      "val_files": len(val_paths),
      "train_bytes": int(sum(d.size for d in train_docs)),
      "val_bytes": int(sum(d.size for d in val_docs)),
      "files": [{"path": p, "bytes": s, "split": sp,
                 "sha256": hashlib.sha256(docs[p].tobytes()).hexdigest()}
                for p, s, sp in entries],
  }


MANIFEST = "corpus_manifest.json"


class CorpusChangedError(ValueError):
  """A resumed run would read another corpus than the one its checkpoints saw."""


def write_manifest(corpus: Corpus, workdir: str | os.PathLike) -> Path:
  """Writes `corpus_manifest.json` into the run directory (atomically) and returns its path."""
  path = Path(workdir) / MANIFEST
  path.parent.mkdir(parents=True, exist_ok=True)
  return durable.write_text(path, json.dumps(corpus.manifest, indent=1) + "\n")


def _digest(manifest: dict) -> tuple:
  return manifest.get("file_list_sha256"), manifest.get("content_sha256")


def _names(paths: list[str], limit: int = 3) -> str:
  shown = ", ".join(paths[:limit])
  return shown + (f", ... ({len(paths) - limit} more)" if len(paths) > limit else "")


def describe_change(old: dict, new: dict) -> str:
  """What differs between two manifests: files added / removed / edited, or settings."""
  before = {f["path"]: f for f in old.get("files", [])}
  after = {f["path"]: f for f in new.get("files", [])}
  added = sorted(set(after) - set(before))
  removed = sorted(set(before) - set(after))
  edited = sorted(p for p in set(before) & set(after)
                  if before[p].get("bytes") != after[p].get("bytes")
                  or before[p].get("split") != after[p].get("split")
                  or ("sha256" in before[p] and before[p]["sha256"] != after[p].get("sha256")))
  parts = [f"{len(paths)} file(s) {what} ({_names(paths)})"
           for what, paths in (("added", added), ("removed", removed), ("edited", edited))
           if paths]
  for key in ("root", "source", "val_fraction", "max_files"):
    if old.get(key) != new.get(key):
      parts.append(f"data {key} {old.get(key)!r} -> {new.get(key)!r}")
  return "; ".join(parts) or "file contents changed"


def saved_steps(workdir: str | os.PathLike) -> list[int]:
  """The checkpoint steps on disk in a run directory (`<workdir>/checkpoints/<step>`)."""
  directory = Path(workdir) / "checkpoints"
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def record_manifest(corpus: Corpus, workdir: str | os.PathLike, *,
                    allow_change: bool = False) -> Path:
  """Writes the run's manifest; on resume, refuses a corpus that differs from the one
  the checkpoints saw (one line naming what changed) unless `allow_change`
  (`data.allow_corpus_change`), which keeps the old manifest as
  `corpus_manifest.<step>.json` (step: the newest checkpoint it covered) and logs
  the change. A run with no checkpoint yet writes the manifest afresh."""
  path = Path(workdir) / MANIFEST
  steps = saved_steps(workdir)
  if steps and path.is_file():
    try:
      old = json.loads(path.read_text())
    except (OSError, ValueError):
      old = {}
    if _digest(old) != _digest(corpus.manifest):
      what = describe_change(old, corpus.manifest)
      if not allow_change:
        raise CorpusChangedError(
            f"data: the corpus differs from the one this run's checkpoints (up to step "
            f"{steps[-1]}) were trained on: {what}. Resume on the same corpus, use a new "
            "--workdir, or pass --config.data.allow_corpus_change=true to continue on the "
            "new corpus (the old manifest is kept).")
      kept = path.with_name(f"corpus_manifest.{steps[-1]}.json")
      os.replace(path, kept)
      log.warning("data: the corpus changed after step %d (%s); allowed by "
                  "data.allow_corpus_change, the old manifest is kept in %s.",
                  steps[-1], what, kept.name)
  return write_manifest(corpus, workdir)


def corpus_spec(config) -> CorpusSpec:
  """The corpus an experiment config's `data` block names: data.path empty -> the
  embedded standard-library corpus, else that folder."""
  d = config.data
  return CorpusSpec(source="folder" if d.path else "stdlib", path=d.path,
                    val_fraction=d.val_fraction, max_files=d.max_files)
