"""The validation set: a capped window of every validation document, packed per document.

The older evaluation read the first `data.eval_batches` batches of the validation
stream in path order: 32 KB of the byte corpus, from two files. Here every
validation document (a file of the byte corpus, a document of token data)
contributes its first `cap` units (bytes or tokens), so no single long file
dominates (on the standard library at cap 32,768: 447 KB from 42 files, the
largest share 7.3%), and the windows are packed one document at a time, so every
row belongs to one document and the evaluation keeps a loss per document
(`doc` of each row): the unit that a document bootstrap resamples.

    windows = validation_windows(docs, names, cap=32768, budget=0)
    batches = validation_batches(windows, seq_len=128, batch_size=16)

`budget` > 0 bounds the total: when the capped windows hold more units, documents
are taken at an even stride over the whole list (spread over every shard or file,
never just the first ones) until the budget is reached.

Deduplicated against training (`data.dedup_validation`, byte corpora): before the
windows are cut, every validation file with a near-duplicate in the training split
(experiments/data/dedup.py's rule: equal hashes of the normalised lines, e.g. the
`encodings/*` codec tables, whose held-out members have twins among the training
files) is left out. What was left out (the files, their count, the units their windows
held, each one's training twins) travels with the names (`DocNames.dedup`) into
`eval_per_doc.json`. Without budget selection the deduplicated set is the full set minus
those documents, so a run evaluated on the full set is scored on the deduplicated one
exactly by summing its per-document losses over the documents kept (`rescore`).
Token data has no such files in its split: the option leaves it unchanged. Rows are those of the
packed training stream restricted to one document: T inputs, their next units as
targets, positions restarting at 0 in every row; a last short row is padded with
segment id 0 and loss_mask 0 (as are padding rows of a last short batch, `doc` -1).
Nothing is random: the same set on every run and machine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from experiments.trainer import durable

PER_DOC_FILE = "eval_per_doc.json"


@dataclasses.dataclass(frozen=True)
class Dedup:
  """The validation files `data.dedup_validation` left out: their names (path order),
  the units their capped windows would have held, and each one's training twins."""

  removed: tuple[str, ...]
  units: int
  twins: dict

  def describe(self) -> dict:
    return {"rule": "experiments/data/dedup.py", "removed": list(self.removed),
            "count": len(self.removed), "units": int(self.units),
            "twins": {name: list(self.twins[name]) for name in self.removed}}


class DocNames(tuple):
  """The validation documents' names (a tuple) with `dedup`: what deduplication
  against training left out (a `Dedup`), or None when the set was not deduplicated."""

  def __new__(cls, names, dedup: Dedup | None = None):
    self = super().__new__(cls, names)
    self.dedup = dedup
    return self


@dataclasses.dataclass(frozen=True)
class Windows:
  """The validation windows: one array per kept document, its name, its full length;
  `dedup`: what deduplication against training left out (None: not deduplicated)."""

  docs: tuple[np.ndarray, ...]
  names: tuple[str, ...]
  full_lengths: tuple[int, ...]
  dedup: Dedup | None = None

  @property
  def units(self) -> int:
    return int(sum(d.size for d in self.docs))

  def largest_share(self) -> float:
    """The largest document's share of the units (0 for an empty set)."""
    return max((d.size for d in self.docs), default=0) / max(self.units, 1)

  def describe(self) -> dict:
    out = {"docs": len(self.docs), "units": self.units,
           "largest_share": round(self.largest_share(), 6), "names": list(self.names)}
    if self.dedup is not None:
      out["dedup"] = self.dedup.describe()
    return out


def validation_windows(docs, names, *, cap: int, budget: int = 0) -> Windows:
  """The first `cap` units of every document that holds a target (two units or more);
  with `budget` > 0, documents at an even stride until the windows hold `budget` units."""
  if cap < 2:
    raise ValueError(f"validation_windows: cap={cap} must be >= 2 (one input, one target).")
  if len(docs) != len(names):
    raise ValueError(f"validation_windows: {len(docs)} documents but {len(names)} names.")
  kept = [(np.asarray(docs[i])[:cap], str(names[i]), len(docs[i])) for i in range(len(docs))
          if len(docs[i]) >= 2]
  if budget and budget > 0:
    total = sum(w.size for w, _, _ in kept)
    if total > budget:
      # Every k-th document, k the smallest stride whose picks fit the budget.
      for stride in range(2, len(kept) + 1):
        pick = kept[::stride]
        if sum(w.size for w, _, _ in pick) <= budget:
          break
      kept = pick
  if not kept:
    raise ValueError(f"validation_windows: no validation document holds two units "
                     f"({len(docs)} validation document(s)); use more validation data (token "
                     "data: rerun prepare-data with a larger --val_fraction; byte data: a "
                     "larger data.val_fraction).")
  docs_, names_, lengths = zip(*kept, strict=True)
  return Windows(tuple(docs_), tuple(names_), tuple(int(n) for n in lengths))


