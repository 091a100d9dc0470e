"""Concatenate-then-split packing of byte documents into fixed-length rows.

An epoch's documents, in a given order, form one byte stream; row i is the
window stream[i·T : i·T + T + 1] (T + 1 bytes so that every one of the T
inputs has its next byte as target; consecutive rows share one byte). A
document longer than a row continues in the next row; a row holds pieces of
as many documents as fit, so no byte is padding.

Per row (all [T]):
  inputs       window[:-1] as int32 tokens (bytes 0..255).
  targets      window[1:].
  segment_ids  1, 2, ... numbering the document pieces inside the row; the
               model's attention, Lngram windows and conv taps stay inside one.
  positions    offset of each token inside its piece (restarts at 0).
  loss_mask    1.0 where input and target lie in the same document: the first
               byte of a document cannot be predicted from the previous one.
"""

from __future__ import annotations

import numpy as np


def stream_offsets(lengths: np.ndarray) -> np.ndarray:
  """Start offset of every document in the stream plus the total: [n + 1]."""
  return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


def epoch_order(lengths_D: np.ndarray, rows_per_epoch: int, seed: int | None, epoch: int):
  """(document order, stream offsets, row permutation) of one epoch.

  seed None keeps the documents and rows in order (evaluation); otherwise both are
  permuted by numpy's generator seeded with (seed, epoch), so any epoch is reproducible
  without replaying the ones before it.
  """
  n = len(lengths_D)
  if seed is None:
    order, rows = np.arange(n), np.arange(rows_per_epoch)
  else:
    rng = np.random.default_rng([seed, epoch])
    order, rows = rng.permutation(n), rng.permutation(rows_per_epoch)
  return order, stream_offsets(lengths_D[order]), rows


def num_rows(total_bytes: int, seq_len: int) -> int:
  """Rows of a stream of `total_bytes` (the last partial row is dropped)."""
  return max(0, (int(total_bytes) - 1) // seq_len)


def pack_row(docs, order: np.ndarray, offsets: np.ndarray, row: int, seq_len: int) -> dict:
  """Row `row` of the stream of `docs` taken in `order` (offsets of that order)."""
  start, stop = row * seq_len, row * seq_len + seq_len + 1
  if stop > offsets[-1]:
    raise IndexError(f"row={row} needs bytes up to {stop}, the stream has {offsets[-1]}.")
  # Documents (positions in `order`) overlapping [start, stop).
  first = int(np.searchsorted(offsets, start, side="right")) - 1
  last = int(np.searchsorted(offsets, stop, side="left")) - 1
  window = np.empty(seq_len + 1, np.int32)
  doc_of_byte = np.empty(seq_len + 1, np.int32)
  pos = np.empty(seq_len + 1, np.int32)
  for k in range(first, last + 1):
    lo, hi = max(start, offsets[k]), min(stop, offsets[k + 1])
    if hi <= lo:  # an empty document
      continue
    doc = docs[order[k]]
    window[lo - start:hi - start] = doc[lo - offsets[k]:hi - offsets[k]]
    doc_of_byte[lo - start:hi - start] = k
    pos[lo - start:hi - start] = np.arange(hi - lo)
  same_doc = doc_of_byte[1:] == doc_of_byte[:-1]
  # Number the document pieces 1, 2, ... inside the row.
  segment_ids = np.cumsum(np.concatenate([[1], ~same_doc[:-1]])).astype(np.int32)
  return {
      "inputs": window[:-1],
      "targets": window[1:],
      "segment_ids": segment_ids,
      "positions": pos[:-1],
      "loss_mask": same_doc.astype(np.float32),
  }


def reference_rows(docs, order, seq_len: int) -> list[dict]:
  """Every row by the obvious method (build the whole stream); for tests."""
  stream = np.concatenate([docs[i] for i in order]).astype(np.int32)
  doc_id = np.concatenate([np.full(docs[i].size, k, np.int32) for k, i in enumerate(order)])
  pos = np.concatenate([np.arange(docs[i].size, dtype=np.int32) for i in order])
  rows = []
  for r in range(num_rows(stream.size, seq_len)):
    s = slice(r * seq_len, r * seq_len + seq_len + 1)
    w, d = stream[s], doc_id[s]
    seg, prev, n = [], None, 0
    for x in d[:-1]:
      n += x != prev
      prev = x
      seg.append(n)
    first_pos = pos[s][:-1].copy()
    # A document continued from the previous row restarts its positions at 0.
    head = d[:-1] == d[0]
    first_pos[head] = np.arange(head.sum())
    rows.append({
        "inputs": w[:-1], "targets": w[1:], "segment_ids": np.asarray(seg, np.int32),
        "positions": first_pos, "loss_mask": (d[1:] == d[:-1]).astype(np.float32)})
  return rows
