"""Insertion into a trained model (`init_from`, the paper's App. B)."""

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.jobs import run_train
from experiments.jobs.init_from import InitFromError, insert_into
from experiments.jobs.lm.evaluate import evaluate_run
from experiments.jobs.lm.task import lm_task
from experiments.jobs.restore import restore


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory, smoke_config):
  """A 2-step memory-free smoke run (the model memory is inserted into)."""
  workdir = tmp_path_factory.mktemp("baseline")
  run_train(smoke_config("lm_baseline", steps=2, ckpt_every=2, eval_every=2), workdir)
  return workdir


def _params(model):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_step0_equals_the_source_model_bit_for_bit(baseline_run, smoke_config, tmp_path):
  config = smoke_config("lm_lngram", steps=2, ckpt_every=2, eval_every=2)
  config.init_from = str(baseline_run)
  task = lm_task(config, tmp_path / "inserted")
  source, _ = restore(baseline_run)
  ours, theirs = _params(task.module), _params(source)
  # Every backbone array is the source's; the Lngram branch is new (and at init).
  for path, value in jax.tree_util.tree_leaves_with_path(theirs):
    np.testing.assert_array_equal(_get(ours, path), value)
  assert "memory" in ours["blocks"][1] and "memory" not in theirs["blocks"][1]
  np.testing.assert_array_equal(ours["blocks"][1]["memory"]["w_o"], 0.0)
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 256, dtype=np.int32)
  np.testing.assert_array_equal(np.asarray(task.module(tokens)), np.asarray(source(tokens)))
  # The validation loss at step 0 is the source's final one, exactly.
  assert task.evaluate(task.module)["eval/loss"] == evaluate_run(baseline_run)["eval/loss"]


def _get(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def test_trains_with_its_own_optimiser_and_restores(baseline_run, smoke_config, tmp_path):
  config = smoke_config("lm_lngram", steps=2, ckpt_every=2, eval_every=2)
  config.init_from = str(baseline_run)
  result = run_train(config, tmp_path / "run")
  assert result["step"] == 2
  model, saved = restore(tmp_path / "run")
  assert saved.init_from == str(baseline_run) and model.config.memory_layers == (1,)


def test_refuses_a_different_backbone(baseline_run):
  from experiments.models import DecoderLM
  source, _ = restore(baseline_run)
  wider = source.config.replace(ffn_dim=source.config.ffn_dim * 2)
  with pytest.raises(InitFromError, match="ffn_dim"):
    insert_into(DecoderLM(wider, rngs=nnx.Rngs(0)), baseline_run)
