"""Packed training rows and validation batches over a tokenized corpus.

Documents of the training split, in an order drawn per epoch, form one token
stream cut into rows of T + 1 tokens exactly as the byte corpus is
(experiments/data/packing.py: segment ids number the document pieces in a row,
so no segment spans two documents; the loss skips each document's first
token). Global row k of the stream is row `perm_e[k % rows]` of epoch
e = k // rows, where the document order and the row permutation of epoch e come
from numpy's generator seeded with (seed, e), the byte pipeline's rule
(experiments/data/pipeline.py).

`TokenBatches` is the `BatchSource` the trainer reads (experiments/trainer/
protocol.py): its state is the number of batches read, so it resumes exactly,
and `rows=(a, b)` makes one process read only rows a..b-1 of every global batch.
Tokens stay in the shards' memory maps; only per-document tables (three int64
per document) and an epoch's permutations live in host memory.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from experiments.data.packing import epoch_order, num_rows, pack_row
from experiments.data.tokens.format import TokenDataError, open_shard, read_manifest

_STATE_VERSION = 1


class Documents:
  """One split's documents across shards: `docs[i]` is a memory-mapped token array."""

  def __init__(self, shards: list[np.ndarray], shard_D, start_D, length_D):
    self._shards = shards
    self.shard_D, self.start_D, self.length_D = shard_D, start_D, length_D

  def __len__(self) -> int:
    return int(self.length_D.size)

  def __getitem__(self, i: int) -> np.ndarray:
    start = int(self.start_D[i])
    return self._shards[int(self.shard_D[i])][start:start + int(self.length_D[i])]

  @property
  def tokens(self) -> int:
    return int(self.length_D.sum())


class TokenCorpus:
  """A data directory opened for reading: its manifest and both splits' documents."""

  def __init__(self, path: str | os.PathLike, *, verify: bool = True):
    self.root = Path(path).expanduser()
    self.manifest = read_manifest(self.root)
    tokens, tables = [], {True: [], False: []}
    for k, shard in enumerate(self.manifest["shards"]):
      arrays = open_shard(self.root, shard, verify=verify)
      tokens.append(arrays["tokens"])
      offsets, val = np.asarray(arrays["offsets"]), np.asarray(arrays["val"], bool)
      for split in (True, False):
        pick = np.flatnonzero(val == split)
        tables[split].append((np.full(pick.size, k, np.int32), offsets[pick],
                              offsets[pick + 1] - offsets[pick]))
    def docs(split):
      if not tables[split]:
        return Documents(tokens, *(np.zeros(0, t) for t in (np.int32, np.int64, np.int64)))
      return Documents(tokens, *(np.concatenate(parts) for parts in zip(*tables[split],
                                                                         strict=True)))
    self.train_docs, self.val_docs = docs(False), docs(True)

  @property
  def vocab_size(self) -> int:
    return int(self.manifest["tokenizer"]["vocab_size"])

  @property
  def digest(self) -> str:
    return self.manifest["shards_sha256"]


class TokenRows:
  """Random-access packed rows of one split (the grain data-source protocol)."""

  def __init__(self, docs: Documents, seq_len: int, *, seed: int | None, epochs: int = 1,
               what: str = "training"):
    self.docs, self.seq_len, self.seed, self.epochs = docs, int(seq_len), seed, epochs
    self.rows_per_epoch = num_rows(docs.tokens, self.seq_len)
    if self.rows_per_epoch < 1:
      raise TokenDataError(f"the {what} split's {docs.tokens} tokens ({len(docs)} documents) "
                           f"hold no row of seq_len={seq_len}; prepare more data (or a "
                           "larger val_fraction).")

  def __len__(self) -> int:
    return self.rows_per_epoch * self.epochs

  @functools.lru_cache(maxsize=2)  # noqa: B019 — the source lives as long as its reader
  def _epoch(self, epoch: int):
    return epoch_order(self.docs.length_D, self.rows_per_epoch, self.seed, epoch)

  def __getitem__(self, index: int) -> dict:
    epoch, i = divmod(int(index), self.rows_per_epoch)
    order, offsets, rows = self._epoch(epoch)
    return pack_row(self.docs, order, offsets, int(rows[i]), self.seq_len)


def _stack(rows: list[dict]) -> dict:
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


class TokenBatches:
  """Endless training batches of a TokenCorpus with an exactly resumable JSON state."""

  def __init__(self, corpus: TokenCorpus, *, seq_len: int, batch_size: int, seed: int,
               rows: tuple[int, int] | None = None, allow_data_change: bool = False):
    """`rows=(a, b)`: only rows a..b-1 of every `batch_size`-row global batch (one
    process's part); None: whole batches. The state counts global batches, so it
    resumes under any split of the rows. `allow_data_change`: a state saved over
    other shards resumes at its batch count (`data.allow_corpus_change`)."""
    a, b = (0, batch_size) if rows is None else rows
    if not 0 <= a < b <= batch_size:
      raise ValueError(f"TokenBatches: rows={rows} must satisfy 0 <= a < b <= "
                       f"batch_size={batch_size}.")
    self.source = TokenRows(corpus.train_docs, seq_len, seed=seed, epochs=1)
    self.batch_size, self.rows, self.batch = batch_size, (a, b), 0
    self.allow_data_change = allow_data_change
    self.fingerprint = {"data_sha256": corpus.digest, "seq_len": seq_len,
                        "batch_size": batch_size, "seed": seed}

  @property
  def rows_per_epoch(self) -> int:
    return self.source.rows_per_epoch

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    a, b = self.rows
    first = self.batch * self.batch_size
    self.batch += 1
    # Global row k: the epochs repeat with fresh permutations, without end.
    return _stack([self.source[k] for k in range(first + a, first + b)])

  def get_state(self) -> dict:
    return {"version": _STATE_VERSION, "batch": self.batch, **self.fingerprint}

  def set_state(self, state: dict) -> None:
    saved = {k: state.get(k) for k in self.fingerprint}
    if self.allow_data_change:   # the shards may differ; the stream's settings may not
      saved["data_sha256"] = self.fingerprint["data_sha256"]
    if saved != self.fingerprint or state.get("version") != _STATE_VERSION:
      raise TokenDataError(
          "the checkpoint's data iterator was made for different token data: saved "
          f"{saved}, now {self.fingerprint}; resuming would not continue the same stream.")
    self.batch = int(state["batch"])


def token_eval_batches(corpus: TokenCorpus, *, seq_len: int, batch_size: int,
                       max_batches: int) -> list[dict]:
  """Validation rows in manifest order (no shuffle), as at most `max_batches` batches;
  a last partial batch is padded with rows of segment id 0 and loss_mask 0."""
  source = TokenRows(corpus.val_docs, seq_len, seed=None, what="validation")
  n = min(len(source), max_batches * batch_size)
  batches = []
  for first in range(0, n, batch_size):
    rows = [source[k] for k in range(first, min(first + batch_size, n))]
    rows += [{k: np.zeros_like(v) for k, v in rows[0].items()}] * (batch_size - len(rows))
    batches.append(_stack(rows))
  return batches
