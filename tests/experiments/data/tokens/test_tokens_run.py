"""A run on token data: the vocabulary rule, the run record, resume checks."""

import json

import ml_collections
import pytest
from tokens_inputs import VAL_FRACTION

from experiments.data.tokens import TokenDataError, prepare
from experiments.data.tokens import run as token_run


@pytest.fixture(scope="module")
def data_dirs(corpus_inputs, tmp_path_factory):
  """The same inputs prepared with the test tokenizer and as bytes."""
  spec, _, tokenizer = corpus_inputs
  root = tmp_path_factory.mktemp("run_data")
  prepare(spec, str(tokenizer), str(root / "tok"), val_fraction=VAL_FRACTION, progress=False)
  prepare(spec, "bytes", str(root / "bytes"), val_fraction=VAL_FRACTION, progress=False)
  return root / "tok", root / "bytes"


def config(path, vocab_size=0, init_from="", **data):
  return ml_collections.ConfigDict({
      "model": {"vocab_size": vocab_size}, "init_from": init_from,
      "data": {"kind": "tokens", "path": str(path), "seq_len": 16, "batch_size": 4, "seed": 0,
               "eval_batches": 2, "allow_corpus_change": False, **data}})


def fake_checkpoint(workdir, step=2):
  (workdir / "checkpoints" / str(step)).mkdir(parents=True)


def test_the_vocabulary_comes_from_the_manifest_unless_set(data_dirs, tmp_path):
  tok, _ = data_dirs
  assert token_run.run_data(config(tok), tmp_path / "a").vocab_size == 320
  assert token_run.run_data(config(tok, 512), tmp_path / "b").vocab_size == 512
  with pytest.raises(TokenDataError, match="model.vocab_size=300 cannot hold .* has 320"):
    token_run.run_data(config(tok, 300), tmp_path / "c")


def test_the_run_keeps_its_tokenizer_and_refuses_another(data_dirs, tmp_path):
  tok, raw = data_dirs
  data = token_run.run_data(config(tok), tmp_path)
  assert data.batches.get_state()["data_sha256"] == data.corpus.digest
  record = json.loads((tmp_path / token_run.RECORD).read_text())
  assert record["tokenizer"]["vocab_size"] == 320
  assert (tmp_path / "tokenizer.json").read_bytes() == (tok / "tokenizer.json").read_bytes()
  token_run.run_data(config(raw), tmp_path)   # no checkpoint yet: a fresh start
  token_run.run_data(config(tok), tmp_path)
  fake_checkpoint(tmp_path)
  with pytest.raises(TokenDataError, match="tokenized with tokenizer bytes .*not this run's"):
    token_run.run_data(config(raw), tmp_path)
  with pytest.raises(TokenDataError, match="tokenized with tokenizer bytes"):
    token_run.eval_data(config(raw), tmp_path, 1)
  assert len(token_run.eval_data(config(tok), tmp_path, 1)) == 1


def test_changed_shards_need_allow_corpus_change(corpus_inputs, tmp_path):
  spec, _, tokenizer = corpus_inputs
  data = tmp_path / "data"
  prepare(spec, str(tokenizer), str(data), val_fraction=VAL_FRACTION, progress=False)
  run = tmp_path / "run"
  first = token_run.run_data(config(data), run)
  state = first.batches.get_state()
  fake_checkpoint(run)
  prepare(spec.split(",", 1)[1], str(tokenizer), str(data), val_fraction=VAL_FRACTION,
          progress=False)   # one input file fewer
  with pytest.raises(TokenDataError, match="differs from the data this run's checkpoints"):
    token_run.run_data(config(data), run)
  again = token_run.run_data(config(data, allow_corpus_change=True), run)
  again.batches.set_state(state)   # the same stream settings, other shards
  assert (run / "token_data.2.json").is_file()


def test_kind_and_path_are_checked():
  assert token_run.data_kind(ml_collections.ConfigDict({"data": {"path": ""}})) == "bytes"
  with pytest.raises(ValueError, match="data.kind='words' is not one of"):
    token_run.data_kind(config("x", kind="words"))
  with pytest.raises(ValueError, match="needs data.path"):
    token_run.data_kind(config(""))


