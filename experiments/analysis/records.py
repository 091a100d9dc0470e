"""Position records: what the analyses read about sampled positions of an LM run.

A position is a byte of a run on a byte corpus, a token of a run on token data (below).
For each sampled position P of one split ("reference": a seeded sample of
the corpus' training files; "heldout": its validation files), and each Lngram
layer l (`model.config.memory_layers`): the layer's input h (the residual
stream before its memory slot), the router logits z (pre-threshold, the
"Q_route" control) and the codes; the file (document) id; nuisance and
surface features; and the semantic targets of `targets` at three levels.

Files run through the model one at a time (layer_reads.py), in windows of `seq_len` bytes
([k·seq_len, (k+1)·seq_len), never packed with another file); a window runs
only if it holds a sampled position. The sample is drawn from the files and the
seed alone (not the model), so every checkpoint of a run gets the same
positions.

Nuisance stratum (position only, one int): column bucket × line-index bucket ×
row-position bucket, with the bucket edges below (np.digitize: a value v is in
bucket #{edges <= v}):
  column       bytes since the line start: 0 | 1-3 | 4-7 | 8-15 | 16-31 | 32-63 | 64+
               (4-space indentation levels first, then doubling)
  line index   0-based line of the file: 0-9 | 10-99 | 100-999 | 1000+
  row position offset within the model's window (the training row): 0-7 | 8-31 |
               32-127 | 128-511 | 512+
Surface features: the current byte and the previous byte (-1 at the file start).

Token runs (`TokenDoc`s, experiments/analysis/token_docs.py: the run's training and
validation documents, each its token ids and its text as bytes, every token's byte span
in it). Everything above holds with a token in place of a byte: positions are sampled
uniformly over tokens, windows hold `seq_len` tokens, and
  surface      the current token id and the previous token id (-1 at the document
               start): the surface readers then say how much of a target the token
               ids alone give away (`id_readers`: `surface_byte` reads the current
               token id, `perm_strata="nuisance_byte"` crosses the stratum with it);
  column, line of the token's FIRST byte in the document's text: column counts bytes
               since the line start, as for a byte run (a token starting with a
               newline belongs to the line that newline ends);
  row position the token's offset in its window (tokens);
  targets      per token, from the text's per-byte labels (`targets.token_targets`).
Token data prepared with the "bytes" tokenizer gives exactly the byte run's records.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from experiments.analysis import layer_reads, output
from experiments.analysis import targets as targets_lib

LEVELS = ("local", "statement", "document")
SPLITS = ("reference", "heldout")
COLUMN_EDGES = (1, 4, 8, 16, 32, 64)
LINE_EDGES = (10, 100, 1000)
ROW_EDGES = (8, 32, 128, 512)
N_STRATA = (len(COLUMN_EDGES) + 1) * (len(LINE_EDGES) + 1) * (len(ROW_EDGES) + 1)
N_DOCUMENT_CONCEPTS = 30


@dataclasses.dataclass
class PositionRecords:
  """Per analysed position P (one split: "reference" or "heldout"): a byte, or a token
  of a token run (meta["unit"] is "byte" or "token").

  offsets (int32 [P], the byte (token) offset in the file) and meta (seq_len, seed,
  unit, ...) are extras for readers that go back to the files; synthetic records may
  omit them.
  """

  split: str
  file_ids: np.ndarray          # int32 [P], document id (index into `files`)
  files: list[str]              # relative file paths, by document id
  layers: tuple[int, ...]       # the Lngram layers analysed (model.config.memory_layers)
  h: dict[int, np.ndarray]      # layer -> float32 [P, D], that layer's input (residual stream)
  z: dict[int, np.ndarray]      # layer -> float32 [P, R*M], its router logits (pre-threshold)
  codes: dict[int, np.ndarray]  # layer -> int32 [P, R], the codes (z > 0 bits, little-endian)
  bits: int                     # M
  nuisance: np.ndarray          # int32 [P], the nuisance stratum id (see the module docstring)
  surface: np.ndarray           # int32 [P, 2], current byte and previous byte (-1 at file
                                #   start); a token run: current and previous token id
  targets: dict[str, tuple[list[str], np.ndarray]]
                                # level -> (concept names, bool [P, Z])
  skipped_files: int            # files that did not parse
  offsets: np.ndarray | None = None
  meta: dict = dataclasses.field(default_factory=dict)

  @property
  def num_positions(self) -> int:
    return int(self.file_ids.shape[0])

  def concept_names(self) -> dict[str, list[str]]:
    """level -> concept names; pass it to the held-out `collect_records`."""
    return {level: list(names) for level, (names, _) in self.targets.items()}


class SourceFile(NamedTuple):
  path: str   # relative to the corpus root
  data: bytes


class TokenDoc(NamedTuple):
  """A document of a token run (experiments/analysis/token_docs.py)."""

  path: str             # its name
  ids: np.ndarray       # int32 [N], its token ids (what the model reads)
  data: bytes           # its text
  starts: np.ndarray    # int64 [N], each token's first byte in `data`
  ends: np.ndarray      # int64 [N], the byte after each token's last one (== start: none)


class _Parsed(NamedTuple):
  path: str
  doc: np.ndarray        # what the model reads: uint8 bytes, or int32 token ids
  targets: object        # targets.SourceTargets, per byte or per token of `doc`
  text: tuple | None     # a token document: (its text as uint8 [bytes], starts int64 [N])


def split_files(corpus, *, n_reference: int = 256, n_heldout: int | None = None,
                seed: int = 0, dedup: bool = False) -> tuple[list[SourceFile], list[SourceFile]]:
  """(reference, heldout) files of an `experiments.data.Corpus`.

  reference: `n_reference` training files drawn with `seed` (path order);
  heldout: the validation files (the corpus splits by path hash), all of them
  or `n_heldout` drawn with `seed`. `dedup`: first remove from both splits
  every file whose normalised content occurs in the other (`dedup.py`: the
  codec-table families of the standard library; `removed_duplicates` lists them).
  """
  rng = np.random.default_rng(seed)
  train = list(zip(corpus.train_paths, corpus.train_docs, strict=True))
  val = list(zip(corpus.val_paths, corpus.val_docs, strict=True))
  if dedup:
    drop_ref, drop_held = removed_duplicates(corpus)
    train = [(p, d) for p, d in train if str(p) not in drop_ref]
    val = [(p, d) for p, d in val if str(p) not in drop_held]

  def draw(pairs, n):
    keep = range(len(pairs)) if n is None or n >= len(pairs) else sorted(
        rng.choice(len(pairs), size=n, replace=False).tolist())
    return [SourceFile(pairs[i][0], np.asarray(pairs[i][1], np.uint8).tobytes()) for i in keep]

  return draw(train, n_reference), draw(val, n_heldout)


def removed_duplicates(corpus) -> tuple[set, set]:
  """(training paths, validation paths) that `split_files(dedup=True)` removes."""
  from experiments.data import dedup
  as_bytes = lambda docs: (np.asarray(d, np.uint8).tobytes() for d in docs)  # noqa: E731
  return dedup.cross_split_duplicates(
      zip(corpus.train_paths, as_bytes(corpus.train_docs), strict=True),
      zip(corpus.val_paths, as_bytes(corpus.val_docs), strict=True))


def collect_records(model, files: Sequence, *, split: str, seq_len: int,
                    max_positions: int | None, seed: int, concept_names=None,
                    progress: bool = True, batch_size: int = 16,
                    n_document_concepts: int = N_DOCUMENT_CONCEPTS,
                    max_per_file: int | None = None) -> PositionRecords:
  """Runs a `DecoderLM` over `files` and records `max_positions` sampled positions.

  Args:
    model: the restored `DecoderLM` (its memory layers hold Lngram).
    files: (relative path, bytes or uint8 array) pairs, e.g. from `split_files`, or
      `TokenDoc`s of a token run (`token_docs.split_docs`; then a position is a token).
    split: "reference" or "heldout" (a label).
    seq_len: the window length (the run's data.seq_len).
    max_positions: positions drawn uniformly, without replacement, over the
      bytes (tokens) of the files that parse; None takes every one.
    seed: the sampling seed.
    concept_names: the reference records' `concept_names()` (a dict level ->
      names) or the document-level names alone (a list); None: local and
      statement concepts are the full vocabularies of `targets`, document
      concepts the `n_document_concepts` modules imported by most of `files`.
    progress: print progress lines on stderr.
    batch_size: windows per forward.
    max_per_file: at most this many positions from one file (`sample_positions`).
  """
  if split not in SPLITS:
    raise ValueError(f"collect_records: split={split!r} is not one of {SPLITS}.")
  if not 1 <= seq_len <= model.config.max_len:
    raise ValueError(f"collect_records: seq_len={seq_len} must be in [1, "
                     f"max_len={model.config.max_len}].")
  layers = tuple(model.config.memory_layers)
  if not layers:
    raise ValueError("collect_records: the model has no memory layers to read.")
  for layer in layers:
    if not hasattr(model.blocks[layer].memory, "router_logits"):
      raise ValueError(f"collect_records: layer {layer}'s memory branch "
                       f"({type(model.blocks[layer].memory).__name__}) has no Lngram router.")
  t0 = time.perf_counter()
  parsed, skipped = _parse(files)
  if progress:
    print(f"records[{split}]: {len(parsed)} files parsed, {skipped} skipped "
          f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
  file_ids, offsets = sample_positions([p.doc.size for p in parsed], max_positions, seed,
                                       max_per_file)
  docs = [p.doc for p in parsed]
  tokens = any(p.text is not None for p in parsed)
  nuisance, surface = position_features(docs, file_ids, offsets, seq_len,
                                        texts=[p.text for p in parsed] if tokens else None)
  names = _concept_names(concept_names, [p.targets.imports for p in parsed],
                         n_document_concepts)
  records = PositionRecords(
      split=split, file_ids=file_ids, files=[p.path for p in parsed], layers=layers,
      h={}, z={}, codes={}, bits=layer_reads.memory_bits(model, layers[0]), nuisance=nuisance,
      surface=surface,
      targets=_targets([p.targets for p in parsed], file_ids, offsets, names),
      skipped_files=skipped, offsets=offsets,
      meta={"seq_len": seq_len, "seed": seed, "max_positions": max_positions,
            "unit": "token" if tokens else "byte",
            **({} if max_per_file is None else {"max_per_file": int(max_per_file)})})
  h, z, codes = layer_reads.read_windows(model, docs, file_ids, offsets, seq_len=seq_len,
                                         batch_size=batch_size, progress=progress,
                                         label=split)
  records.h, records.z, records.codes = h, z, codes
  return records


def sample_positions(sizes: Sequence[int], max_positions: int | None, seed: int,
                     max_per_file: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(file_ids, offsets) int32 [P], sorted by file then offset; uniform over the
  positions (bytes, or tokens), `sizes` per file.

  `max_per_file`: no file gives more than this many positions (uniform over the
  bytes, conditioned on the cap: bytes are taken in a seeded random order and a
  file's are skipped once it holds the cap), so one large file cannot dominate
  a split. None: no cap (the sample of earlier analyses, unchanged).
  """
  ends = np.cumsum(np.asarray(sizes, np.int64))
  total = int(ends[-1]) if ends.size else 0
  if max_per_file is not None:
    if max_per_file < 1:
      raise ValueError(f"sample_positions: max_per_file={max_per_file} must be >= 1.")
    order = np.random.default_rng([seed, 3]).permutation(total)
    file_of = np.searchsorted(ends, order, side="right")
    # Rank of each drawn byte among the draws of its file, in draw order.
    by_file = np.argsort(file_of, kind="stable")
    starts = np.searchsorted(file_of[by_file], np.arange(len(ends)))
    rank = np.empty(total, np.int64)
    rank[by_file] = np.arange(total) - starts[file_of[by_file]]
    kept = order[rank < max_per_file]
    flat = np.sort(kept if max_positions is None else kept[:max_positions])
  elif max_positions is None or max_positions >= total:
    flat = np.arange(total, dtype=np.int64)
  else:
    rng = np.random.default_rng(seed)
    flat = np.sort(rng.choice(total, size=max_positions, replace=False))
  file_ids = np.searchsorted(ends, flat, side="right")
  starts = np.concatenate([[0], ends[:-1]]) if ends.size else ends
  return file_ids.astype(np.int32), (flat - starts[file_ids]).astype(np.int32)


