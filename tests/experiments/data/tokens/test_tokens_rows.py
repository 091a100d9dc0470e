"""Packed token rows: documents never share a segment, process rows cover each batch,
the state resumes exactly, validation rows come from the validation split."""

import numpy as np
import pytest
from tokens_inputs import VAL_FRACTION, texts

from experiments.data.packing import reference_rows
from experiments.data.tokens import (
    TokenBatches,
    TokenCorpus,
    TokenDataError,
    TokenRows,
    prepare,
    token_eval_batches,
)

SEQ, BATCH = 16, 4


@pytest.fixture(scope="module")
def corpus(corpus_inputs, tmp_path_factory):
  spec, _, tokenizer = corpus_inputs
  out = tmp_path_factory.mktemp("rows")
  prepare(spec, str(tokenizer), str(out), val_fraction=VAL_FRACTION, progress=False)
  return TokenCorpus(out)


def doc_list(docs):
  return [np.asarray(docs[i]) for i in range(len(docs))]


@pytest.mark.parametrize("seed", [None, 3])
def test_rows_equal_the_reference_packing(corpus, seed):
  source = TokenRows(corpus.train_docs, SEQ, seed=seed)
  order, _, perm = source._epoch(0)
  want = reference_rows(doc_list(corpus.train_docs), order, SEQ)
  for i in range(source.rows_per_epoch):
    got = source[i]
    for key, value in want[int(perm[i])].items():
      np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_a_segment_never_crosses_a_document(corpus):
  docs = [d.tolist() for d in doc_list(corpus.train_docs)]
  source = TokenRows(corpus.train_docs, SEQ, seed=1)
  for i in range(3 * source.rows_per_epoch):   # three epochs, three orders
    row = source[i]
    for segment in np.unique(row["segment_ids"]):
      pick = row["segment_ids"] == segment
      piece = row["inputs"][pick].tolist()
      start = int(row["positions"][pick][0])
      assert row["positions"][pick].tolist() == list(range(start, start + len(piece)))
      # Inside a segment every target is the next input; the last one counts only
      # when it continues the same document (into the next row).
      targets, mask = row["targets"][pick].tolist(), row["loss_mask"][pick]
      assert targets[:-1] == piece[1:] and mask[:-1].all()
      run = piece + targets[-1:] if mask[-1] else piece
      assert any(_contains(d, run) for d in docs)


def _contains(doc, piece):
  n = len(piece)
  return any(doc[k:k + n] == piece for k in range(len(doc) - n + 1))


def test_process_rows_are_disjoint_and_cover_each_global_batch(corpus):
  whole = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=5)
  parts = [TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=5, rows=r)
           for r in ((0, 1), (1, 3), (3, 4))]
  for _ in range(whole.rows_per_epoch // BATCH + 2):   # across an epoch boundary
    batch = next(whole)
    pieces = [next(p) for p in parts]
    for key in batch:
      np.testing.assert_array_equal(np.concatenate([p[key] for p in pieces]), batch[key])
  with pytest.raises(ValueError, match="rows=.2, 1."):
    TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=5, rows=(2, 1))


def test_the_state_resumes_exactly(corpus):
  straight = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=2)
  for _ in range(3):
    next(straight)
  state = straight.get_state()
  resumed = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=2, rows=(2, 4))
  resumed.set_state(state)   # the state counts global batches: any row split resumes
  for _ in range(4):
    np.testing.assert_array_equal(next(resumed)["inputs"], next(straight)["inputs"][2:])
  other = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=9)
  with pytest.raises(TokenDataError, match="different token data"):
    other.set_state(state)


def test_validation_rows_come_from_the_validation_split(corpus):
  batches = token_eval_batches(corpus, seq_len=SEQ, batch_size=BATCH, max_batches=100)
  source = TokenRows(corpus.val_docs, SEQ, seed=None)
  rows = [b for batch in batches for b in batch["inputs"]]
  assert len(rows) == -(-source.rows_per_epoch // BATCH) * BATCH
  for i in range(source.rows_per_epoch):
    np.testing.assert_array_equal(rows[i], source[i]["inputs"])
  padding = batches[-1]["segment_ids"][source.rows_per_epoch % BATCH or BATCH:]
  assert not padding.any()
  assert len(token_eval_batches(corpus, seq_len=SEQ, batch_size=BATCH, max_batches=1)) == 1


def test_too_little_data_is_one_line(tmp_path):
  (tmp_path / "a.txt").write_text(texts(1)[0])
  prepare(str(tmp_path / "a.txt"), "bytes", str(tmp_path / "o"), val_fraction=0.01,
          progress=False)
  with pytest.raises(TokenDataError, match="validation split's 0 tokens .0 documents"):
    token_eval_batches(TokenCorpus(tmp_path / "o"), seq_len=SEQ, batch_size=BATCH,
                       max_batches=1)
