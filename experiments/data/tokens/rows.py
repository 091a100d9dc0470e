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
protocol.py), built on grain as the byte corpus's `TrainIterator` is
(experiments/data/pipeline.py `batch_iterator`): a `grain.MapDataset` over
`TokenRows` (global row k at index k), batched, read ahead by one thread through
`to_iter_dataset`. Its state is the grain iterator's (the index of the next global
batch), saved in every checkpoint, so it resumes exactly; `rows=(a, b)` makes one
process read only rows a..b-1 of every global batch. The rows are those the
hand-written iterator before it yielded, so a state it saved (version 1, a batch
count) resumes the same stream. Tokens stay in the shards' memory maps; only
per-document tables (three int64 per document) and an epoch's permutations live
in host memory. grain is imported on first use: reading a corpus does not need it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from experiments.data.packing import epoch_order, num_rows, pack_row
from experiments.data.tokens.format import TokenDataError, open_shard, read_manifest

# Version 2: the grain iterator's state; version 1 (the hand-written iterator's) was the
# count of global batches read, the same stream position.
_STATE_VERSION = 2
# Length of the (lazy) training source in epochs: far more than any run reads.
_EPOCHS = 100_000


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


class TokenBatches:
  """Endless training batches of a TokenCorpus with an exactly resumable JSON state."""

  def __init__(self, corpus: TokenCorpus, *, seq_len: int, batch_size: int, seed: int,
               rows: tuple[int, int] | None = None, allow_data_change: bool = False,
               prefetch: int = 4):
    """`rows=(a, b)`: only rows a..b-1 of every `batch_size`-row global batch (one
    process's part); None: whole batches. The state counts global batches, so it
    resumes under any split of the rows. `allow_data_change`: a state saved over
    other shards resumes at its batch count (`data.allow_corpus_change`). `prefetch`:
    batches read ahead by one thread (0: none)."""
    from experiments.data.pipeline import batch_iterator

    self.source = TokenRows(corpus.train_docs, seq_len, seed=seed, epochs=_EPOCHS)
    self._iter = batch_iterator(self.source, batch_size=batch_size, rows=rows,
                                prefetch=prefetch, name="TokenBatches")
    self.batch_size = batch_size
    self.rows = (0, batch_size) if rows is None else tuple(rows)
    self.allow_data_change = allow_data_change
    self.fingerprint = {"data_sha256": corpus.digest, "seq_len": seq_len,
                        "batch_size": batch_size, "seed": seed}

  @property
  def rows_per_epoch(self) -> int:
    return self.source.rows_per_epoch

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    # Global row k: the epochs repeat with fresh permutations, without end.
    return next(self._iter)

  def get_state(self) -> dict:
    return {"version": _STATE_VERSION, "grain": self._iter.get_state(), **self.fingerprint}

  def set_state(self, state: dict) -> None:
    saved = {k: state.get(k) for k in self.fingerprint}
    if self.allow_data_change:   # the shards may differ; the stream's settings may not
      saved["data_sha256"] = self.fingerprint["data_sha256"]
    if saved != self.fingerprint:
      raise TokenDataError(
          "the checkpoint's data iterator was made for different token data: saved "
          f"{saved}, now {self.fingerprint}; resuming would not continue the same stream.")
    version = state.get("version")
    if version == 1:   # the hand-written iterator's state: the same stream, by batch count
      self._iter.set_state({"next_index": int(state["batch"])})
    elif version == _STATE_VERSION:
      self._iter.set_state(state["grain"])
    else:
      raise TokenDataError(
          f"the checkpoint's data iterator state has version {version!r}, which this code "
          f"does not read (1 or {_STATE_VERSION}); resume with the code that saved it.")


def token_eval_batches(corpus: TokenCorpus, *, seq_len: int, batch_size: int,
                       max_batches: int) -> list[dict]:
  """Validation rows in manifest order (no shuffle), as at most `max_batches` batches;
  a last partial batch is padded with rows of segment id 0 and loss_mask 0."""
  from experiments.data.pipeline import fixed_batches

  source = TokenRows(corpus.val_docs, seq_len, seed=None, what="validation")
  return fixed_batches(source, batch_size=batch_size, max_batches=max_batches)
