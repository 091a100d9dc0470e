"""Every Pallas Triton kernel compiled by XLA:GPU for sm_90 (H100/H800/H200) and sm_80 (A100).

No GPU is needed: jax's CUDA plugin compiles for a GPU it is given as a spec
(experiments/plan/gpu.py), and in doing so compiles each Triton kernel for that chip
and checks its blocks against the chip's shared memory. A kernel whose tiles do not
fit, or that Triton cannot compile, fails here. Shapes are the papers': the readout of
Table 12's r64/m4/KV8 at d 2048 (16 query heads over route tokens of 128), Table 3's R
121 and Table 13's R 256 of width 256, route tokens of 64; attention heads of 64 and
128; the Table 4 MoE's expert widths. Each in bfloat16 and float32, forward and
backward, and the compiled program must hold the kernels' Triton calls.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from lowering import GPU_TARGETS, KERNEL_CALL, gpu_compiled_text

from kernels.attention import causal_attention
from kernels.flip_scores import triton_gpu as flip_triton
from kernels.grouped_matmul import grouped_matmul
from kernels.sink_readout import BlockSizes, fused_triton, sink_readout_kernel

DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}
# (query heads, routes, route-token width): Table 12 r64/m4/KV8 (d 2048), Table 3 R 121,
# Table 13 R 256 / width 256, a 64-wide route token.
READOUTS = {"r64_d128": (16, 64, 128), "r121_d128": (16, 121, 128),
            "r256_d256": (16, 256, 256), "r64_d64": (16, 64, 64)}
TOKENS = 256
CALL = KERNEL_CALL["cuda"]


def _aval(shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype)


def _sum(*xs):
  return sum(jnp.sum(x.astype(jnp.float32)) for x in xs if x is not None)


@pytest.mark.parametrize("chip", sorted(GPU_TARGETS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("shape", sorted(READOUTS))
@pytest.mark.parametrize("layout", ["per_token", "token_block"])
def test_sink_readout_compiles(layout, shape, dtype, chip):
  Hq, R, Dr = READOUTS[shape]
  dt = DTYPES[dtype]
  blocks = BlockSizes.get_default("triton", Dr, layout=layout, itemsize=jnp.dtype(dt).itemsize)

  def loss(q, mem):
    out, lse = sink_readout_kernel(q, mem, sink_logit=0.5, scale=Dr**-0.5,
                                   implementation="triton", block_sizes=blocks,
                                   interpret=False)
    return _sum(out, lse)

  text = gpu_compiled_text(jax.grad(loss, argnums=(0, 1)),
                           (_aval((TOKENS, Hq, Dr), dt), _aval((TOKENS, R, Dr), dt)),
                           GPU_TARGETS[chip])
  assert text.count(CALL) == 2   # the forward kernel and the backward kernel


@pytest.mark.parametrize("chip", sorted(GPU_TARGETS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("shape", ["r64_d128", "r256_d256"])
def test_fused_readout_compiles(shape, dtype, chip):
  """The lookup + RMSNorm + readout kernel over three orders' tables (Dr = 3 Dm is not
  a power of 2 at these widths, so Dm = Dr / 2 over two orders)."""
  Hq, R, Dr = READOUTS[shape]
  dt = DTYPES[dtype]
  orders, rows_per_table = 2, 4096
  Dm = Dr // orders
  blocks = BlockSizes.get_default("triton", Dr, itemsize=jnp.dtype(dt).itemsize)
  kw = dict(scale=Dr**-0.5, eps=1e-6, blocks=blocks, interpret=False)

  def both(q, norm, dout, dlse, *tables_and_rows):
    tables, rows = list(tables_and_rows[:orders]), list(tables_and_rows[orders:])
    out, lse = fused_triton.forward(q, tables, rows, norm, jnp.float32(0.5), **kw)
    dq, dxs, dnorm = fused_triton.backward(q, tables, rows, norm, out, lse, dout, dlse, **kw)
    return _sum(out, lse, dq, *dxs, dnorm)

  avals = [_aval((TOKENS, Hq, Dr), dt), _aval((Dr,), jnp.float32),
           _aval((TOKENS, Hq, Dr), dt), _aval((TOKENS, Hq), jnp.float32)]
  avals += [_aval((rows_per_table, Dm), jnp.float32)] * orders
  avals += [_aval((TOKENS, R), jnp.int32)] * orders
  text = gpu_compiled_text(both, avals, GPU_TARGETS[chip])
  assert text.count(CALL) == 2


@pytest.mark.parametrize("chip", sorted(GPU_TARGETS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("width", [64, 128, 256])
def test_one_bit_surrogate_compiles(width, dtype, chip):
  """The one-bit surrogate's backward (scores against a row's M = 4 one-bit neighbours,
  and the table gradient's scatter-add): one row per route token of a 4,096-token step."""
  dt = DTYPES[dtype]
  table_rows, ids = 16 * 4**4, 4096

  def scores(table, rows, g):
    s, d_table = flip_triton.flip_scores(table, rows, g, flips=(0, 1, 2, 3))
    return _sum(s, d_table)

  text = gpu_compiled_text(scores, (_aval((table_rows, width), dt), _aval((ids,), jnp.int32),
                                    _aval((ids, width), dt)), GPU_TARGETS[chip])
  assert text.count(CALL) >= 1


