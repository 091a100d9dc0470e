"""The one-bit backward as one Pallas kernel ("triton") against its XLA twins.

`surrogate_impl="triton"` gives the table and router-logit gradients of "blocks"
(packed and padded inputs, orders (2, 3), float32 and float64), and the whole
layer's gradients equal the default's. Interpret mode on CPU, tiny shapes. The
kernel alone (against its XLA reference, CUDA lowering, on a GPU):
tests/kernels/test_flip_scores.py.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lowering import KERNEL_CALL, lower_text

from experiments.tools.bench import layer as bench
from lngram_jax import lookup
from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.config import LngramConfig
from lngram_jax.layer import LngramV2
from lngram_jax.lookup import ngram_lookup, surrogate_logit_grad
from lngram_jax.surrogate_pallas import onebit_cotangents

ORDERS = (2, 3)


def _problem(seed, *, M=2, R=3, B=2, T=9, Dm=16, dtype=np.float32):
  """Packed (segment ids) and padded (valid) inputs, one table and cotangent per order."""
  rng = np.random.default_rng(seed)
  tables = [jnp.asarray(rng.normal(size=(R * 2 ** (M * n), Dm)), dtype) for n in ORDERS]
  z = jnp.asarray(rng.normal(size=(B, T, R, M)), dtype)
  gs = [jnp.asarray(rng.normal(size=(B, T, R, Dm)), dtype) for _ in ORDERS]
  seg = jnp.asarray(np.cumsum(rng.random((B, T)) < 0.25, axis=1), jnp.int32)
  valid_np = np.ones((B, T), bool)
  valid_np[0, -2:] = False
  valid_np[-1, T // 2] = False
  return tables, z, gs, seg, jnp.asarray(valid_np)


def _grads(impl, tables, z, gs, seg, valid):
  """Gradients of Σ_n ⟨g_n, lookup_n⟩ to every table and to the logits."""
  def loss(tables, z):
    return sum(jnp.sum(ngram_lookup(t, z, order=n, bits=z.shape[-1], segment_ids=seg,
                                    valid=valid, surrogate="onebit", tau=0.9, scale=1.3,
                                    surrogate_impl=impl) * g)
               for n, t, g in zip(ORDERS, tables, gs, strict=True))
  return jax.jit(jax.grad(loss, argnums=(0, 1)))(tables, z)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_lookup_gradients_equal_blocks(dtype):
  """bfloat16: the kernel widens g itself, the XLA path before; same float32 sums."""
  with jax.enable_x64(dtype == "float64"):
    problem = _problem(1, dtype=jnp.dtype(dtype))
    (t_tri, z_tri), (t_blk, z_blk) = _grads("triton", *problem), _grads("blocks", *problem)
    tol = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 1e-2}[dtype]
    assert {x.dtype for x in jax.tree.leaves((t_tri, z_tri))} == {jnp.dtype(dtype)}
    for d_blk in (z_blk, *t_blk):
      assert float(jnp.max(jnp.abs(d_blk))) > 1e-2   # not a vacuous comparison
    wide = functools.partial(jax.tree.map, lambda x: np.asarray(x, np.float64))
    chex.assert_trees_all_close(wide((t_tri, z_tri)), wide((t_blk, z_blk)), rtol=tol, atol=tol)


def test_invalid_windows_add_nothing_and_scores_alone_match():
  """Windows marked invalid are never read: with all invalid (and g NaN there) both
  cotangents are exactly zero. The scores-only form (what the `pallas_fused` readout's
  backward runs, through `surrogate_logit_grad`) equals the blocks router gradient."""
  tables, z, gs, seg, valid = _problem(2)
  codes = codes_from_logits(z)
  kw = dict(order=3, bits=2, tau=1.1, scale=0.7)
  rows, _ = ngram_rows(codes, order=3, bits=2, segment_ids=seg, valid=valid)
  d_table, d_z = jax.jit(functools.partial(onebit_cotangents, **kw))(
      tables[1], z, rows, jnp.full_like(gs[1], jnp.nan), valid_BxT=jnp.zeros_like(valid))
  assert not np.any(np.asarray(d_table)) and not np.any(np.asarray(d_z))
  rows, ok = ngram_rows(codes, order=3, bits=2, segment_ids=seg, valid=valid)
  g = gs[1] * ok[:, :, None, None]
  kw = dict(kw, surrogate="onebit")
  got = jax.jit(functools.partial(surrogate_logit_grad, impl="triton", **kw))(
      tables[1], z, codes, rows, g)
  want = jax.jit(functools.partial(surrogate_logit_grad, impl="blocks", **kw))(
      tables[1], z, codes, rows, g)
  assert float(jnp.max(jnp.abs(want))) > 1e-2
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


def test_triton_is_opt_in_and_onebit_only():
  assert lookup.resolve_surrogate_impl("auto", "onebit") == "blocks"  # default unchanged
  assert lookup.resolve_surrogate_impl("triton", "onebit") == "triton"
  assert lookup.resolve_surrogate_impl("triton", "exact") == "blocks"  # auto's choice
  assert lookup.resolve_surrogate_impl("triton", "ste") == "gather"
  assert not lookup._hard_from_forward("onebit", "triton")  # the kernel reads the hard row


@pytest.mark.parametrize("readout", ["absorbed", "pallas_fused"])
def test_layer_gradients_equal_the_default(readout):
  """Every parameter's gradient and the input's, packed and padded, float32; the fused
  readout (two kernels of its own) runs the switch in its own backward."""
  config = LngramConfig(d_model=16, routes=3, bits=2, mem_dim=16, q_heads=2, kv_heads=1,
                        head_dim=8, readout=readout)
  own = 2 if readout == "pallas_fused" else 0
  model = LngramV2(config, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(3)
  model.w_o[...] = jnp.asarray(0.3 * rng.normal(size=model.w_o[...].shape), jnp.float32)
  model.conv_kernel[...] = jnp.asarray(0.3 * rng.normal(size=model.conv_kernel[...].shape),
                                       jnp.float32)
  model.router_w[...] = jnp.asarray(rng.normal(size=model.router_w[...].shape), jnp.float32)
  h = jnp.asarray(rng.normal(size=(2, 9, 16)), jnp.float32)
  _, _, _, seg, valid = _problem(4)

  def grads(impl, *, kernels=None):
    model.surrogate_impl = impl   # the layer's attribute: in the graph that is traced
    graphdef, state = nnx.split(model)

    def loss(state, h):
      y = nnx.merge(graphdef, state)(h, segment_ids=seg, valid=valid)
      return jnp.sum(y * jnp.cos(jnp.arange(y.size).reshape(y.shape)))
    grad_fn = jax.grad(loss, argnums=(0, 1))
    if kernels is not None:  # the switch reaches the backward: one kernel per order
      # Counted in the program a GPU runs: the kernels are chosen per lowering platform.
      assert lower_text(grad_fn, (state, h), "cuda").count(KERNEL_CALL["cuda"]) == kernels
    return jax.jit(grad_fn)(state, h)

  got = grads("triton", kernels=own + len(config.orders))
  want = grads("auto", kernels=own)
  assert len(jax.tree.leaves(want)) > 2
  chex.assert_trees_all_close(got, want, rtol=2e-5, atol=1e-6)
  router = [w for path, w in jax.tree_util.tree_leaves_with_path(want)
            if "router_w" in jax.tree_util.keystr(path)]
  assert len(router) == 1 and float(jnp.max(jnp.abs(router[0]))) > 0  # surrogate exercised


def test_layer_bench_times_triton_on_a_gpu_only_by_default():
  want = ("gather", "blocks") + (("triton",) if jax.default_backend() == "gpu" else ())
  assert bench.parse_args([]).surrogate_impls == want
  assert bench.parse_args(["--surrogate-impls", "blocks,triton"]).surrogate_impls == (
      "blocks", "triton")
