"""grain pipelines over a packed corpus: shuffled training batches, fixed eval batches.

The training stream is indexed: global row k belongs to epoch k // rows and is
row `perm_e[k % rows]` of that epoch's stream, where the document order and the
row order of epoch e are permutations drawn from numpy's generator seeded with
(seed, e). A grain `MapDataset` over that random-access source is batched and
read through a grain iterator, whose state (the next batch index) is saved in
every checkpoint: restoring it resumes at exactly the next batch.

`BatchStream` is what both training iterators share: the grain iterator, the
resumable state (the next batch index beside a fingerprint of the stream's settings)
and the check that a saved state belongs to this stream. `TrainIterator` (byte
corpora, here) and `TokenBatches` (token data, experiments/data/tokens/rows.py) are
its two kinds; validation rows of both go through `fixed_batches`. This is the only
module that imports grain, and only when a pipeline is built: restoring a model and
reading a corpus do not need it.
"""

from __future__ import annotations

import functools

import numpy as np

from experiments.data.corpus import Corpus
from experiments.data.packing import epoch_order, num_rows, pack_row

# Length of the (lazy) training source in epochs: far more than any run reads.
EPOCHS = 100_000


class PackedRows:
  """Random-access source of packed rows (grain's data-source protocol)."""

  def __init__(self, docs, seq_len: int, *, seed: int | None, epochs: int = 1):
    self.docs = tuple(docs)
    self.seq_len = int(seq_len)
    self.seed = seed
    self.lengths = np.asarray([d.size for d in self.docs], np.int64)
    self.rows_per_epoch = num_rows(int(self.lengths.sum()), self.seq_len)
    if self.rows_per_epoch < 1:
      raise ValueError(
          f"corpus of {int(self.lengths.sum())} bytes holds no row of seq_len={seq_len}.")
    self.epochs = epochs

  def __len__(self) -> int:
    return self.rows_per_epoch * self.epochs

  @functools.lru_cache(maxsize=2)  # noqa: B019 — the source lives as long as its dataset
  def _epoch(self, epoch: int):
    """(document order, stream offsets, row permutation) of one epoch."""
    return epoch_order(self.lengths, self.rows_per_epoch, self.seed, epoch)

  def __getitem__(self, index: int) -> dict:
    epoch, i = divmod(int(index), self.rows_per_epoch)
    order, offsets, rows = self._epoch(epoch)
    return pack_row(self.docs, order, offsets, int(rows[i]), self.seq_len)


