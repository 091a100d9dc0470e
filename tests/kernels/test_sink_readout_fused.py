"""The fused gather + RMSNorm + sink-readout kernel against its XLA twin.

Kernel level, no model: row ids (with -1 = an invalid row that reads zero),
tables, a norm scale and queries. Interpret mode on CPU for values and the
backward's outputs (dq, the cotangent of each table's gathered rows, dγ), N and
R not multiples of the blocks. Lowering for CUDA (Triton) is checked on CPU,
and a gather that interpret mode accepts but Triton cannot lower is rejected.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import use_abstract_mesh
from lowering import H100

from kernels.sink_readout import BlockSizes, fused_reference, fused_triton, gather_rows

N, R, DM, HQ = 7, 20, 8, 4
VS = (40, 90)  # rows of each table
SCALE, EPS = 0.3, 1e-6
BLOCKS = BlockSizes(block_n=3, block_r=16, block_n_bwd=4)


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
  with jax.default_matmul_precision("highest"):
    yield


def _inputs(dtype):
  ks = jax.random.split(jax.random.key(0), 8)
  D = len(VS) * DM
  tables = [0.5 * jax.random.normal(ks[i], (v, DM)) for i, v in enumerate(VS)]
  rows = [jax.random.randint(ks[2 + i], (N, R), -1, v) for i, v in enumerate(VS)]
  return dict(
      q=jax.random.normal(ks[4], (N, HQ, D)).astype(dtype), tables=tables, rows=rows,
      norm=1.0 + 0.1 * jax.random.normal(ks[5], (D,)), sink=jnp.float32(0.7),
      dout=jax.random.normal(ks[6], (N, HQ, D)).astype(dtype),
      dlse=jax.random.normal(ks[7], (N, HQ)))


def _rel_err(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


@functools.partial(jax.jit, static_argnums=0)
def _kernel(dtype, x):
  kw = dict(scale=SCALE, eps=EPS, blocks=BLOCKS, interpret=True)
  out, lse = fused_triton.forward(x["q"], x["tables"], x["rows"], x["norm"], x["sink"], **kw)
  dq, dxs, dnorm = fused_triton.backward(x["q"], x["tables"], x["rows"], x["norm"], out, lse,
                                         x["dout"], x["dlse"], **kw)
  return out, lse, dq, dxs, dnorm


@functools.partial(jax.jit, static_argnums=0)
def _reference(dtype, x):
  xs = gather_rows(x["tables"], x["rows"], dtype)
  fn = functools.partial(fused_reference, sink_logit=x["sink"], scale=SCALE, eps=EPS)
  (out, lse), vjp = jax.vjp(fn, x["q"], xs, x["norm"])
  dq, dxs, dnorm = vjp((x["dout"], x["dlse"]))
  return out, lse, dq, dxs, dnorm


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)],
                         ids=["f32", "bf16"])
def test_fused_kernel_matches_reference(dtype, tol):
  x = _inputs(dtype)
  assert any(bool(jnp.any(r < 0)) for r in x["rows"])  # invalid rows are exercised
  got, want = _kernel(dtype, x), _reference(dtype, x)
  for name, g, w in zip(("out", "lse", "dq", "dxs", "dnorm"), got, want, strict=True):
    for g_leaf, w_leaf in zip(jax.tree.leaves(g), jax.tree.leaves(w), strict=True):
      assert g_leaf.shape == w_leaf.shape, name
      assert float(jnp.max(jnp.abs(w_leaf.astype(jnp.float32)))) > 0, name
      assert _rel_err(g_leaf, w_leaf) < tol, (name, _rel_err(g_leaf, w_leaf))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_fused_kernel_lowers_for_cuda(dtype):
  """At a layer's real sizes: 64 routes, two tables of 128-wide rows, Hq 16, Dr 256."""
  n, r, dm, hq = 128, 64, 128, 16
  S = jax.ShapeDtypeStruct
  avals = (S((n, hq, 2 * dm), dtype), [S((64 * 16**2, dm), jnp.float32),
                                       S((64 * 16**3, dm), jnp.float32)],
           [S((n, r), jnp.int32)] * 2, S((2 * dm,), jnp.float32), S((), jnp.float32))
  blocks = BlockSizes.get_default("triton", 2 * dm)
  kw = dict(scale=0.088, eps=EPS, blocks=blocks, interpret=False)

  def both(q, tables, rows, norm, sink):
    out, lse = fused_triton.forward(q, tables, rows, norm, sink, **kw)
    return fused_triton.backward(q, tables, rows, norm, out, lse, out, lse, **kw)

  with use_abstract_mesh(H100):
    text = jax.jit(both).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 2


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