def test_a_branch_that_reads_byte_ids_is_refused():
  from experiments.configs import load_config
  from experiments.models.config import lm_config

  model = lm_config(load_config("experiments/configs/lm_engram.py:smoke"))
  with pytest.raises(TokenDataError, match="memory.vocab_size=256 cannot hold the data's 320"):
    token_run.model_vocab(model, 320)
  with pytest.raises(TokenDataError, match="case_fold=True folds byte ids"):
    token_run.model_vocab(model, 200)
  plain = lm_config(load_config("experiments/configs/lm_lngram.py:smoke"))
  assert token_run.model_vocab(plain, 320).vocab_size == 320


def test_init_from_a_run_of_another_tokenizer_is_refused(data_dirs, tmp_path):
  tok, raw = data_dirs
  token_run.run_data(config(tok), tmp_path / "tok_run")
  byte_run = tmp_path / "byte_run"   # a byte-level run keeps no token_data.json
  byte_run.mkdir()
  token_run.run_data(config(raw, init_from=""), tmp_path / "a")
  with pytest.raises(TokenDataError, match="not the init_from run's bytes .vocabulary 256"):
    token_run.run_data(config(tok, init_from=str(byte_run)), tmp_path / "b")
  token_run.run_data(config(raw, init_from=str(byte_run)), tmp_path / "c")
  with pytest.raises(TokenDataError, match="not the init_from run's [0-9a-f]{12} .vocabulary 320"):
    token_run.run_data(config(raw, init_from=str(tmp_path / "tok_run")), tmp_path / "d")
  token_run.run_data(config(tok, init_from=str(tmp_path / "tok_run")), tmp_path / "e")

  # A checkpoint with a tokenizer.json (an hf:DIR backbone) is checked against it.
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "tokenizer.json").write_bytes((tok / "tokenizer.json").read_bytes())
  token_run.run_data(config(tok, init_from=f"hf:{hf}"), tmp_path / "f")
  with pytest.raises(TokenDataError, match="not the init_from checkpoint hf:"):
    token_run.run_data(config(raw, init_from=f"hf:{hf}"), tmp_path / "g")


def test_the_analyses_read_a_token_runs_documents_back_as_text(corpus_inputs, data_dirs,
                                                               tmp_path):
  """`lngram-exp analyze` reads a token run's documents (tests/experiments/data/tokens/
  test_tokens_analyze.py runs it): every document's ids give back its text, each token a
  span of it, with the byte-level BPE (non-ASCII split inside characters) and "bytes"."""
  import numpy as np

  from experiments.analysis import token_docs

  _, files, _ = corpus_inputs
  texts = {text for docs in files.values() for text in docs}
  for data_dir in data_dirs:
    workdir = tmp_path / data_dir.name
    token_run.run_data(config(data_dir), workdir)   # the run's record and tokenizer copy
    data = token_docs.TokenRunData(workdir, config(data_dir))
    ref, held, unreadable = token_docs.split_docs(data, n_reference=10, seed=0)
    assert unreadable == 0 and len(ref) == 10 and len(held) == len(data.corpus.val_docs)
    again = token_docs.split_docs(data, n_reference=10, seed=0)[0]   # seeded
    assert [(d.path, d.data) for d in again] == [(d.path, d.data) for d in ref]
    for doc in ref + held:
      assert doc.data.decode("utf-8") in texts   # the EOS token data appends holds no text
      assert doc.ids.size == doc.starts.size and doc.ends[-1] == len(doc.data)
      np.testing.assert_array_equal(doc.starts[1:], doc.ends[:-1])
      assert (doc.ends > doc.starts).all() and doc.starts[0] == 0
    names = [doc.path for doc in ref + held]
    assert len(set(names)) == len(names)   # one name per document, across the splits
    assert any("#" in n for n in names) and all(".txt" in n or "#" in n for n in names)
    assert [len(d) for d in data.val_docs] == [d.ids.size for d in held]