def document_rows(window: np.ndarray, seq_len: int) -> list[dict]:
  """The rows of one document's window: inputs window[r·T : r·T + T], targets shifted by
  one; the last row padded (segment id 0, loss_mask 0)."""
  T = int(seq_len)
  n_targets = window.size - 1
  rows = []
  for start in range(0, n_targets, T):
    real = min(T, n_targets - start)
    inputs = np.zeros(T, np.int32)
    targets = np.zeros(T, np.int32)
    inputs[:real] = window[start:start + real]
    targets[:real] = window[start + 1:start + 1 + real]
    mask = np.zeros(T, np.float32)
    mask[:real] = 1.0
    rows.append({"inputs": inputs, "targets": targets,
                 "segment_ids": (mask > 0).astype(np.int32),
                 "positions": np.where(mask > 0, np.arange(T), 0).astype(np.int32),
                 "loss_mask": mask})
  return rows


def validation_batches(windows: Windows, *, seq_len: int, batch_size: int,
                       max_batches: int | None = None) -> list[dict]:
  """Batches of every window's rows in document order, each row's document index in
  `doc` [B] (-1 on padding rows); at most `max_batches` batches (None: all)."""
  rows, doc_of_row = [], []
  for k, window in enumerate(windows.docs):
    for row in document_rows(window, seq_len):
      rows.append(row)
      doc_of_row.append(k)
  if max_batches is not None:
    rows, doc_of_row = rows[:max_batches * batch_size], doc_of_row[:max_batches * batch_size]
  empty = {k: np.zeros_like(v) for k, v in rows[0].items()}
  batches = []
  for first in range(0, len(rows), batch_size):
    part = rows[first:first + batch_size]
    docs = doc_of_row[first:first + batch_size]
    short = batch_size - len(part)
    batch = {k: np.stack([r[k] for r in part] + [empty[k]] * short) for k in empty}
    batch["doc"] = np.asarray(docs + [-1] * short, np.int32)
    batches.append(batch)
  return batches


def per_doc_bits(nats_D, tokens_D) -> np.ndarray:
  """Bits per unit of each document (NaN where it has no target)."""
  nats_D, tokens_D = np.asarray(nats_D, np.float64), np.asarray(tokens_D, np.float64)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(tokens_D > 0, nats_D / tokens_D / np.log(2.0), np.nan)


def dedups(data_config) -> bool:
  """Whether a data config asks for validation deduplicated against training: its
  `data.dedup_validation` (absent: runs saved before it, False) on a byte corpus."""
  return (bool(data_config.get("dedup_validation", False))
          and data_config.get("kind", "bytes") == "bytes")


def near_duplicates(names, docs, train_names, train_docs) -> dict[str, tuple[str, ...]]:
  """{validation name: its training twins} of the validation documents whose content
  hash (experiments/data/dedup.py: normalised lines) equals a training file's; files
  with no normalised line share nothing (`dedup.cross_split_duplicates`' rule)."""
  from experiments.data import dedup

  by_hash: dict[str, list[str]] = {}
  for name, doc in zip(train_names, train_docs, strict=True):
    by_hash.setdefault(dedup.content_hash(bytes(np.asarray(doc))), []).append(str(name))
  twins = {}
  for name, doc in zip(names, docs, strict=True):
    h = dedup.content_hash(bytes(np.asarray(doc)))
    if h != dedup.EMPTY and h in by_hash:
      twins[str(name)] = tuple(by_hash[h])
  return twins


def training_split(data_config) -> tuple[tuple[str, ...], tuple[np.ndarray, ...]]:
  """(paths, contents) of the training files of the byte corpus a data config names."""
  from types import SimpleNamespace

  from experiments.data.corpus import corpus_spec, load_corpus

  corpus = load_corpus(corpus_spec(SimpleNamespace(data=data_config)))
  return corpus.train_paths, corpus.train_docs


