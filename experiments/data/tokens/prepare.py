"""Tokenize text inputs once into memory-mapped shards (experiments/data/tokens/format.py).

    prepare("fineweb/*.parquet", "tok/tokenizer.json", "data/fw", workers=8)

Each input file becomes one shard, written by one of `workers` processes. A
finished shard has a done-record holding its source's size, mtime and sha256
and its own file digests; a rerun (after a kill, or with more inputs) keeps
every shard whose record still matches its source and settings and redoes the
rest, so shards come out byte-identical to a run that was never interrupted.
`manifest.json` is written last, when every shard is done.

The validation split is by document: a document is validation when the first
8 bytes of the sha256 of its UTF-8 text, read as a fraction of 2**64, are below
`val_fraction` (the same document lands in the same split on every run).

`out` is a new or empty directory, or one prepare-data wrote (output_dir.py): it never writes
among other files (a model checkpoint, another tokenizer's folder), and it
replaces a `tokenizer.json` only when that file is its own (the tokenizer of the
directory's manifest or shards) or the same tokenizer. One run at a time writes
into `out` (an flock on `out/.lock`; a second run is refused at once). Nothing
under `out` is read as input (experiments/data/tokens/sources.py). Workers die
with the process that started them (a kill -9 of it leaves no orphan writing
shards).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from experiments.data.tokens import format as fmt
from experiments.data.tokens.format import TokenDataError
from experiments.data.tokens.output_dir import check_out, locked, remove_stale_tmp
from experiments.data.tokens.sources import (
    BadText,
    documents,
    first_line_is_json_object,
    kind_of,
    list_inputs,
)
from experiments.data.tokens.tokenizer import FILE as TOKENIZER_FILE
from experiments.data.tokens.tokenizer import (
    FORCE_AFTER,
    Encoder,
    TokenizerInfo,
    describe,
)
from experiments.trainer import durable

log = logging.getLogger("experiments")

VAL_FRACTION = 0.01
_CHUNK_DOCS = 256
_CHUNK_BYTES = 8 << 20   # one encode call's documents: at most this many bytes (or one)
# What prepare-data writes under its directory (temporary names included).
_PR_SET_PDEATHSIG = 1
_CONVENTION = ("each document: its tokens (add_special_tokens=False), then eos if the "
               "tokenizer has one; no bos")
_SPLIT_RULE = "sha256(document UTF-8)[:8] big-endian < val_fraction * 2**64 -> validation"


def is_validation_doc(data: bytes, val_fraction: float) -> bool:
  return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") < val_fraction * 2.0**64


def _settings(info: TokenizerInfo, text_field: str, val_fraction: float,
              on_bad_utf8: str) -> dict:
  return {"tokenizer_sha256": info.sha256, "text_field": text_field,
          "val_fraction": val_fraction, "on_bad_utf8": on_bad_utf8,
          "format_version": fmt.FORMAT_VERSION}


_ENCODERS: dict[str, Encoder] = {}


def _encoder(info: TokenizerInfo) -> Encoder:
  """One loaded tokenizer per worker process."""
  if info.sha256 not in _ENCODERS:
    _ENCODERS[info.sha256] = Encoder(info)
  return _ENCODERS[info.sha256]


def _chunks(items: Iterator[bytes], size: int,
            max_bytes: int = _CHUNK_BYTES) -> Iterator[list[bytes]]:
  """Lists of up to `size` documents and `max_bytes` bytes (a longer document alone):
  one encode call's worth, so memory does not grow with a file of long documents."""
  chunk, held = [], 0
  for item in items:
    if chunk and held + len(item) > max_bytes:
      yield chunk
      chunk, held = [], 0
    chunk.append(item)
    held += len(item)
    if len(chunk) == size:
      yield chunk
      chunk, held = [], 0
  if chunk:
    yield chunk


def _finished(out: Path, index: int, source: str, settings: dict) -> dict | None:
  """The done-record of shard `index` if it still describes `source` under `settings`."""
  record = fmt.read_done(out, index)
  if not record or record.get("source") != source or record.get("settings") != settings:
    return None
  if not all(fmt.part_path(out, index, p).is_file() for p in fmt.PARTS):
    return None
  stat = os.stat(source)
  if (record["source_bytes"], record["source_mtime_ns"]) == (stat.st_size, stat.st_mtime_ns):
    return record
  return record if fmt.file_sha256(Path(source)) == record["source_sha256"] else None


# Tokens written so far, shared with the parent for its progress line (a
# multiprocessing Value set by `_init_counter`; None: nobody is counting).
_COUNTER = None
_ON_COUNT = None   # in-process runs: redraws the progress line


