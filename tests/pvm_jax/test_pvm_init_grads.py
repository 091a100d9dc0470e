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


def test_only_the_gate_has_gradient_at_init():
  pvm = PVM(CONFIG, rngs=nnx.Rngs(0))
  g = abs_max(grads_of(pvm, *batch()))
  assert g["gate"] > 1e-4
  assert g["w_up"] == 0.0
  others = {k: val for k, val in g.items() if k != "gate"}
  assert others and all(val == 0.0 for val in others.values()), others


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
  g = abs_max(grads_of(pvm, x, v, target))
  assert all(val == 0.0 for val in g.values()), g
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(pvm, nnx.Param)))
  opt = nnx.Optimizer(pvm, optax.adamw(1e-2, weight_decay=0.1), wrt=nnx.Param)
  for _ in range(3):
    train_step(pvm, opt, x, v, target)
  after = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(pvm, nnx.Param)))
  assert float(np.abs(after["gate"])) == 0.0
  np.testing.assert_array_equal(after["w_up"], 0.0)
  # The other parameters move only by weight decay, never by the loss:
  # AdamW with zero gradients applies p <- p·(1 - lr·wd) per step.
  for name, value in after.items():
    np.testing.assert_allclose(value, before[name] * (1 - 1e-2 * 0.1) ** 3, rtol=1e-5,
                               err_msg=name)
  g_after = abs_max(grads_of(pvm, x, v, target))
  assert all(val == 0.0 for val in g_after.values()), g_after
