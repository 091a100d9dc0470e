"""The train step with frozen leaves: it differentiates the trained ones only.

The memory branch of an lm_lngram smoke model trains, the backbone is frozen (the VLM
Stage I pattern). Against the same step without the mask (whose optimiser zeroes the
frozen gradients anyway): the same trained parameters, frozen ones bit-unchanged, a
grad norm over the trained leaves alone, with and without gradient accumulation; and the
backward holds fewer matmuls, because no frozen weight gets a gradient.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from experiments.configs import load_config
from experiments.jobs.lm.task import lm_loss
from experiments.models import DecoderLM, lm_config
from experiments.trainer import optimizer as optim_lib
from experiments.trainer import step as step_lib

B, T = 4, 16


def _branch_only(path: str) -> bool:
  return "/memory/" in f"/{path}/"


@pytest.fixture(scope="module")
def setup():
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(0))
  # Make the zero-init branch output live, so its gradients and the backbone's differ.
  model.blocks[1].memory.w_o[...] = 0.05 * jax.random.normal(
      jax.random.key(3), model.blocks[1].memory.w_o.shape)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  tx = optim_lib.make_optimizer(config.optim, params, 10, trainable=_branch_only)
  lr = optim_lib.learning_rate_schedule(config.optim, 10)
  tokens = jax.random.randint(jax.random.key(0), (B, T + 1), 0, 256, dtype=jnp.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "segment_ids": jnp.ones((B, T), jnp.int32),
           "positions": jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)),
           "loss_mask": jnp.ones((B, T), jnp.float32)}
  frozen = optim_lib.frozen_mask(params, _branch_only, config.optim)
  return graphdef, params, rest, tx, lr, batch, frozen


def _state(params, tx):
  return {"params": jax.tree.map(jnp.array, params), "opt_state": tx.init(params),
          "step": jnp.zeros((), jnp.int32)}


def test_the_frozen_mask_names_the_backbone():
  params = {"blocks": {1: {"memory": {"w": jnp.ones(2)}, "mlp": {"w": jnp.ones(2)}}}}
  mask = optim_lib.frozen_mask(params, _branch_only)
  assert mask == {"blocks": {1: {"memory": {"w": False}, "mlp": {"w": True}}}}
  assert optim_lib.frozen_mask(params) is None   # nothing frozen: no mask


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_a_masked_step_equals_the_unmasked_one_on_the_trained_leaves(setup, grad_accum):
  graphdef, params, rest, tx, lr, batch, frozen = setup
  plain = step_lib.make_train_step(graphdef, tx, lr, lm_loss, grad_accum=grad_accum)
  masked = step_lib.make_train_step(graphdef, tx, lr, lm_loss, grad_accum=grad_accum,
                                    frozen=frozen)
  # Two steps: the warm-up's LR is 0 at step 0.
  want, _ = plain(_state(params, tx), rest, batch)
  got, _ = masked(_state(params, tx), rest, batch)
  (want, m_want), (got, m_got) = plain(want, rest, batch), masked(got, rest, batch)
  np.testing.assert_allclose(m_got["train/loss"], m_want["train/loss"], rtol=1e-6)
  flat_frozen = jax.tree.leaves(frozen)
  assert any(flat_frozen) and not all(flat_frozen)

  def select(tree, is_frozen):
    """`tree` with the leaves whose frozen flag is not `is_frozen` left out (None)."""
    return jax.tree.map(lambda x, f: x if f == is_frozen else None, tree, frozen)

  chex.assert_trees_all_equal(select(got["params"], True), select(params, True))  # bit-unchanged
  chex.assert_trees_all_close(select(got["params"], False), select(want["params"], False),
                              rtol=1e-5, atol=1e-7)
  assert any(not np.array_equal(g, p0) for g, p0 in zip(
      jax.tree.leaves(select(got["params"], False)), jax.tree.leaves(select(params, False)),
      strict=True))
  # The norm the optimiser clips: the trained leaves' gradients alone (at step 1's params).
  before = jax.tree.map(jnp.array, plain(_state(params, tx), rest, batch)[0]["params"])
  grads = jax.jit(jax.grad(lambda p: lm_loss(nnx.merge(graphdef, p, rest), batch)[0]))(before)
  np.testing.assert_allclose(m_got["train/grad_norm"], optax.tree.norm(select(grads, False)),
                             rtol=1e-4)
  assert m_want["train/grad_norm"] > 1.01 * m_got["train/grad_norm"]   # the old norm: all


def test_the_backward_computes_no_frozen_weight_gradient(setup):
  graphdef, params, rest, tx, lr, batch, frozen = setup

  def dots(**kw):
    step = step_lib.make_train_step(graphdef, tx, lr, lm_loss, **kw)
    jaxpr = str(step.trace(_state(params, tx), rest, batch).jaxpr)
    return jaxpr.count("dot_general")

  assert dots(frozen=frozen) < dots()


def test_a_mask_of_another_tree_is_refused(setup):
  graphdef, params, rest, tx, lr, batch, frozen = setup
  step = step_lib.make_train_step(graphdef, tx, lr, lm_loss, frozen={"w": True})
  with pytest.raises(ValueError, match="frozen mask has 1 leaves"):
    step(_state(params, tx), rest, batch)