def _init_counter(counter, on_count=None) -> None:
  global _COUNTER, _ON_COUNT
  _COUNTER, _ON_COUNT = counter, on_count


def _init_worker(counter, parent: int) -> None:
  """A worker's initializer: counts tokens, and dies with `parent` (the prepare
  process): a kill -9 of it must not leave workers writing shards under a rerun."""
  if sys.platform.startswith("linux"):
    try:   # the kernel kills us when the parent dies
      ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))
    except (OSError, AttributeError):
      pass
  if os.getppid() != parent:   # it died before prctl took effect
    _die()
  # Elsewhere (or should prctl fail): notice the re-parenting within a second.
  threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
  _init_counter(counter)


def _watch_parent(parent: int) -> None:
  while os.getppid() == parent:
    time.sleep(1.0)
  _die()


def _die() -> None:
  """Ends this worker process (only ever a pool worker of `prepare`, never the user's
  interpreter) the way its parent went: by SIGKILL, nothing flushed or cleaned up."""
  os.kill(os.getpid(), signal.SIGKILL)


def _count(tokens: int) -> None:
  if _COUNTER is not None:
    with _COUNTER.get_lock():
      _COUNTER.value += tokens
  if _ON_COUNT is not None:
    _ON_COUNT()


def make_shard(out: str, index: int, source: str, info: TokenizerInfo,
               settings: dict) -> dict:
  """Tokenizes one input file into shard `index` (or keeps it, if already done)."""
  out = Path(out)
  if (record := _finished(out, index, source, settings)) is not None:
    return record | {"kept": True}
  stat = os.stat(source)
  source_sha256 = fmt.file_sha256(Path(source))
  dtype = fmt.token_dtype(info.vocab_size)
  bad = BadText(settings["on_bad_utf8"])
  encoder = _encoder(info)
  # An older record must not outlive the files it described while they are rewritten.
  fmt.done_path(out, index).unlink(missing_ok=True)
  paths = {p: fmt.part_path(out, index, p) for p in fmt.PARTS}
  tmp = {p: fmt.tmp_path(path) for p, path in paths.items()}
  try:
    record = _write_shard(out, index, source, info, settings, tmp, paths, bad, encoder,
                          source_sha256, stat, dtype)
  except BaseException:
    for path in tmp.values():   # this writer's own; a killed one's go at the next run
      path.unlink(missing_ok=True)
    raise
  return record | {"kept": False}


def _write_shard(out: Path, index: int, source: str, info: TokenizerInfo, settings: dict,
                 tmp: dict, paths: dict, bad, encoder, source_sha256: str, stat,
                 dtype) -> dict:
  """make_shard's writes: the parts under temporary names, fsynced, renamed, the folder
  fsynced, then the done-record."""
  offsets, val = [0], []
  forced = encoder.forced_cuts
  tokens_hash = hashlib.sha256()
  val_tokens = 0
  with fmt.naming_full_disk(paths["tokens"], out), open(tmp["tokens"], "wb") as f:
    for chunk in _chunks(documents(source, settings["text_field"], bad), _CHUNK_DOCS):
      for data, ids in zip(chunk, encoder.encode(chunk), strict=True):
        if ids.size and int(ids.max()) >= info.vocab_size:
          raise TokenDataError(f"{source}: the tokenizer produced id {int(ids.max())} "
                               f">= its vocabulary size {info.vocab_size}.")
        block = ids.astype(dtype).tobytes()
        f.write(block)
        tokens_hash.update(block)
        offsets.append(offsets[-1] + ids.size)
        is_val = is_validation_doc(data, settings["val_fraction"])
        val.append(is_val)
        val_tokens += ids.size if is_val else 0
      _count(offsets[-1] - offsets[-1 - len(chunk)])
    f.flush()
    os.fsync(f.fileno())
  arrays = {"offsets": np.asarray(offsets, fmt.OFFSET_DTYPE),
            "val": np.asarray(val, fmt.VAL_DTYPE)}
  for part, array in arrays.items():
    with fmt.naming_full_disk(paths[part], out), open(tmp[part], "wb") as f:
      f.write(array.tobytes())
      f.flush()
      os.fsync(f.fileno())
  for part in fmt.PARTS:
    os.replace(tmp[part], paths[part])
  durable.sync_dir(paths["tokens"].parent)   # the renames, before the done-record
  if encoder.forced_cuts > forced:   # a worker's warning goes to stderr as it is
    log.warning("prepare-data: %s: cut %d time(s) inside a word, in stretches of over %d "
                "characters without whitespace (to bound memory); the ids at those cuts may "
                "differ from encoding the document in one call.", source,
                encoder.forced_cuts - forced, FORCE_AFTER * encoder.piece_chars)
  record = {
      "index": index, "source": source, "source_sha256": source_sha256,
      "source_bytes": stat.st_size, "source_mtime_ns": stat.st_mtime_ns,
      "settings": settings, "dtype": dtype.str, "docs": len(val), "tokens": offsets[-1],
      "val_docs": int(sum(val)), "val_tokens": int(val_tokens),
      "skipped_bad_utf8": bad.count, "tokens_sha256": tokens_hash.hexdigest(),
      "offsets_sha256": hashlib.sha256(arrays["offsets"].tobytes()).hexdigest(),
      "val_sha256": hashlib.sha256(arrays["val"].tobytes()).hexdigest(),
  }
  # Renamed last: only now does the shard count as done.
  with fmt.naming_full_disk(fmt.done_path(out, index), out):
    fmt.write_json_atomic(fmt.done_path(out, index), record)
  return record


