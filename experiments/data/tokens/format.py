"""The on-disk format of a tokenized corpus: shards, done-records, the manifest.

A data directory written by `prepare` (experiments/data/tokens/prepare.py):

    manifest.json            written last: format version, tokenizer, EOS/BOS
                             convention, sources, shards, counts, the split rule
    tokenizer.json           a copy of the tokenizer (none for "bytes")
    shards/NNNNN.tokens      every document's token ids, concatenated (flat
                             little-endian uint16, or uint32 past 65,536 ids)
    shards/NNNNN.offsets     int64 [docs + 1]: document d is tokens[o[d]:o[d+1]]
    shards/NNNNN.val         uint8 [docs]: 1 where the document is validation
    shards/NNNNN.done.json   the shard's source, counts and file digests
    .lock                    held (flock) by the prepare-data run writing here

Shard NNNNN holds the documents of source file NNNNN (sorted input order). Its
files are written under temporary names and renamed when complete; the
done-record is renamed last, so a shard without one is unfinished, whatever
files it has, and a rerun redoes it. Temporary names carry the writer's pid
(`NAME.<pid>.tmp`), so two processes never write one file. Readers map the files
with `np.memmap`: host memory does not grow with the corpus.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from experiments.trainer import durable

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARDS = "shards"
PARTS = ("tokens", "offsets", "val")
LOCK = ".lock"
OFFSET_DTYPE = np.dtype("<i8")
VAL_DTYPE = np.dtype("u1")


class TokenDataError(ValueError):
  """A one-line problem with token data or its inputs (the CLI prints `error: ...`, exit 2)."""


def token_dtype(vocab_size: int) -> np.dtype:
  """The narrowest unsigned dtype that holds ids 0..vocab_size-1."""
  return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def shard_name(index: int) -> str:
  return f"{index:05d}"


def part_path(out: Path, index: int, part: str) -> Path:
  return Path(out) / SHARDS / f"{shard_name(index)}.{part}"


def done_path(out: Path, index: int) -> Path:
  return Path(out) / SHARDS / f"{shard_name(index)}.done.json"


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(chunk):
      digest.update(block)
  return digest.hexdigest()


def tmp_path(path: Path) -> Path:
  """This process's temporary name for `path` (renamed onto it when complete)."""
  path = Path(path)
  return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def write_json_atomic(path: Path, value) -> None:
  """Writes JSON under a temporary name, then renames: a reader sees all or nothing,
  after a kill or a power cut (the folder is fsynced after the rename)."""
  tmp = tmp_path(path)
  with open(tmp, "w") as f:
    f.write(json.dumps(value, indent=1, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  durable.sync_dir(Path(path).parent)


def read_done(out: Path, index: int) -> dict | None:
  """The shard's done-record, or None if the shard is unfinished."""
  path = done_path(out, index)
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def read_manifest(path: str | os.PathLike) -> dict:
  """The manifest of a data directory, refusing one this code cannot read."""
  root = Path(path)
  file = root / MANIFEST
  if not file.is_file():
    hint = (" (an unfinished prepare-data run: rerun it to finish)"
            if (root / SHARDS).is_dir() else "")
    raise TokenDataError(f"data.path={str(path)!r} holds no {MANIFEST}{hint}; write one "
                         "with `lngram-exp prepare-data --out=...`.")
  try:
    manifest = json.loads(file.read_text())
  except ValueError as e:
    raise TokenDataError(f"{file} is not valid JSON ({e}).") from None
  version = manifest.get("format_version") if isinstance(manifest, dict) else None
  if not isinstance(version, int) or "shards" not in manifest:
    raise TokenDataError(
        f"{file} is not a prepare-data manifest (no format_version and shards); this "
        "directory was not written by `lngram-exp prepare-data`.")
  if version > FORMAT_VERSION:
    raise TokenDataError(
        f"{file} has format version {version!r}, newer than this code reads "
        f"({FORMAT_VERSION}); upgrade lngram-jax or prepare the data again.")
  return manifest


def check_tokenizer(manifest: dict, sha256: str, vocab_size: int | None = None,
                    *, what: str = "the model's") -> None:
  """Refuses token data written with another tokenizer than `sha256`."""
  tok = manifest["tokenizer"]
  if tok["sha256"] != sha256:
    raise TokenDataError(
        f"the data was tokenized with tokenizer {tok['sha256'][:12]} (vocabulary "
        f"{tok['vocab_size']}), not {what} {sha256[:12]}"
        + (f" (vocabulary {vocab_size})" if vocab_size is not None else "")
        + "; prepare the data with that tokenizer or train on matching data.")


def open_shard(root: Path, shard: dict, *, verify: bool = True) -> dict:
  """Memory-maps one shard's arrays; `verify`: check every file's digest first."""
  index, dtype = shard["index"], np.dtype(shard["dtype"])
  arrays = {}
  for part, part_dtype in zip(PARTS, (dtype, OFFSET_DTYPE, VAL_DTYPE), strict=True):
    path = part_path(root, index, part)
    if not path.is_file():
      raise TokenDataError(f"shard {shard_name(index)}: {path.name} is missing from "
                           f"{root / SHARDS}.")
    if verify and file_sha256(path) != shard[f"{part}_sha256"]:
      raise TokenDataError(
          f"shard {shard_name(index)}: {path.name} does not match the digest in its "
          f"manifest (the file changed or is damaged); prepare the data again.")
    size = path.stat().st_size // part_dtype.itemsize
    # An empty file cannot be mapped; an empty array stands in.
    arrays[part] = (np.memmap(path, dtype=part_dtype, mode="r") if size
                    else np.zeros(0, part_dtype))
  if arrays["offsets"].size != shard["docs"] + 1 or arrays["val"].size != shard["docs"]:
    raise TokenDataError(f"shard {shard_name(index)}: its arrays hold a different document "
                         f"count than its manifest ({shard['docs']}).")
  if "tokens" in shard and arrays["tokens"].size != shard["tokens"]:   # unverified: the size
    raise TokenDataError(f"shard {shard_name(index)}: {PARTS[0]} holds "
                         f"{arrays['tokens'].size} tokens, not its manifest's {shard['tokens']} "
                         "(a write cut short?); prepare the data again.")
  return arrays


@contextlib.contextmanager
def naming_full_disk(path, out):
  """A full disk (or quota) while writing `path` into the data directory --out=`out`:
  one line naming both, instead of a bare "[Errno 28]" naming no file."""
  try:
    yield
  except OSError as e:
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
      raise
    raise TokenDataError(f"{path}: {os.strerror(e.errno).lower()} (prepare-data --out={out}); "
                         "free space there or pass an --out on a disk with room (a rerun "
                         "keeps the shards already done).") from None
