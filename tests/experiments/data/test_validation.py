"""The per-document validation set (experiments/data/validation.py), deduplicated against
training on request, its per-document losses in the LM evaluation, and paired seeds: every
arm of a seed starts from the same backbone."""

import numpy as np
import pytest
from flax import nnx

from experiments.configs import load_config
from experiments.data import validation
from experiments.jobs.lm.task import evaluate_batches, make_eval_step
from experiments.models import DecoderLM, lm_config


def _docs():
  rng = np.random.default_rng(0)
  return [rng.integers(0, 256, n).astype(np.uint8) for n in (1, 50, 7, 300, 2)], \
      ["empty.py", "a.py", "b.py", "long.py", "two.py"]


def test_windows_cap_every_document_and_batches_keep_one_document_per_row():
  docs, names = _docs()
  w = validation.validation_windows(docs, names, cap=40)
  assert w.names == ("a.py", "b.py", "long.py", "two.py")      # one byte: no target
  assert [d.size for d in w.docs] == [40, 7, 40, 2] and w.units == 89
  assert w.largest_share() == pytest.approx(40 / 89)
  batches = validation.validation_batches(w, seq_len=16, batch_size=3)
  rows = [(b, i) for b in batches for i in range(3)]
  for k, window in enumerate(w.docs):   # the document's targets, in order, exactly once
    mine = [(b, i) for b, i in rows if b["doc"][i] == k]
    inputs = np.concatenate([b["inputs"][i][b["loss_mask"][i] > 0] for b, i in mine])
    targets = np.concatenate([b["targets"][i][b["loss_mask"][i] > 0] for b, i in mine])
    np.testing.assert_array_equal(inputs, window[:-1])
    np.testing.assert_array_equal(targets, window[1:])
    for b, i in mine:
      real = b["loss_mask"][i] > 0
      assert (b["segment_ids"][i] == real).all() and (b["positions"][i][real]
                                                      == np.arange(real.sum())).all()
  pad = [(b, i) for b, i in rows if b["doc"][i] < 0]
  assert pad and all(b["loss_mask"][i].sum() == 0 for b, i in pad)


def test_budget_takes_documents_at_an_even_stride():
  docs = [np.zeros(100, np.uint8) for _ in range(10)]
  w = validation.validation_windows(docs, [f"{i}" for i in range(10)], cap=100, budget=500)
  assert w.names == ("0", "2", "4", "6", "8")
  with pytest.raises(ValueError, match="cap=1"):
    validation.validation_windows(docs, list("0123456789"), cap=1)


def test_the_default_validation_set_spreads_over_every_validation_file():
  """>= 400 KB, no file above 10%, every validation file with a target."""
  from experiments.data.corpus import corpus_spec, load_corpus
  config = load_config("experiments/configs/lm_lngram.py")
  corpus = load_corpus(corpus_spec(config))
  w = validation.config_windows(corpus.val_docs, corpus.val_paths, config.data)
  assert w.units >= 400_000 and w.largest_share() <= 0.10
  assert len(w.names) == sum(d.size >= 2 for d in corpus.val_docs)


def test_per_document_losses_add_up_to_the_evaluation_and_round_trip(tmp_path):
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=0))
  docs, names = _docs()
  w = validation.validation_windows(docs, names, cap=40)
  batches = validation.validation_batches(w, seq_len=16, batch_size=4)
  per_doc = {}
  graphdef, state = nnx.split(model, nnx.Param)
  step, state = make_eval_step(graphdef), nnx.to_pure_dict(state)
  out = evaluate_batches(step, state, batches, model.config.memory, per_doc=per_doc)
  plain = [{k: v for k, v in b.items() if k != "doc"} for b in batches]
  assert out == evaluate_batches(step, state, plain, model.config.memory)   # doc: host only
  np.testing.assert_array_equal(per_doc["tokens"], [d.size - 1 for d in w.docs])
  assert per_doc["nats"].sum() == pytest.approx(out["eval/loss"] * out["eval/tokens"], rel=1e-6)
  path = validation.write_per_doc(tmp_path, 4, "byte", w.names, per_doc["nats"],
                                  per_doc["tokens"])
  back = validation.read_per_doc(tmp_path)
  assert path.name == validation.PER_DOC_FILE and back["names"] == list(w.names)
  assert back["bits_per_unit"] == pytest.approx(out["eval/bits_per_byte"], rel=1e-6)
  np.testing.assert_array_equal(back["nats"], per_doc["nats"])


