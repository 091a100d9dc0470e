"""Every memory arm inside the decoder LM: cached decoding, and train + restore (one arm through the CLI)."""

import json

import jax
import numpy as np
import pytest
from cli_runner import run_cli
from flax import nnx

from experiments.configs import load_config
from experiments.jobs import run_train
from experiments.jobs.lm.evaluate import evaluate_run
from experiments.jobs.restore import restore
from experiments.models import DecoderLM, generate, lm_config

ARMS = ["lm_pkm.py:smoke,gated", "lm_engram.py:smoke", "lm_lngram_v1.py:smoke",
        "lm_sparse_ffn.py:smoke", "lm_lngram.py:smoke,nosink"]


def _live_model(spec):
  """The smoke model with every memory parameter moved off its init (zero-init
  outputs would make cached decoding trivially right)."""
  model = DecoderLM(lm_config(load_config(f"experiments/configs/{spec}")), rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))
  key = jax.random.key(1)
  moved = []
  for i, (path, leaf) in enumerate(leaves):
    on_memory = any(getattr(p, "key", None) == "memory" for p in path)
    noise = 0.3 * jax.random.normal(jax.random.fold_in(key, i), leaf.shape, leaf.dtype)
    moved.append(leaf + noise if on_memory else leaf)
  nnx.replace_by_pure_dict(state, jax.tree_util.tree_unflatten(treedef, moved))
  nnx.update(model, state)
  return model


@pytest.mark.parametrize("spec", ARMS)
def test_cached_decoding_equals_full_recompute(spec):
  model = _live_model(spec)
  prompts = jax.random.randint(jax.random.key(2), (2, 9), 0, 256, dtype=np.int32)
  kwargs = dict(prompt_lengths=np.array([9, 5]), max_new_tokens=6, rng=jax.random.key(3),
                greedy=True, return_logp=True)
  cached, logp_cached = generate(model, prompts, use_cache=True, **kwargs)
  full, logp_full = generate(model, prompts, use_cache=False, **kwargs)
  np.testing.assert_array_equal(np.asarray(cached), np.asarray(full))
  np.testing.assert_allclose(np.asarray(logp_cached), np.asarray(logp_full), rtol=1e-4,
                             atol=1e-5)


@pytest.mark.parametrize("spec", ARMS)
def test_train_save_and_restore(spec, tmp_path):
  """The first arm trains through the command line; the command is the same for every
  arm, so the others train through its in-process entry point (no second interpreter
  start). Each arm trains, saves, restores and evaluates as it trained."""
  workdir = tmp_path / "run"
  train = {"steps": 2, "eval_every": 2, "ckpt_every": 2, "progress": False}
  if spec == ARMS[0]:
    done = run_cli("train", f"--config=experiments/configs/{spec}", f"--workdir={workdir}",
                   *(f"--config.train.{k}={v}" for k, v in train.items()))
    assert done.returncode == 0, done.stderr[-3000:]
  else:
    config = load_config(f"experiments/configs/{spec}")
    config.train.update(**train)
    assert run_train(config, workdir)["step"] == 2
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  [final] = [r for r in rows if "eval/bits_per_byte" in r]
  model, config = restore(workdir)
  assert config.restored_step == 2
  built = nnx.eval_shape(lambda: DecoderLM(lm_config(load_config(f"experiments/configs/{spec}")),
                                           rngs=nnx.Rngs(0)))
  assert type(model.blocks[1].memory).__name__ == type(built.blocks[1].memory).__name__
  again = evaluate_run(workdir)
  for key, value in final.items():
    if key != "step" and not key.startswith("train/"):
      np.testing.assert_allclose(again[key], value, rtol=1e-6, err_msg=key)
