"""The fused lookup + norm + readout (`lngram_jax.fused`) against `unfused_readout`.

Interpret mode on CPU: values and gradients of every input (q, router logits
through the counterfactual surrogate, every table, the memory-norm scale, w_kv
and b0), with packed segments and padding, N and R not multiples of the
blocks. Lowering for CUDA (Triton) is checked on CPU at the layer's real sizes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import use_abstract_mesh
from lowering import H100

from kernels.sink_readout import BlockSizes
from lngram_jax import LngramConfig, LngramParams
from lngram_jax.fused import FusedSpec, fused_readout, unfused_readout

B, T, R, M, DM, HQ, HKV, DH = 2, 5, 20, 2, 8, 4, 2, 4
ORDERS = (2, 3)
NAMES = ("o", "lse", "q", "logits", "params", "sink_logit")
BLOCKS = BlockSizes(block_n=3, block_r=16, block_n_bwd=4)


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
  """On GPUs XLA may run float32 dots as TF32; the comparisons here want float32."""
  with jax.default_matmul_precision("highest"):
    yield


def _config(dtype, surrogate):
  return LngramConfig(d_model=HQ * DH, routes=R, bits=M, orders=ORDERS, mem_dim=DM,
                      q_heads=HQ, kv_heads=HKV, head_dim=DH, surrogate=surrogate,
                      dtype=dtype)


def _params(tables, mem_norm, w_kv):
  """The arrays the fused op reads; the others are not used (None)."""
  return LngramParams(router_w=None, tables=tuple(tables), q_norm=None, w_q=None,
                      mem_norm=mem_norm, w_kv=w_kv, w_o=None, conv_norm=None,
                      conv_kernel=None)


def _inputs(dtype):
  ks = jax.random.split(jax.random.key(0), 9)
  Dr = len(ORDERS) * DM
  tables = tuple(0.5 * jax.random.normal(ks[2 + i], (R * 2 ** (M * n), DM))
                 for i, n in enumerate(ORDERS))
  return dict(
      q=jax.random.normal(ks[0], (B, T, HQ, DH)).astype(dtype),
      logits=jax.random.normal(ks[1], (B, T, R, M)),
      params=_params(tables, 1.0 + 0.1 * jax.random.normal(ks[4], (Dr,)),
                     0.5 * jax.random.normal(ks[5], (Dr, 2 * HKV * DH))),
      sink_logit=jnp.float32(1.2),
      g_o=jax.random.normal(ks[7], (B, T, HQ, DH)).astype(dtype),
      g_lse=jax.random.normal(ks[8], (B, T, HQ)),
  )


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _values_and_grads(fused, dtype, surrogate, x):
  segment_ids = jnp.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], jnp.int32)
  valid = jnp.array([[True] * 5, [True] * 4 + [False]])
  config = _config(dtype, surrogate)

  def fn(q, logits, params, sink_logit):
    if fused:
      return fused_readout(q, logits, params, FusedSpec(config, BLOCKS, interpret=True),
                           sink_logit=sink_logit, segment_ids=segment_ids, valid=valid)
    return unfused_readout(q, logits, params, config, sink_logit=sink_logit,
                                   segment_ids=segment_ids, valid=valid)

  args = tuple(x[k] for k in NAMES[2:])
  (o, lse), vjp = jax.vjp(fn, *args)
  return (o, lse, *vjp((x["g_o"], x["g_lse"])))


def _rel_err(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


@pytest.mark.slow
@pytest.mark.parametrize("dtype, surrogate, tol", [(jnp.float32, "onebit", 2e-5),
                                                   (jnp.bfloat16, "exact", 3e-2)],
                         ids=["f32_onebit", "bf16_exact"])
def test_fused_matches_unfused(dtype, surrogate, tol):
  x = _inputs(dtype)
  got = _values_and_grads(True, dtype, surrogate, x)
  want = _values_and_grads(False, dtype, surrogate, x)
  for name, g, w in zip(NAMES, got, want, strict=True):
    for g_leaf, w_leaf in zip(jax.tree.leaves(g), jax.tree.leaves(w), strict=True):
      assert g_leaf.shape == w_leaf.shape and g_leaf.dtype == w_leaf.dtype, name
      if name != "sink_logit":  # b0's cotangent can cancel to ~0; the others must not
        assert float(jnp.max(jnp.abs(w_leaf.astype(jnp.float32)))) > 0, name
      # b0's cotangent is a cancelling sum over all tokens and heads: absolute scale
      err = (abs(float(g_leaf) - float(w_leaf)) / (B * T * HQ) if name == "sink_logit"
             else _rel_err(g_leaf, w_leaf))
      assert err < tol, (name, err)


def test_fused_rejects_mismatched_tables():
  x = _inputs(jnp.float32)
  p = x["params"]
  bad = p.replace(tables=(p.tables[0], p.tables[0]))
  with pytest.raises(ValueError, match="table of order 3"):
    fused_readout(x["q"], x["logits"], bad, FusedSpec(_config(jnp.float32, "onebit")))


def test_fused_refuses_the_token_block_layout_it_would_ignore():
  x = _inputs(jnp.float32)
  blocks = BlockSizes.get_default("triton", 16, layout="token_block")
  with pytest.raises(ValueError, match="'per_token' layout only"):
    fused_readout(x["q"], x["logits"], x["params"],
                  FusedSpec(_config(jnp.float32, "onebit"), blocks, interpret=True))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_fused_forward_and_backward_lower_for_cuda(dtype):
  """At the layer's real sizes: r64/m4/mem128, orders (2, 3), Hq 16, KV 8, dh 128."""
  b, t, r, m, dm, hq, hkv, dh = 2, 64, 64, 4, 128, 16, 8, 128
  config = LngramConfig(d_model=hq * dh, routes=r, bits=m, orders=ORDERS, mem_dim=dm,
                        q_heads=hq, kv_heads=hkv, head_dim=dh, dtype=dtype)
  S = jax.ShapeDtypeStruct
  avals = (S((b, t, hq, dh), dtype), S((b, t, r, m), jnp.float32),
           _params([S((r * 2 ** (m * n), dm), jnp.float32) for n in ORDERS],
                   S((2 * dm,), jnp.float32), S((2 * dm, 2 * hkv * dh), jnp.float32)))

  def loss(q, logits, params):
    o, lse = fused_readout(q, logits, params, FusedSpec(config, interpret=False))
    return jnp.sum(o.astype(jnp.float32)) + jnp.sum(lse)

  with use_abstract_mesh(H100):
    forward = jax.jit(loss).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
    backward = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(*avals).lower(
        lowering_platforms=("cuda",)).as_text()
  assert forward.count("__gpu$xla.gpu.triton") == 1
  assert backward.count("__gpu$xla.gpu.triton") == 2


@pytest.mark.gpu
def test_fused_on_gpu():
  x = _inputs(jnp.bfloat16)
  config = _config(jnp.bfloat16, "onebit")

  @jax.jit
  def both(x):
    def run(fn):
      (o, lse), vjp = jax.vjp(fn, x["q"], x["logits"], x["params"])
      return (o, lse, *vjp((x["g_o"], x["g_lse"])))
    return (run(lambda q, z, p: fused_readout(q, z, p, FusedSpec(config, interpret=False))),
            run(lambda q, z, p: unfused_readout(q, z, p, config)))

  got, want = both(x)
  for g_leaf, w_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    assert _rel_err(g_leaf, w_leaf) < 3e-2