def _row_of_block(source, batch_size: int, first: int, per: int, i: int) -> dict:
  """Element i of one process's rows: row first + i % per of global batch i // per."""
  return source[(i // per) * batch_size + first + i % per]


def batch_iterator(source, *, batch_size: int, rows: tuple[int, int] | None, prefetch: int,
                   name: str = "TrainIterator"):
  """A grain iterator over `source` (random access, indexed by global row) in batches of
  `batch_size` rows: global batch n is rows n·batch_size .. (n + 1)·batch_size - 1.

  `rows=(a, b)`: only rows a..b-1 of every global batch (one process's part); None: whole
  batches. Either way the iterator's state (`get_state`/`set_state`) is the index of the
  next global batch, so a state resumes under any split of the rows. `prefetch` batches
  are read ahead by one thread (0: read on demand, in the caller's thread)."""
  import grain

  dataset = grain.MapDataset.source(source)
  if rows is not None:
    a, b = rows
    if not 0 <= a < b <= batch_size:
      raise ValueError(f"{name}: rows={rows} must satisfy 0 <= a < b <= "
                       f"batch_size={batch_size}.")
    per = b - a
    dataset = grain.MapDataset.range(len(source) // batch_size * per).map(
        functools.partial(_row_of_block, source, batch_size, a, per))
    batch_size = per
  dataset = dataset.batch(batch_size, drop_remainder=True)
  # One reader thread: rows are cheap and the cores belong to XLA.
  options = grain.ReadOptions(num_threads=1 if prefetch else 0,
                              prefetch_buffer_size=max(prefetch, 1))
  return iter(dataset.to_iter_dataset(options))


def fixed_batches(source, *, batch_size: int, max_batches: int) -> list[dict]:
  """The first rows of `source` in index order, as at most `max_batches` batches; a last
  partial batch is padded with all-zero rows (loss_mask 0), so every batch has one shape
  (one compiled eval step)."""
  import grain

  n = min(len(source), max_batches * batch_size)
  dataset = grain.MapDataset.source(source)[:n].batch(batch_size, drop_remainder=False)
  batches = []
  for batch in dataset:
    short = batch_size - batch["inputs"].shape[0]
    if short:
      batch = {k: np.concatenate([v, np.zeros((short, *v.shape[1:]), v.dtype)])
               for k, v in batch.items()}
    batches.append(batch)
  return batches


class BatchStream:
  """Endless training batches of a random-access row source (global row k at index k)
  with a JSON-serialisable, exactly resumable state.

  The state is the grain iterator's (the index of the next global batch) beside the
  `fingerprint` of the stream's settings; a state whose fingerprint differs is refused
  (`error`, naming both), except its `data_key` entry (which data) when
  `allow_data_change` is set: the stream's settings may not differ, the data may. A
  kind of stream sets the class attributes; `_grain_state` reads a saved state."""

  data_key: str = ""       # the fingerprint's entry naming the data (files, shards)
  what: str = "data"       # the data, as the refusal names it
  error: type[Exception] = ValueError
  state_version: int = 1

  def __init__(self, source, *, fingerprint: dict, batch_size: int,
               rows: tuple[int, int] | None, prefetch: int, allow_data_change: bool):
    self.source = source
    self.fingerprint = fingerprint
    self.allow_data_change = allow_data_change
    self._iter = batch_iterator(source, batch_size=batch_size, rows=rows, prefetch=prefetch,
                                name=type(self).__name__)

  @property
  def rows_per_epoch(self) -> int:
    return self.source.rows_per_epoch

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    # Global row k: the epochs repeat with fresh permutations, without end.
    return next(self._iter)

  def get_state(self) -> dict:
    return {"version": self.state_version, "grain": self._iter.get_state(),
            **self.fingerprint}

  def set_state(self, state: dict) -> None:
    saved = {k: state.get(k) for k in self.fingerprint}
    if self.allow_data_change:   # the data may differ; the stream's settings may not
      saved[self.data_key] = self.fingerprint[self.data_key]
    if saved != self.fingerprint:
      raise self.error(
          f"the checkpoint's data iterator was made for different {self.what}: saved "
          f"{saved}, now {self.fingerprint}; resuming would not continue the same stream.")
    self._iter.set_state(self._grain_state(state))

  def _grain_state(self, state: dict) -> dict:
    """The grain iterator's state in a saved state."""
    return state["grain"]


class TrainIterator(BatchStream):
  """Endless training batches of a byte corpus with an exactly resumable JSON state."""

  data_key = "file_list_sha256"

  def __init__(self, corpus: Corpus, *, seq_len: int, batch_size: int, seed: int,
               prefetch: int = 4, rows: tuple[int, int] | None = None,
               allow_corpus_change: bool = False):
    """`rows=(a, b)`: only rows a..b-1 of every `batch_size`-row batch (one process's part
    of the global batch, read by that process alone); None: whole batches. The state
    counts batches, so it resumes under any split of the rows.
    `allow_corpus_change`: a saved state of another file list resumes at its batch
    count over this corpus's stream (`data.allow_corpus_change`); otherwise refused."""
    super().__init__(
        PackedRows(corpus.train_docs, seq_len, seed=seed, epochs=EPOCHS),
        fingerprint={"file_list_sha256": corpus.manifest["file_list_sha256"],
                     "seq_len": seq_len, "batch_size": batch_size, "seed": seed},
        batch_size=batch_size, rows=rows, prefetch=prefetch,
        allow_data_change=allow_corpus_change)

  @property
  def allow_corpus_change(self) -> bool:
    return self.allow_data_change


def eval_batches(corpus: Corpus, *, seq_len: int, batch_size: int, max_batches: int) -> list:
  """Validation rows in path order (no shuffle), as at most `max_batches` batches.

  A last partial batch is padded with rows whose loss_mask is 0 so every batch
  has one shape (one compiled eval step).
  """
  source = PackedRows(corpus.val_docs, seq_len, seed=None)
  return fixed_batches(source, batch_size=batch_size, max_batches=max_batches)
