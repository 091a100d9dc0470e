"""The fused lookup + norm + readout kernel against its unfused XLA twin.

Interpret mode on CPU: values and gradients of every input (q, router logits
through the counterfactual surrogate, every table, the memory-norm scale, W_K,
W_V and b0), with packed segments and padding, N and R not multiples of the
blocks. Lowering for CUDA (Triton) is checked on CPU at the layer's real sizes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from kernels.sink_readout import BlockSizes
from kernels.sink_readout.fused import fused_readout, fused_readout_reference

H100 = AbstractMesh((), (), abstract_device=AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", platform="gpu", num_cores=132))
B, T, R, M, DM, HQ, HKV, DH = 2, 5, 20, 2, 8, 4, 2, 4
ORDERS = (2, 3)
NAMES = ("o", "lse", "q", "logits", "tables", "mem_norm", "w_k", "w_v", "sink_logit")


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
  """On GPUs XLA may run float32 dots as TF32; the comparisons here want float32."""
  with jax.default_matmul_precision("highest"):
    yield


def _inputs(dtype):
  ks = jax.random.split(jax.random.key(0), 9)
  D = len(ORDERS) * DM
  tables = tuple(0.5 * jax.random.normal(ks[2 + i], (R * 2 ** (M * n), DM))
                 for i, n in enumerate(ORDERS))
  return dict(
      q=jax.random.normal(ks[0], (B, T, HQ, DH)).astype(dtype),
      logits=jax.random.normal(ks[1], (B, T, R, M)),
      tables=tables,
      mem_norm=1.0 + 0.1 * jax.random.normal(ks[4], (D,)),
      w_k=(0.5 * jax.random.normal(ks[5], (D, HKV, DH))).astype(dtype),
      w_v=(0.5 * jax.random.normal(ks[6], (D, HKV, DH))).astype(dtype),
      sink_logit=jnp.float32(1.2),
      g_o=jax.random.normal(ks[7], (B, T, HQ, DH)).astype(dtype),
      g_lse=jax.random.normal(ks[8], (B, T, HQ)),
  )


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _values_and_grads(readout, dtype, surrogate, x):
  segment_ids = jnp.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], jnp.int32)
  valid = jnp.array([[True] * 5, [True] * 4 + [False]])

  def fn(q, logits, tables, mem_norm, w_k, w_v, sink_logit):
    return readout(q, logits, tables, mem_norm, w_k, w_v, orders=ORDERS, bits=M,
                   sink_logit=sink_logit, dtype=dtype, segment_ids=segment_ids, valid=valid,
                   surrogate=surrogate, return_lse=True)

  args = tuple(x[k] for k in NAMES[2:])
  (o, lse), vjp = jax.vjp(fn, *args)
  return (o, lse, *vjp((x["g_o"], x["g_lse"])))


def _rel_err(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


_FUSED = functools.partial(fused_readout, interpret=True,
                           block_sizes=BlockSizes(block_n=3, block_r=16, block_n_bwd=4))


@pytest.mark.parametrize("dtype, surrogate, tol", [(jnp.float32, "onebit", 2e-5),
                                                   (jnp.bfloat16, "exact", 3e-2)],
                         ids=["f32_onebit", "bf16_exact"])
def test_fused_matches_unfused(dtype, surrogate, tol):
  x = _inputs(dtype)
  got = _values_and_grads(_FUSED, dtype, surrogate, x)
  want = _values_and_grads(fused_readout_reference, dtype, surrogate, x)
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
  with pytest.raises(ValueError, match="table of order 3"):
    fused_readout(x["q"], x["logits"], (x["tables"][0], x["tables"][0]), x["mem_norm"],
                  x["w_k"], x["w_v"], orders=ORDERS, bits=M, sink_logit=0.0,
                  dtype=jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_fused_forward_and_backward_lower_for_cuda(dtype):
  """At the layer's real sizes: r64/m4/mem128, orders (2, 3), Hq 16, KV 8, dh 128."""
  b, t, r, m, dm, hq, hkv, dh = 2, 64, 64, 4, 128, 16, 8, 128
  S = jax.ShapeDtypeStruct
  avals = (S((b, t, hq, dh), dtype), S((b, t, r, m), jnp.float32),
           tuple(S((r * 2 ** (m * n), dm), jnp.float32) for n in ORDERS),
           S((2 * dm,), jnp.float32), S((2 * dm, hkv, dh), dtype), S((2 * dm, hkv, dh), dtype))

  def loss(q, logits, tables, mem_norm, w_k, w_v):
    o, lse = fused_readout(q, logits, tables, mem_norm, w_k, w_v, orders=ORDERS, bits=m,
                           sink_logit=1.0, dtype=dtype, return_lse=True, interpret=False)
    return jnp.sum(o.astype(jnp.float32)) + jnp.sum(lse)

  with use_abstract_mesh(H100):
    forward = jax.jit(loss).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
    backward = jax.jit(jax.grad(loss, argnums=tuple(range(6)))).trace(*avals).lower(
        lowering_platforms=("cuda",)).as_text()
  assert forward.count("__gpu$xla.gpu.triton") == 1
  assert backward.count("__gpu$xla.gpu.triton") == 2


def _gather_kernel(rows_ref, table_ref, out_ref, *, use_take):
  rows = plgpu.load(rows_ref.at[pl.program_id(0), pl.ds(0, 16)])
  cols = jnp.arange(32)
  if use_take:  # an XLA gather inside the kernel
    out_ref[...] = jnp.take(table_ref[...], rows, axis=0)
  else:  # the pointer gather the fused kernel uses
    out_ref[...] = plgpu.load(table_ref.at[rows[:, None], cols[None, :]])


def _gather(rows, table, *, use_take, interpret):
  return pl.pallas_call(
      functools.partial(_gather_kernel, use_take=use_take),
      grid=(rows.shape[0],),
      in_specs=[pl.BlockSpec(rows.shape, lambda i: (0, 0)),
                pl.BlockSpec(table.shape, lambda i: (0, 0))],
      out_specs=pl.BlockSpec((None, 16, 32), lambda i: (i, 0, 0)),
      out_shape=jax.ShapeDtypeStruct((rows.shape[0], 16, 32), table.dtype),
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret)(rows, table)


def test_triton_lowering_rejects_an_xla_gather_that_interpret_accepts():
  rows = jax.random.randint(jax.random.key(0), (2, 16), 0, 128)
  table = jax.random.normal(jax.random.key(1), (128, 32))
  for use_take in (True, False):
    got = _gather(rows, table, use_take=use_take, interpret=True)
    np.testing.assert_array_equal(got, table[rows])
  with use_abstract_mesh(H100):
    lower = lambda use_take: jax.jit(functools.partial(
        _gather, use_take=use_take, interpret=False)).trace(rows, table).lower(
            lowering_platforms=("cuda",))
    assert "__gpu$xla.gpu.triton" in lower(False).as_text()
    with pytest.raises(NotImplementedError, match="gather"):
      lower(True)


@pytest.mark.gpu
def test_fused_on_gpu():
  x = _inputs(jnp.bfloat16)
  fused = functools.partial(fused_readout, interpret=False)
  got = _values_and_grads(fused, jnp.bfloat16, "onebit", x)
  want = _values_and_grads(fused_readout_reference, jnp.bfloat16, "onebit", x)
  for name, g, w in zip(NAMES[:-1], got, want, strict=False):
    for g_leaf, w_leaf in zip(jax.tree.leaves(g), jax.tree.leaves(w), strict=True):
      assert _rel_err(g_leaf, w_leaf) < 3e-2, name