@pytest.mark.parametrize("chip", sorted(GPU_TARGETS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash_attention_compiles(head_dim, dtype, chip):
  """Causal attention within segments, 16 query heads over 8 KV heads, 1,024 tokens."""
  dt = DTYPES[dtype]
  B, T, Hq, Hkv = 2, 1024, 16, 8

  def loss(q, k, v, seg):
    return _sum(causal_attention(q, k, v, seg, implementation="triton", interpret=False))

  avals = (_aval((B, T, Hq, head_dim), dt), _aval((B, T, Hkv, head_dim), dt),
           _aval((B, T, Hkv, head_dim), dt), _aval((B, T), jnp.int32))
  forward = gpu_compiled_text(loss, avals, GPU_TARGETS[chip]).count(CALL)
  backward = gpu_compiled_text(jax.grad(loss, argnums=(0, 1, 2)), avals,
                               GPU_TARGETS[chip]).count(CALL)
  assert forward >= 1 and backward > forward


def test_flash_attention_compiles_for_a_short_prompt():
  """An 82-token prompt (a sampler's prefill) is padded to one power-of-2 tile; the
  96-row tile it was once given does not compile for a GPU."""
  B, T, Hq, Hkv, Dh = 2, 82, 16, 8, 128

  def loss(q, k, v, seg):
    return _sum(causal_attention(q, k, v, seg, implementation="triton", interpret=False))

  avals = (_aval((B, T, Hq, Dh), jnp.bfloat16), _aval((B, T, Hkv, Dh), jnp.bfloat16),
           _aval((B, T, Hkv, Dh), jnp.bfloat16), _aval((B, T), jnp.int32))
  assert gpu_compiled_text(loss, avals, GPU_TARGETS["sm90"]).count(CALL) >= 1


@pytest.mark.parametrize("chip", sorted(GPU_TARGETS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_grouped_matmul_compiles_and_replaces_the_dense_ragged_dot(dtype, chip):
  """The Table 4 MoE's expert FFN (8 experts, d 768, hidden 1,024 per expert is its
  smoke width; 4,096 tokens × top-2 slots): XLA:GPU lowers ragged_dot densely, so the
  GPU program takes the Triton gmm and tgmm instead, and no dense ragged_dot is left."""
  dt = DTYPES[dtype]

  def loss(lhs, rhs, sizes):
    return _sum(grouped_matmul(lhs, rhs, sizes))

  avals = (_aval((8192, 768), dt), _aval((8, 768, 1024), dt), _aval((8,), jnp.int32))
  text = gpu_compiled_text(jax.grad(loss, argnums=(0, 1)), avals, GPU_TARGETS[chip])
  assert text.count(CALL) == 2 and "ragged_dot_general" not in text   # d lhs (gmm), d rhs
  dense = gpu_compiled_text(
      jax.grad(lambda a, b, s: _sum(grouped_matmul(a, b, s, implementation="ragged_dot")),
               argnums=(0, 1)), avals, GPU_TARGETS[chip])
  assert "ragged_dot_general" in dense and CALL not in dense


def test_a_kernel_over_the_shared_memory_fails_without_a_gpu():
  """The check is not vacuous: a Triton kernel whose tiles need more shared memory than
  one block may hold (two 512 × 512 float32 operands) is refused by the compile."""

  def kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...])

  def product(a, b):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((512, 512), jnp.float32),
                          compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=3))(a, b)

  avals = (_aval((512, 512), jnp.float32), _aval((512, 512), jnp.float32))
  with pytest.raises(Exception, match="Shared memory size limit exceeded"):
    gpu_compiled_text(product, avals, GPU_TARGETS["sm90"])


def test_kernels_pass_their_triton_compiler_parameters():
  """Without explicit Triton parameters jax 0.10.2 takes the Mosaic GPU path, which
  does not lower here: every pallas_call in kernels/ names plgpu.CompilerParams (or a
  helper returning them) or is a TPU kernel."""
  import pathlib
  import re
  root = pathlib.Path(__file__).resolve().parents[2] / "kernels"
  for path in root.rglob("*.py"):
    text = path.read_text()
    for call in re.finditer(r"pl\.pallas_call\(", text):
      window = text[call.start():call.start() + 1500]
      end = window.find(")(")
      assert "compiler_params=" in window[:end if end > 0 else None], (path, call.start())
