"""The per-document validation set (experiments/data/validation.py), its per-document losses
in the LM evaluation, and paired seeds: every arm of a seed starts from the same backbone."""

import numpy as np
import pytest
from flax import nnx

from experiments.configs import load_config
from experiments.data import validation
from experiments.models import DecoderLM, lm_config
from experiments.tasks.lm import evaluate_batches, make_eval_step


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