def _flat(spec, seed):
  model = DecoderLM(lm_config(load_config(f"experiments/configs/{spec}")),
                    rngs=nnx.Rngs(params=seed))
  return {"/".join(map(str, k)): np.asarray(v)
          for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("arm", ["lm_lngram.py:smoke", "lm_engram.py:smoke", "lm_pkm.py:smoke",
                                 "lm_lngram_v1.py:smoke", "lm_sparse_ffn.py:smoke"])
def test_a_seed_gives_every_arm_the_baseline_s_backbone(arm):
  """Memory-slot branches draw after the backbone: same seed, bit-identical backbone."""
  base, other = _flat("lm_baseline.py:smoke", 3), _flat(arm, 3)
  assert set(base) < set(other) and all("/memory/" in k for k in set(other) - set(base))
  for key, value in base.items():
    np.testing.assert_array_equal(other[key], value, err_msg=key)
  assert any(not np.array_equal(_flat("lm_baseline.py:smoke", 4)[k], v) for k, v in base.items())


def _dedup_config(cap=40, dedup=True):
  import ml_collections
  return ml_collections.ConfigDict({"kind": "bytes", "val_doc_cap": cap, "val_budget": 0,
                                    "dedup_validation": dedup, "seq_len": 16,
                                    "batch_size": 3})


def _code(text: str) -> np.ndarray:
  return np.frombuffer(text.encode(), np.uint8)


def test_validation_deduplicated_against_training_leaves_out_the_twins(tmp_path):
  """A validation file whose normalised lines equal a training file's (another literal,
  another comment) is left out, named with its twins; the rest is the full set's."""
  from experiments.data import dedup
  train = {"t/codec_a.py": _code("x = {1: 'a'}  # table a\n"), "t/other.py": _code("y = 2\n"),
           "t/empty.py": _code("# only a comment\n")}
  val = {"v/codec_b.py": _code("x = {7: 'b'}\n"), "v/own.py": _code("def f():\n  return 3\n"),
         "v/blank.py": _code("# nothing\n\n")}
  names, docs = list(val), list(val.values())
  config = _dedup_config()
  train_split = (tuple(train), tuple(train.values()))
  w = validation.config_windows(docs, names, config, train=train_split)
  assert w.names == ("v/own.py", "v/blank.py")            # comment-only files share nothing
  assert w.dedup.removed == ("v/codec_b.py",) and w.dedup.twins == {
      "v/codec_b.py": ("t/codec_a.py",)}
  assert w.dedup.units == val["v/codec_b.py"].size
  _, held = dedup.cross_split_duplicates(train.items(), val.items())
  assert set(w.dedup.removed) == held                     # the analyses' rule, exactly
  assert w.describe()["dedup"]["count"] == 1
  full = validation.config_windows(docs, names, _dedup_config(dedup=False), train=train_split)
  assert full.dedup is None and full.names == tuple(names)
  # Token data has no near-duplicates to leave out: the option leaves it unchanged.
  tokens = _dedup_config()
  tokens.kind = "tokens"
  assert validation.config_windows(docs, names, tokens).names == tuple(names)
  with pytest.raises(ValueError, match="val_doc_cap > 0"):
    validation.config_windows(docs, names, _dedup_config(cap=0), train=train_split)


def test_the_deduplicated_record_names_what_was_left_out_and_rescores_the_full_one(tmp_path):
  docs, names = _docs()
  train = (("t.py",), (docs[3].copy(),))                   # long.py's twin in training
  batches, kept = validation.config_batches(docs, names, _dedup_config(cap=400), default=list,
                                            train=train)
  assert list(kept) == ["a.py", "b.py", "two.py"] and kept.dedup.removed == ("long.py",)
  rng = np.random.default_rng(1)
  nats = {n: float(rng.uniform(1, 5)) for n in names}
  tokens = {n: float(d.size - 1) for n, d in zip(names, docs, strict=True)}
  full = [n for n in names if tokens[n] > 0]
  (tmp_path / "full").mkdir()
  validation.write_per_doc(tmp_path / "full", 4, "byte", full, [nats[n] for n in full],
                           [tokens[n] for n in full])
  validation.write_per_doc(tmp_path, 4, "byte", kept, [nats[n] for n in kept],
                           [tokens[n] for n in kept])
  record = validation.read_per_doc(tmp_path)
  assert record["dedup"] == {"rule": "experiments/data/dedup.py", "removed": ["long.py"],
                             "count": 1, "units": 300, "twins": {"long.py": ["t.py"]}}
  # The full set's record scored on the deduplicated documents is the deduplicated record.
  assert validation.rescore(validation.read_per_doc(tmp_path / "full"), record["names"]) == (
      pytest.approx(record["bits_per_unit"], rel=1e-12))
  assert "dedup" not in validation.read_per_doc(tmp_path / "full")
  with pytest.raises(KeyError, match="not in the evaluation"):
    validation.rescore(record, ["long.py"])


def test_the_byte_corpus_s_near_duplicates_are_codec_tables():
  """On the standard library: the files left out are `encodings/*` tables with training
  twins; the set is the full set without them, windows unchanged."""
  from experiments.data.corpus import corpus_spec, load_corpus
  config = load_config("experiments/configs/repro_lm.py:bytes,baseline,dedup")
  assert config.data.dedup_validation
  corpus = load_corpus(corpus_spec(config))
  full = validation.config_windows(corpus.val_docs, corpus.val_paths,
                                   load_config("experiments/configs/repro_lm.py:bytes,"
                                               "baseline").data)
  w = validation.config_windows(corpus.val_docs, corpus.val_paths, config.data,
                                train=(corpus.train_paths, corpus.train_docs))
  assert w.dedup.removed and all(n.startswith("encodings/") for n in w.dedup.removed)
  assert all(t.startswith("encodings/") for twins in w.dedup.twins.values() for t in twins)
  assert set(w.names) | set(w.dedup.removed) == set(full.names)
  assert w.units + w.dedup.units == full.units
  keep = {n: d for n, d in zip(full.names, full.docs, strict=True)}
  for name, doc in zip(w.names, w.docs, strict=True):
    np.testing.assert_array_equal(doc, keep[name])