def position_features(docs: Sequence[np.ndarray], file_ids: np.ndarray, offsets: np.ndarray,
                      seq_len: int, *, texts: Sequence | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
  """(nuisance stratum int32 [P], surface int32 [P, 2]) of sampled positions.

  `texts`: per token document, (its text as uint8 bytes, each token's first byte
  int64 [N]): columns and lines are then those of the token's first byte in the text
  (the module docstring); None (or a None entry): `docs` are bytes, their own text."""
  column = np.zeros(file_ids.shape, np.int64)
  line = np.zeros(file_ids.shape, np.int64)
  surface = np.full((file_ids.size, 2), -1, np.int32)
  for f in np.unique(file_ids):
    sel = np.flatnonzero(file_ids == f)
    doc, off = docs[f], offsets[sel].astype(np.int64)
    text, at = doc, off
    if texts is not None and texts[f] is not None:
      text, starts = texts[f]
      at = np.asarray(starts, np.int64)[off]
    newlines = np.flatnonzero(text == ord("\n"))
    # Line of byte o = the newlines before it; its line starts after the last one.
    line[sel] = np.searchsorted(newlines, at, side="left")
    prev_nl = np.where(line[sel] > 0, newlines[np.maximum(line[sel] - 1, 0)], -1)
    column[sel] = at - prev_nl - 1
    surface[sel, 0] = doc[off]
    # int32 before the -1: a uint8 where() would wrap it to 255.
    surface[sel, 1] = np.where(off > 0, doc[np.maximum(off - 1, 0)].astype(np.int32), -1)
  return nuisance_strata(column, line, offsets % seq_len), surface


def nuisance_strata(column, line, row_position) -> np.ndarray:
  """The stratum id (int32) of column, line-index and row-position values."""
  c = np.digitize(column, COLUMN_EDGES)
  li = np.digitize(line, LINE_EDGES)
  r = np.digitize(row_position, ROW_EDGES)
  return ((c * (len(LINE_EDGES) + 1) + li) * (len(ROW_EDGES) + 1) + r).astype(np.int32)


def take(records: PositionRecords, index) -> PositionRecords:
  """The records of the positions `index` (an int array or a bool mask over P)."""
  index = np.asarray(index)
  pick = lambda a: None if a is None else a[index]
  return dataclasses.replace(
      records, file_ids=records.file_ids[index],
      h={k: v[index] for k, v in records.h.items()},
      z={k: v[index] for k, v in records.z.items()},
      codes={k: v[index] for k, v in records.codes.items()},
      nuisance=records.nuisance[index], surface=records.surface[index],
      targets={k: (list(n), v[index]) for k, (n, v) in records.targets.items()},
      offsets=pick(records.offsets), meta=dict(records.meta))


# --- persistence ---------------------------------------------------------------------


def save_records(records: PositionRecords, path) -> Path:
  """Writes the records to one .npz (no pickles) and returns its path."""
  path = Path(path)
  meta = {
      "split": records.split, "files": list(records.files), "layers": list(records.layers),
      "bits": int(records.bits), "skipped_files": int(records.skipped_files),
      "concepts": records.concept_names(), "meta": records.meta,
  }
  arrays = {"meta_json": np.asarray(json.dumps(meta)), "file_ids": records.file_ids,
            "nuisance": records.nuisance, "surface": records.surface}
  if records.offsets is not None:
    arrays["offsets"] = records.offsets
  for layer in records.layers:
    arrays[f"h_{layer}"] = records.h[layer]
    arrays[f"z_{layer}"] = records.z[layer]
    arrays[f"codes_{layer}"] = records.codes[layer]
  for level, (_, labels) in records.targets.items():
    arrays[f"targets_{level}"] = labels
  def write(tmp):
    with open(tmp, "wb") as f:   # a file object: np.savez adds no ".npz" to the name
      np.savez(f, **arrays)

  # Atomic: a killed `analyze` never leaves a truncated cache behind.
  return output.atomic_write(path, write)


def load_records(path) -> PositionRecords:
  """Reads what `save_records` wrote."""
  with np.load(Path(path), allow_pickle=False) as npz:
    meta = json.loads(str(npz["meta_json"]))
    layers = tuple(int(x) for x in meta["layers"])
    return PositionRecords(
        split=meta["split"], file_ids=npz["file_ids"], files=list(meta["files"]),
        layers=layers, h={i: npz[f"h_{i}"] for i in layers},
        z={i: npz[f"z_{i}"] for i in layers}, codes={i: npz[f"codes_{i}"] for i in layers},
        bits=int(meta["bits"]), nuisance=npz["nuisance"], surface=npz["surface"],
        targets={level: (list(names), npz[f"targets_{level}"])
                 for level, names in meta["concepts"].items()},
        skipped_files=int(meta["skipped_files"]),
        offsets=npz["offsets"] if "offsets" in npz.files else None, meta=dict(meta["meta"]))


# --- internals -----------------------------------------------------------------------


def _parse(files) -> tuple[list[_Parsed], int]:
  """The files (or token documents) that parse, and the skipped count."""
  parsed, skipped = [], 0
  for item in files:
    if isinstance(item, TokenDoc):
      found = targets_lib.extract_targets(item.data)
      if found is None:
        skipped += 1
        continue
      starts = np.asarray(item.starts, np.int64)
      parsed.append(_Parsed(
          str(item.path), np.asarray(item.ids, np.int32),
          targets_lib.token_targets(found, starts, np.asarray(item.ends, np.int64)),
          (np.frombuffer(item.data, np.uint8), starts)))
      continue
    path, data = item
    doc = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else (
        data.astype(np.uint8, copy=False))
    found = targets_lib.extract_targets(doc.tobytes())
    if found is None:
      skipped += 1
    else:
      parsed.append(_Parsed(str(path), doc, found, None))
  return parsed, skipped


def _concept_names(given, imports_per_file, n_document) -> dict[str, list[str]]:
  names = {"local": list(targets_lib.LOCAL_CONCEPTS),
           "statement": list(targets_lib.STATEMENT_CONCEPTS)}
  if isinstance(given, dict):
    names.update({k: list(v) for k, v in given.items()})
  elif given is not None:
    names["document"] = list(given)
  if "document" not in names:
    # Files importing each module; ties broken by name for a stable order.
    counts = Counter(m for mods in imports_per_file for m in mods)
    names["document"] = [m for m, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                         ][:n_document]
  unknown = set(names) - set(LEVELS)
  if unknown:
    raise ValueError(f"concept_names: unknown levels {sorted(unknown)}; levels are {LEVELS}.")
  return names


def _targets(found, file_ids, offsets, names) -> dict[str, tuple[list[str], np.ndarray]]:
  P = file_ids.size
  local = np.full(P, -1, np.int64)
  statement = np.full(P, -1, np.int64)
  for f in np.unique(file_ids):
    sel = np.flatnonzero(file_ids == f)
    local[sel] = found[f].local[offsets[sel]]
    statement[sel] = found[f].statement[offsets[sel]]

  def one_hot(ids, vocab, level):
    column = {name: i for i, name in enumerate(vocab)}
    out = np.zeros((P, len(names[level])), bool)
    for z, name in enumerate(names[level]):
      if name in column:
        out[:, z] = ids == column[name]
    return out

  doc = np.zeros((P, len(names["document"])), bool)
  for z, module in enumerate(names["document"]):
    has = np.array([module in t.imports for t in found], bool)
    doc[:, z] = has[file_ids] if has.size else False
  return {"local": (names["local"], one_hot(local, targets_lib.LOCAL_CONCEPTS, "local")),
          "statement": (names["statement"],
                        one_hot(statement, targets_lib.STATEMENT_CONCEPTS, "statement")),
          "document": (names["document"], doc)}
