"""recompute_after_cotangent: jax.checkpoint's values and gradients, recomputation tied to
the cotangent (experiments/models/remat.py)."""

import chex
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.models.remat import recompute_after_cotangent


def _block(params, x_BxD, aux):
  """A residual MLP block with an integer input and an integer output beside the floats."""
  h_BxF = jax.nn.silu(x_BxD @ params["w_in"]) * aux["scale_B"][:, None]
  y_BxD = x_BxD + h_BxF @ params["w_out"]
  return y_BxD, {"count": jnp.sum(aux["ids_B"]), "norm": jnp.sum(y_BxD ** 2)}


def _inputs(dtype):
  k = jax.random.split(jax.random.key(0), 4)
  params = {"w_in": jax.random.normal(k[0], (6, 10), dtype),
            "w_out": jax.random.normal(k[1], (10, 6), dtype) * 0.1}
  x_BxD = jax.random.normal(k[2], (3, 6), dtype)
  aux = {"scale_B": jax.random.uniform(k[3], (3,), dtype), "ids_B": jnp.arange(3)}
  return params, x_BxD, aux


def _loss(block):
  def loss(params, x_BxD, aux):
    for _ in range(3):   # three blocks in a row, as a decoder stacks them
      x_BxD, out = block(params, x_BxD, aux)
    return jnp.sum(jnp.tanh(x_BxD)) + 0.01 * out["norm"]
  return loss


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_values_and_gradients_equal_plain_and_checkpoint(dtype):
  with jax.enable_x64(dtype == jnp.float64):
    params, x_BxD, aux = _inputs(dtype)
    argnums = (0, 1)
    plain = jax.value_and_grad(_loss(_block), argnums)(params, x_BxD, aux)
    ckpt = jax.value_and_grad(_loss(jax.checkpoint(_block)), argnums)(params, x_BxD, aux)
    ordered = jax.jit(jax.value_and_grad(_loss(recompute_after_cotangent(_block)),
                                         argnums))(params, x_BxD, aux)
    assert ordered[0].dtype == dtype
    assert all(g.dtype == dtype for g in jax.tree.leaves(ordered[1]))
    tol = 1e-12 if dtype == jnp.float64 else 1e-5
    chex.assert_trees_all_close(ordered, plain, rtol=tol, atol=tol)
    chex.assert_trees_all_close(ordered, ckpt, rtol=tol, atol=tol)
    # The forward values too (the wrapper computes f itself).
    np.testing.assert_array_equal(
        recompute_after_cotangent(_block)(params, x_BxD, aux)[0],
        _block(params, x_BxD, aux)[0])


def test_backward_recomputes_after_the_cotangent_only():
  """In the pullback's program the optimization barrier holds the incoming cotangent: the
  recomputed forward (after the barrier) depends on it, so it cannot be hoisted."""
  params, x_BxD, aux = _inputs(jnp.float32)
  f = recompute_after_cotangent(_block)
  out, pullback = jax.vjp(f, params, x_BxD, aux)
  jaxpr = jax.make_jaxpr(pullback)(out).jaxpr
  barriers = [e for e in _all_eqns(jaxpr) if e.primitive.name == "optimization_barrier"]
  assert barriers, "no optimization barrier in the backward"
  cotangent_vars = set(jaxpr.invars)
  assert any(v in cotangent_vars for e in barriers for v in e.invars), (
      "the barrier does not take the cotangent")
  # ... and the recomputed matmul reads the barrier's outputs, not the saved inputs.
  tied = {v for e in barriers for v in e.outvars}
  dots = [e for e in _all_eqns(jaxpr) if e.primitive.name == "dot_general"]
  assert dots and any(set(e.invars) & tied for e in dots)


def _all_eqns(jaxpr):
  for e in jaxpr.eqns:
    yield e
    for sub in jax.extend.core.jaxprs_in_params(e.params):
      yield from _all_eqns(sub)