class _Progress:
  """Files done, new tokens, tokens/s: one line on stderr, redrawn at most every second
  on a terminal, else written every `_EVERY_S` seconds, and at the end."""

  _EVERY_S = 30.0

  def __init__(self, total: int, enabled: bool, counter):
    self.total, self.enabled, self.counter, self.files = total, enabled, counter, 0
    self.start = self.shown = time.perf_counter()
    self.tty = enabled and sys.stderr.isatty()
    self.ended = False   # the last line is written once

  def file_done(self) -> None:
    self.files += 1
    self.show()

  def show(self) -> None:
    now, last = time.perf_counter(), self.files == self.total
    every = 1.0 if self.tty else self._EVERY_S
    if not self.enabled or self.ended or not (last or now - self.shown >= every):
      return
    self.shown, self.ended = now, last
    tokens = self.counter.value
    line = (f"prepare-data: {self.files}/{self.total} files, {tokens:,} new tokens, "
            f"{tokens / max(now - self.start, 1e-9):,.0f} tokens/s")
    sys.stderr.write(("\r\x1b[K" + line + ("\n" if last else "")) if self.tty else line + "\n")
    sys.stderr.flush()


def prepare(inputs: str, tokenizer: str, out: str, *, text_field: str = "text",
            workers: int = 1, on_bad_utf8: str = "skip", val_fraction: float = VAL_FRACTION,
            progress: bool = True) -> dict:
  """Tokenizes `inputs` (files, folders, globs; comma-separated) with `tokenizer`
  ("bytes", a tokenizer.json or a directory holding one) into `out`; returns the
  manifest. See the module docstring for resuming, the split and what `out` may hold."""
  if not 0.0 < val_fraction < 1.0:
    raise TokenDataError(f"val_fraction={val_fraction} must be in (0, 1).")
  if int(workers) < 1:
    raise TokenDataError(f"--workers={workers} must be >= 1.")
  BadText(on_bad_utf8)   # refuses an unknown mode before any work
  root = Path(out).expanduser()
  info = describe(tokenizer)
  sources = list_inputs(inputs, exclude=root)
  check_out(root, out, info)
  _warn_json_lines(sources)
  settings = _settings(info, text_field, val_fraction, on_bad_utf8)
  root.mkdir(parents=True, exist_ok=True)
  with locked(root, out):
    remove_stale_tmp(root)
    (root / fmt.SHARDS).mkdir(exist_ok=True)
    records = _make_shards(root, sources, info, settings, int(workers), progress)
    manifest = _manifest(info, settings, records)
    if manifest["docs"] == 0:
      skipped = manifest["skipped_bad_utf8"]
      why = (f": all {skipped} document(s) were skipped as not UTF-8 text "
             "(--on_bad_utf8=skip; pass --on_bad_utf8=error to name the first)"
             if skipped else "")
      raise TokenDataError(f"--input={inputs!r}: the {len(sources)} input file(s) hold no "
                           f"document{why}.")
    if manifest["skipped_bad_utf8"]:
      log.warning("prepare-data: skipped %d document(s) that are not UTF-8 text.",
                  manifest["skipped_bad_utf8"])
    with fmt.naming_full_disk(root / TOKENIZER_FILE, out):
      if info.path:   # the data directory carries its tokenizer (runs copy it from here)
        durable.copy_file(info.path, root / TOKENIZER_FILE)
      else:   # "bytes": a tokenizer.json of an earlier run here would be read as this data's
        (root / TOKENIZER_FILE).unlink(missing_ok=True)
    with fmt.naming_full_disk(root / fmt.MANIFEST, out):
      fmt.write_json_atomic(root / fmt.MANIFEST, manifest)
  return manifest