def deduplicated(docs, names, train_names, train_docs, *, cap: int):
  """(docs, names, Dedup): the validation documents without those with a training twin
  (`near_duplicates`); Dedup.units counts what their `cap`-unit windows held."""
  twins = near_duplicates(names, docs, train_names, train_docs)
  keep = [i for i, name in enumerate(names) if str(name) not in twins]
  units = sum(min(len(docs[i]), cap) for i, name in enumerate(names)
              if str(name) in twins and len(docs[i]) >= 2)
  removed = tuple(str(name) for name in names if str(name) in twins)
  return ([docs[i] for i in keep], [names[i] for i in keep],
          Dedup(removed, int(units), {name: twins[name] for name in removed}))


def config_windows(docs, names, data_config, *, train=None) -> Windows | None:
  """The windows a config's `data.val_doc_cap` / `data.val_budget` ask for, without the
  near-duplicates of training files under `data.dedup_validation` (`train`: the training
  split's (paths, contents) when the caller holds them, else read from the config's
  corpus); None when the cap is 0 (absent: runs saved before it existed), i.e. the older
  path-order batches."""
  cap = int(data_config.get("val_doc_cap", 0) or 0)
  if cap == 0:
    if dedups(data_config):
      raise ValueError("data.dedup_validation=True needs the per-document validation set "
                       "(data.val_doc_cap > 0).")
    return None
  found = None
  if dedups(data_config):
    train_names, train_docs = train if train is not None else training_split(data_config)
    docs, names, found = deduplicated(docs, names, train_names, train_docs, cap=cap)
  windows = validation_windows(docs, names, cap=cap,
                               budget=int(data_config.get("val_budget", 0) or 0))
  return dataclasses.replace(windows, dedup=found)


def config_batches(docs, names, data_config, *, default, max_batches: int | None = None,
                   train=None):
  """(validation batches, document names) of a run's data config; with no cap, the
  `default()` batches and None (no per-document losses). The names are a `DocNames`,
  carrying what deduplication left out (`train`: as `config_windows`)."""
  windows = config_windows(docs, names, data_config, train=train)
  if windows is None:
    return default(), None
  return (validation_batches(windows, seq_len=data_config.seq_len,
                             batch_size=data_config.batch_size, max_batches=max_batches),
          DocNames(windows.names, windows.dedup))


def rescore(per_doc: dict, keep) -> float:
  """Bits per unit of a per-document evaluation (`read_per_doc`) over the documents
  named in `keep` alone, e.g. a run on the full set scored on the deduplicated set. Every
  name of `keep` must be in the record."""
  index = {name: i for i, name in enumerate(per_doc["names"])}
  missing = [name for name in keep if name not in index]
  if missing:
    raise KeyError(f"rescore: {len(missing)} document(s) not in the evaluation "
                   f"({', '.join(map(str, missing[:3]))}).")
  rows = [index[name] for name in keep]
  nats = np.asarray(per_doc["nats"], np.float64)[rows]
  tokens = np.asarray(per_doc["tokens"], np.float64)[rows]
  return float(nats.sum() / max(tokens.sum(), 1.0) / np.log(2.0))


def write_per_doc(workdir, step: int, unit: str, names, nats_D, tokens_D,
                  dedup: Dedup | None = None) -> Path:
  """`<workdir>/eval_per_doc.json`: the evaluation at `step`, per validation document
  (nats summed over its targets, their count), written atomically; with `dedup` (or
  names that carry one, `DocNames`), what deduplication against training left out."""
  nats_D, tokens_D = np.asarray(nats_D, np.float64), np.asarray(tokens_D, np.float64)
  if not len(names) == nats_D.size == tokens_D.size:
    raise ValueError(f"write_per_doc: {len(names)} names, {nats_D.size} sums, "
                     f"{tokens_D.size} counts.")
  path = Path(workdir) / PER_DOC_FILE
  record = {"step": int(step), "unit": unit, "names": list(map(str, names)),
            "nats": nats_D.tolist(), "tokens": tokens_D.tolist(),
            "bits_per_unit": float(nats_D.sum() / max(tokens_D.sum(), 1.0) / np.log(2.0))}
  dedup = dedup if dedup is not None else getattr(names, "dedup", None)
  if dedup is not None:
    record["dedup"] = dedup.describe()
  durable.write_text(path, json.dumps(record))
  return path


def read_per_doc(workdir) -> dict | None:
  """The record `write_per_doc` wrote (arrays as numpy), or None when there is none."""
  path = Path(workdir) / PER_DOC_FILE
  try:
    record = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  record["nats"] = np.asarray(record["nats"], np.float64)
  record["tokens"] = np.asarray(record["tokens"], np.float64)
  return record
