"""The token-row iterator on grain: the same rows as the hand-written iterator it replaced
(so runs saved before resume identically), a state saved mid-epoch resumes the same next
batches, and the validation batches are fixed."""

import hashlib
import json

import numpy as np
import pytest
from tokens_inputs import texts

from experiments.data.tokens import (
    TokenBatches,
    TokenCorpus,
    TokenDataError,
    prepare,
    token_eval_batches,
)
from experiments.data.tokens import rows as token_rows

SEQ, BATCH, SEED = 16, 4, 7
# sha256 of the first 153 batches (two epochs and three batches) of the data below, as the
# hand-written iterator yielded them: the order every token run saved before follows.
RECORDED = {
    None: "40df4d36f31773cb59eb67cb5d13fa2f5bec11b3b17284aab0a41ac30cbc8fca",
    (1, 3): "c2ad6d6fa5ec5364618a297ec1414c25f62528a5995e9ad5c5733c745dd6f563",
}
RECORDED_EVAL = "2f89b135b1dcd00f8d5b25f88b7a39aef59efc31d6daaa2e3c7b57afebd412c0"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The test texts as byte ids, one text file each (no tokenizer to train)."""
  root = tmp_path_factory.mktemp("grain")
  (root / "in").mkdir()
  for i, text in enumerate(texts()):
    (root / "in" / f"{i:03d}.txt").write_text(text, encoding="utf-8")
  prepare(str(root / "in"), "bytes", str(root / "out"), val_fraction=0.25, progress=False)
  return TokenCorpus(root / "out")


def reference_batches(corpus, *, seed, rows=None, start=0):
  """The hand-written iterator this one replaced: global batch n is global rows
  n·B + a .. n·B + b - 1 of the indexed stream, stacked."""
  a, b = (0, BATCH) if rows is None else rows
  source = token_rows.TokenRows(corpus.train_docs, SEQ, seed=seed)
  n = start
  while True:
    picked = [source[k] for k in range(n * BATCH + a, n * BATCH + b)]
    yield {k: np.stack([r[k] for r in picked]) for k in picked[0]}
    n += 1


def digest(batches) -> str:
  h = hashlib.sha256()
  for batch in batches:
    for key in sorted(batch):
      h.update(np.ascontiguousarray(batch[key]).tobytes())
  return h.hexdigest()


def assert_same(got, want):
  assert sorted(got) == sorted(want)
  for key in want:
    assert got[key].dtype == want[key].dtype, key
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("rows", [None, (1, 3)])
@pytest.mark.parametrize("prefetch", [0, 4])
def test_the_rows_are_those_of_the_hand_written_iterator(corpus, rows, prefetch):
  it = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=SEED, rows=rows,
                    prefetch=prefetch)
  n = it.rows_per_epoch // BATCH * 2 + 3   # past two epoch boundaries
  got = [next(it) for _ in range(n)]
  want = reference_batches(corpus, seed=SEED, rows=rows)
  for batch in got:
    assert_same(batch, next(want))
  assert digest(got) == RECORDED[rows]


@pytest.mark.parametrize("rows", [None, (2, 4)])
def test_a_state_saved_mid_epoch_resumes_the_same_next_batches(corpus, rows):
  straight = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=SEED, rows=rows)
  per_epoch = straight.rows_per_epoch // BATCH
  for _ in range(per_epoch // 2):   # mid-epoch, with batches prefetched beyond
    next(straight)
  state = json.loads(json.dumps(straight.get_state()))   # the checkpoint stores JSON
  assert state["version"] == 2 and state["grain"] == {"next_index": per_epoch // 2}
  following = [next(straight) for _ in range(per_epoch)]   # into the next epoch
  for prefetch in (0, 4):
    resumed = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=SEED, rows=rows,
                           prefetch=prefetch)
    resumed.set_state(state)
    for want in following:
      assert_same(next(resumed), want)


def test_a_state_of_the_hand_written_iterator_resumes_the_same_stream(corpus):
  """A checkpoint saved before the move to grain holds {"version": 1, "batch": n}."""
  fresh = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=SEED)
  old = {"version": 1, "batch": 40, **fresh.fingerprint}
  resumed = TokenBatches(corpus, seq_len=SEQ, batch_size=BATCH, seed=SEED, rows=(1, 3))
  resumed.set_state(old)
  want = reference_batches(corpus, seed=SEED, rows=(1, 3), start=40)
  for _ in range(50):
    assert_same(next(resumed), next(want))
  assert resumed.get_state()["grain"] == {"next_index": 90}
  with pytest.raises(TokenDataError, match="state has version 3"):
    fresh.set_state({**old, "version": 3})
  with pytest.raises(TokenDataError, match="different token data"):
    fresh.set_state({**old, "seed": SEED + 1})


def test_the_validation_batches_are_fixed(corpus):
  first = token_eval_batches(corpus, seq_len=SEQ, batch_size=BATCH, max_batches=100)
  again = token_eval_batches(corpus, seq_len=SEQ, batch_size=BATCH, max_batches=100)
  for a, b in zip(first, again, strict=True):
    assert_same(a, b)
  assert digest(first) == RECORDED_EVAL   # as the hand-written batching gave them
  assert len(token_eval_batches(corpus, seq_len=SEQ, batch_size=BATCH, max_batches=3)) == 3
