"""Stage I's loss under gradient accumulation: a micro-batch reads its own images' grids,
and two micro-batches give the gradient of the whole batch (weighted by targets)."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from experiments.jobs.qwen3vl.sft import micro_grid, sft_loss
from experiments.trainer.step import make_train_step
from experiments.vlm.qwen3vl.model import Qwen3VL
from experiments.vlm.qwen3vl.random_config import RANDOM_VOCAB, random_qwen3vl_config

GRID = (1, 4, 4)   # 16 patches, 4 merged image tokens per row


def _batch(model, rows=2):
  c, rng = model.config, np.random.default_rng(0)
  ids = np.stack([[3, c.vision_start_token_id] + [c.image_token_id] * 4
                  + [c.vision_end_token_id] + list(rng.integers(0, RANDOM_VOCAB - 8, 6))
                  for _ in range(rows)])
  grid = np.asarray([GRID] * rows)
  loss_mask = np.zeros(ids.shape, bool)
  loss_mask[0, -2:] = loss_mask[1, -5:] = True          # unequal targets per row
  positions = np.asarray(model.positions(ids, grid, np.ones_like(ids)))
  batch = dict(input_ids=ids.astype(np.int32), attention_mask=np.ones(ids.shape, np.int32),
               loss_mask=loss_mask, position_ids=positions.transpose(1, 0, 2),
               pixel_values=rng.normal(size=(16 * rows, 96)).astype(np.float32))
  return batch, grid


def test_micro_grid_takes_the_leading_images_and_refuses_a_split_image():
  grid = np.asarray([GRID, GRID, (1, 8, 4)])
  np.testing.assert_array_equal(micro_grid(grid, 16), grid[:1])
  np.testing.assert_array_equal(micro_grid(grid, 64), grid)
  with pytest.raises(ValueError, match="grad_accum"):
    micro_grid(grid, 24)


def test_two_micro_batches_equal_the_whole_batch():
  model = Qwen3VL(random_qwen3vl_config(), rngs=nnx.Rngs(0))
  batch, grid = _batch(model)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.sgd(1.0)
  out = {}
  for k in (1, 2):
    state = {"params": jax.tree.map(lambda a: a.copy(), params), "opt_state": tx.init(params),
             "step": np.int32(0)}
    step = make_train_step(graphdef, tx, lambda s: 1.0, sft_loss(grid), grad_accum=k)
    out[k] = step(state, rest, batch)
  (s1, m1), (s2, m2) = out[1], out[2]
  np.testing.assert_allclose(float(m2["train/loss"]), float(m1["train/loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(m2["train/grad_norm"]), float(m1["train/grad_norm"]),
                             rtol=1e-4)
  for a, b in zip(jax.tree.leaves(s1["params"]), jax.tree.leaves(s2["params"]), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_each_rows_own_image_as_pvm_memory_changes_nothing_but_its_width():
  """PVM's memory of a row's own image tokens (`images_per_row`: 4 slots) against the
  default min(T, the batch's visual tokens) (8 slots, the other row's masked): the same
  gradients, whole batch and in two micro-batches."""
  from experiments.vlm.qwen3vl.pvm import with_pvm
  config = random_qwen3vl_config()
  config = with_pvm(config, (config.text.n_layers - 1,), 2 * config.text.head_dim)
  model = Qwen3VL(config, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = jax.tree.map(lambda a: a + 0.1 if a.ndim == 0 else a, params)   # open the gate λ
  batch, grid = _batch(model)
  tx = optax.sgd(1.0)

  def gradient(loss, k):   # one SGD step of rate 1 takes the gradient off the parameters
    state = {"params": jax.tree.map(lambda a: a.copy(), params), "opt_state": tx.init(params),
             "step": np.int32(0)}
    after = make_train_step(graphdef, tx, lambda s: 1.0, loss, grad_accum=k)(
        state, rest, batch)[0]["params"]
    return jax.tree.map(lambda p, a: np.asarray(p) - np.asarray(a), params, after)

  for k in (1, 2):
    default = gradient(sft_loss(grid), k)
    own = gradient(sft_loss(grid, images_per_row=1), k)
    pvm = [g for path, g in jax.tree_util.tree_leaves_with_path(own) if "ffn_branch" in
           jax.tree_util.keystr(path)]
    assert pvm and max(np.abs(g).max() for g in pvm) > 1e-4   # the branch trains
    for a, b in zip(jax.tree.leaves(default), jax.tree.leaves(own), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
