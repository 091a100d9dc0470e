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
protocol.py), a `BatchStream` as the byte corpus's `TrainIterator` is
(experiments/data/pipeline.py): a `grain.MapDataset` over `TokenRows` (global row k
at index k), batched, read ahead by one thread through `to_iter_dataset`. Its state is
the grain iterator's (the index of the next global batch), saved in every checkpoint,
so it resumes exactly; `rows=(a, b)` makes one process read only rows a..b-1 of every
global batch. The rows are those the hand-written iterator before it yielded, so a
state it saved (version 1, a batch count) resumes the same stream. Tokens stay in the
shards' memory maps; only per-document tables (three int64 per document) and an
epoch's permutations live in host memory. grain is imported on first use: reading a
corpus does not need it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from experiments.data.packing import epoch_order, num_rows, pack_row
from experiments.data.pipeline import EPOCHS, BatchStream, fixed_batches
from experiments.data.tokens.format import TokenDataError, open_shard, read_manifest

# Version 2: the grain iterator's state; version 1 (the hand-written iterator's) was the
# count of global batches read, the same stream position.
_STATE_VERSION = 2


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


class TokenBatches(BatchStream):
  """Endless training batches of a TokenCorpus with an exactly resumable JSON state."""

  data_key = "data_sha256"
  what = "token data"
  error = TokenDataError
  state_version = _STATE_VERSION

  def __init__(self, corpus: TokenCorpus, *, seq_len: int, batch_size: int, seed: int,
               rows: tuple[int, int] | None = None, allow_data_change: bool = False,
               prefetch: int = 4):
    """`rows=(a, b)`: only rows a..b-1 of every `batch_size`-row global batch (one
    process's part); None: whole batches. The state counts global batches, so it
    resumes under any split of the rows. `allow_data_change`: a state saved over
    other shards resumes at its batch count (`data.allow_corpus_change`). `prefetch`:
    batches read ahead by one thread (0: none)."""
    super().__init__(
        TokenRows(corpus.train_docs, seq_len, seed=seed, epochs=EPOCHS),
        fingerprint={"data_sha256": corpus.digest, "seq_len": seq_len,
                     "batch_size": batch_size, "seed": seed},
        batch_size=batch_size, rows=rows, prefetch=prefetch,
        allow_data_change=allow_data_change)
    self.batch_size = batch_size
    self.rows = (0, batch_size) if rows is None else tuple(rows)

  def _grain_state(self, state: dict) -> dict:
    version = state.get("version")
    if version == 1:   # the hand-written iterator's state: the same stream, by batch count
      return {"next_index": int(state["batch"])}
    if version == _STATE_VERSION:
      return state["grain"]
    raise TokenDataError(
        f"the checkpoint's data iterator state has version {version!r}, which this code "
        f"does not read (1 or {_STATE_VERSION}); resume with the code that saved it.")


def token_eval_batches(corpus: TokenCorpus, *, seq_len: int, batch_size: int,
                       max_batches: int) -> list[dict]:
  """Validation rows in manifest order (no shuffle), as at most `max_batches` batches;
  a last partial batch is padded with rows of segment id 0 and loss_mask 0."""
  source = TokenRows(corpus.val_docs, seq_len, seed=None, what="validation")
  return fixed_batches(source, batch_size=batch_size, max_batches=max_batches)
