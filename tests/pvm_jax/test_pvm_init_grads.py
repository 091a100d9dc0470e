"""What the zero-init gate really does to the gradients at step 0.

The branch output is y = λ·n with n = RMSNorm(h W_up) (affine-free). Hence

    ∂L/∂λ    = Σ ⟨g, n⟩            nonzero as soon as W_up ≠ 0 (n ≠ 0);
    ∂L/∂W_up = λ · (...)           exactly 0 while λ = 0,

and the same factor λ multiplies the gradient of every other branch
parameter. So at step 0 ONLY the gate has a gradient; one optimizer step
moves λ off zero and from then on every branch parameter, W_up included,
has a nonzero gradient. (The sentence "both gradients are nonzero at init"
is not true of W_up; what is true is tested below.)

The official init, W_up = 0 and λ = 0, gives n = RMSNorm(0) = 0 as well, so
∂L/∂λ = 0 too: every gradient is exactly zero, an optimizer step changes
nothing, and the branch never trains (a stationary point).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from pvm_jax import PVM, PVMConfig

D, NV, T = 16, 4, 5
CONFIG = PVMConfig(d_model=D, latent_dim=16, head_dim=8, latent_ffn_dim=16)


def batch():
  keys = jax.random.split(jax.random.key(7), 3)
  x = jax.random.normal(keys[0], (2, T, D))
  v = jax.random.normal(keys[1], (2, NV, D))
  target = jax.random.normal(keys[2], (2, T, D))
  return x, v, target


def loss_fn(pvm, x, v, target):
  # The residual stream with the branch added, fit to an arbitrary target.
  return jnp.mean((x + pvm(x, visual=v) - target) ** 2)


@nnx.jit
def grads_of(pvm, x, v, target):
  return nnx.grad(loss_fn)(pvm, x, v, target)


@nnx.jit
def train_step(pvm, opt, x, v, target):
  opt.update(pvm, nnx.grad(loss_fn)(pvm, x, v, target))


def abs_max(grads) -> dict[str, float]:
  """max |gradient| per parameter name."""
  return {name: float(jnp.abs(g).max()) for name, g in nnx.to_pure_dict(grads).items()}


def assert_all_zero(tree):
  chex.assert_trees_all_equal(tree, jax.tree.map(jnp.zeros_like, tree))


def test_only_the_gate_has_gradient_at_init():
  pvm = PVM(CONFIG, rngs=nnx.Rngs(0))
  grads = nnx.to_pure_dict(grads_of(pvm, *batch()))
  chex.assert_trees_all_equal_shapes_and_dtypes(grads, nnx.to_pure_dict(nnx.state(pvm, nnx.Param)))
  assert float(jnp.abs(grads["gate"])) > 1e-4
  others = {k: val for k, val in grads.items() if k != "gate"}
  assert "w_up" in others
  assert_all_zero(others)


def test_one_step_wakes_every_branch_parameter():
  pvm = PVM(CONFIG, rngs=nnx.Rngs(0))
  opt = nnx.Optimizer(pvm, optax.sgd(1e-1), wrt=nnx.Param)
  x, v, target = batch()
  train_step(pvm, opt, x, v, target)
  assert float(jnp.abs(pvm.gate[...])) > 0
  g = abs_max(grads_of(pvm, x, v, target))
  assert g["w_up"] > 1e-6
  dead = {k: val for k, val in g.items() if not val > 0}
  assert not dead, f"parameters still without gradient after one step: {dead}"


def test_official_double_zero_init_is_a_stationary_point():
  pvm = PVM(CONFIG.replace(up_init="zero"), rngs=nnx.Rngs(0))
  x, v, target = batch()
  assert_all_zero(grads_of(pvm, x, v, target))
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(pvm, nnx.Param)))
  opt = nnx.Optimizer(pvm, optax.adamw(1e-2, weight_decay=0.1), wrt=nnx.Param)
  for _ in range(3):
    train_step(pvm, opt, x, v, target)
  after = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(pvm, nnx.Param)))
  assert float(np.abs(after["gate"])) == 0.0
  np.testing.assert_array_equal(after["w_up"], 0.0)
  # The other parameters move only by weight decay, never by the loss:
  # AdamW with zero gradients applies p <- p·(1 - lr·wd) per step.
  chex.assert_trees_all_close(after, jax.tree.map(lambda p: p * (1 - 1e-2 * 0.1) ** 3, before),
                              rtol=1e-5, atol=0)
  assert_all_zero(grads_of(pvm, x, v, target))
