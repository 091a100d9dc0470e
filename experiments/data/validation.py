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
never just the first ones) until the budget is reached. Rows are those of the
packed training stream restricted to one document: T inputs, their next units as
targets, positions restarting at 0 in every row; a last short row is padded with
segment id 0 and loss_mask 0 (as are padding rows of a last short batch, `doc` -1).
Nothing is random: the same set on every run and machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

PER_DOC_FILE = "eval_per_doc.json"


@dataclasses.dataclass(frozen=True)
class Windows:
  """The validation windows: one array per kept document, its name, its full length."""

  docs: tuple[np.ndarray, ...]
  names: tuple[str, ...]
  full_lengths: tuple[int, ...]

  @property
  def units(self) -> int:
    return int(sum(d.size for d in self.docs))

  def largest_share(self) -> float:
    """The largest document's share of the units (0 for an empty set)."""
    return max((d.size for d in self.docs), default=0) / max(self.units, 1)

  def describe(self) -> dict:
    return {"docs": len(self.docs), "units": self.units,
            "largest_share": round(self.largest_share(), 6), "names": list(self.names)}


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


def config_windows(docs, names, data_config) -> Windows | None:
  """The windows a config's `data.val_doc_cap` / `data.val_budget` ask for; None when the
  cap is 0 (absent: runs saved before it existed), i.e. the older path-order batches."""
  cap = int(data_config.get("val_doc_cap", 0) or 0)
  if cap == 0:
    return None
  return validation_windows(docs, names, cap=cap,
                            budget=int(data_config.get("val_budget", 0) or 0))


def config_batches(docs, names, data_config, *, default, max_batches: int | None = None):
  """(validation batches, document names) of a run's data config; with no cap, the
  `default()` batches and None (no per-document losses)."""
  windows = config_windows(docs, names, data_config)
  if windows is None:
    return default(), None
  return (validation_batches(windows, seq_len=data_config.seq_len,
                             batch_size=data_config.batch_size, max_batches=max_batches),
          windows.names)


def write_per_doc(workdir, step: int, unit: str, names, nats_D, tokens_D) -> Path:
  """`<workdir>/eval_per_doc.json`: the evaluation at `step`, per validation document
  (nats summed over its targets, their count), written atomically."""
  nats_D, tokens_D = np.asarray(nats_D, np.float64), np.asarray(tokens_D, np.float64)
  if not len(names) == nats_D.size == tokens_D.size:
    raise ValueError(f"write_per_doc: {len(names)} names, {nats_D.size} sums, "
                     f"{tokens_D.size} counts.")
  path = Path(workdir) / PER_DOC_FILE
  record = {"step": int(step), "unit": unit, "names": list(map(str, names)),
            "nats": nats_D.tolist(), "tokens": tokens_D.tolist(),
            "bits_per_unit": float(nats_D.sum() / max(tokens_D.sum(), 1.0) / np.log(2.0))}
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(record))
  os.replace(tmp, path)
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