def _make_shards(root: Path, sources: list[str], info: TokenizerInfo, settings: dict,
                 workers: int, progress: bool) -> list[dict]:
  # spawn: the caller may hold jax's or the tokenizer's threads, which fork would copy.
  context = multiprocessing.get_context("spawn")
  counter = context.Value("q", 0)
  bar = _Progress(len(sources), progress, counter)
  records: list[dict | None] = [None] * len(sources)
  if workers == 1:
    _init_counter(counter, bar.show)
    try:
      for i, source in enumerate(sources):
        records[i] = make_shard(str(root), i, source, info, settings)
        bar.file_done()
    finally:
      _init_counter(None)
    return records
  with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context,
                                              initializer=_init_worker,
                                              initargs=(counter, os.getpid())) as pool:
    futures = {pool.submit(make_shard, str(root), i, s, info, settings): i
               for i, s in enumerate(sources)}
    pending = set(futures)
    while pending:   # wake every second to redraw the line between files
      done, pending = concurrent.futures.wait(
          pending, timeout=1.0, return_when=concurrent.futures.FIRST_COMPLETED)
      for future in done:
        records[futures[future]] = future.result()
        bar.file_done()
      bar.show()
  return records


def _warn_json_lines(sources: list[str], command: str = "prepare-data") -> None:
  """A plain-text input whose first line is a JSON object is probably JSON lines under
  another name (`data.json`): it is still read as one document, with a warning."""
  suspects = [s for s in sources if kind_of(s) == "text" and first_line_is_json_object(s)]
  if suspects:
    more = f" (and {len(suspects) - 1} more)" if len(suspects) > 1 else ""
    log.warning("%s: %s%s is read as one plain-text document, but its first line is a "
                "JSON object; if it holds JSON lines, rename it to .jsonl (one document per "
                "line).", command, suspects[0], more)


def _manifest(info: TokenizerInfo, settings: dict, records: list[dict]) -> dict:
  shard_keys = ("index", "source", "dtype", "docs", "tokens", "val_docs", "val_tokens",
                "tokens_sha256", "offsets_sha256", "val_sha256")
  shards = [{k: r[k] for k in shard_keys} for r in records]
  total = lambda key: int(sum(r[key] for r in records))
  return {
      "format_version": fmt.FORMAT_VERSION,
      "tokenizer": info.to_json(),
      "convention": _CONVENTION,
      "split": {"rule": _SPLIT_RULE, "val_fraction": settings["val_fraction"]},
      "text_field": settings["text_field"],
      "on_bad_utf8": settings["on_bad_utf8"],
      "sources": [{"path": r["source"], "sha256": r["source_sha256"],
                   "bytes": r["source_bytes"], "docs": r["docs"],
                   "skipped_bad_utf8": r["skipped_bad_utf8"]} for r in records],
      "shards": shards,
      "shards_sha256": hashlib.sha256(json.dumps(shards, sort_keys=True).encode()).hexdigest(),
      "docs": total("docs"), "tokens": total("tokens"),
      "val_docs": total("val_docs"), "val_tokens": total("val_tokens"),
      "train_docs": total("docs") - total("val_docs"),
      "train_tokens": total("tokens") - total("val_tokens"),
      "skipped_bad_utf8": total("skipped_bad_utf8"),
  }


def tokenizer_texts(inputs: str = "", *, text_field: str = "text",
                    val_fraction: float = VAL_FRACTION,
                    exclude: str | os.PathLike | None = None) -> Iterator[str]:
  """The training-split texts a tokenizer is trained on: of `inputs`, or ("" or
  "stdlib") of the embedded standard-library corpus (experiments/data/corpus.py).
  Documents that are not UTF-8 are skipped. `exclude`: the tokenizer file being
  written, never read as input (a rerun into a folder of the inputs)."""
  if inputs in ("", "stdlib"):
    from experiments.data.corpus import CorpusSpec, corpus_root, list_files

    spec = CorpusSpec()
    root = corpus_root(spec)
    paths = [str(root / rel) for rel in list_files(spec)]
  else:
    paths = list_inputs(inputs, exclude=exclude)
    _warn_json_lines(paths, "train-tokenizer")
  bad = BadText("skip")
  for path in paths:
    for data in documents(path, text_field, bad):
      if not is_validation_doc(data, val_fraction):
        yield data.decode("utf-8")
