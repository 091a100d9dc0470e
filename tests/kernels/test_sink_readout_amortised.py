"""The token-block Triton readout (`BlockSizes(layout="token_block")`) against the reference.

Interpret mode on CPU at one tiny ragged shape (BT not a multiple of either
token block, R not a multiple of either route block, Hq and Dr padded):
values and the gradients of q, mem and a traced b0, in float32 and bfloat16
(the kernels refuse float64, as the per-token kernel does). The block-diagonal
masks are what could go wrong, so a token's output must not depend on its
neighbours' routes, and with the sink off (b0 = -inf) or all mass on the sink
the kernel must still agree. Lowering for CUDA is checked on CPU at the r64
benchmark widths and at a padded D > 256 shape.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import use_abstract_mesh
from lowering import H100
from readout_checks import OUTPUTS, compare_with_reference, readout_inputs, values_and_grads

from kernels.sink_readout import (
  BlockSizes,
  sink_readout_kernel,
  sink_readout_reference,
  triton_amortised,
)
from kernels.sink_readout.common import HOPPER_SMEM_BYTES, token_block_forward_smem_bytes

SHAPE = (5, 3, 150, 24)  # BT, Hq, R, Dr
SCALE = 0.25
BLOCKS = BlockSizes(block_n=2, block_r=64, block_n_bwd=4, block_r_bwd=16, layout="token_block")
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
_KERNEL = functools.partial(sink_readout_kernel, scale=SCALE, implementation="triton",
                            block_sizes=BLOCKS, interpret=True)
_REFERENCE = functools.partial(sink_readout_reference, scale=SCALE)


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
  with jax.default_matmul_precision("highest"):
    yield


def _inputs(dtype, seed=0):
  return readout_inputs(*SHAPE, dtype, seed=seed)


def _compare(args, sink_logit, tol, readout=_KERNEL):
  return compare_with_reference(readout, _REFERENCE, args, sink_logit, tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_token_block_matches_reference_ragged(dtype):
  BT, _, R, _ = SHAPE
  assert BT % BLOCKS.block_n and BT % BLOCKS.bwd_n  # partial last token blocks
  assert R % BLOCKS.block_r and R % BLOCKS.bwd_r    # partial last route blocks
  _compare(_inputs(dtype), 0.8, TOLERANCE[dtype])


def test_token_block_tokens_do_not_mix():
  """Changing token 1's routes moves only token 1's out, lse and dq, and only
  token 1's dmem: the off-diagonal tiles of the stacked dot are masked. Token 1
  shares both a forward (block_n = 2) and a backward (block_n = 4) block."""
  q, mem, dout, dlse = _inputs(jnp.float32, seed=3)
  b0 = jnp.float32(0.3)
  before = values_and_grads(_KERNEL, q, mem, b0, dout, dlse)
  after = _compare((q, mem.at[1].multiply(-2.0), dout, dlse), 0.3, 2e-5)
  others = np.array([0, 2, 3, 4])

  def rows(values, which):
    return {name: np.asarray(v)[which] for name, v in zip(OUTPUTS[:4], values[:4], strict=True)}

  chex.assert_trees_all_equal(rows(before, others), rows(after, others))
  for name, x, y in zip(OUTPUTS[:4], before[:4], after[:4], strict=True):
    assert not np.allclose(np.asarray(x)[1], np.asarray(y)[1]), name


def test_token_block_sink_only_and_no_sink():
  """All mass on the sink (scores far below b0): out = 0 and lse = b0 exactly,
  no gradient to q or mem. Sink off (b0 = -inf): equal to the reference."""
  q, mem, dout, dlse = _inputs(jnp.float32, seed=1)
  far_q = -100.0 * (jnp.abs(q) + 0.5)  # every score <= -150: exp underflows
  far_mem = jnp.abs(mem) + 0.5
  out, lse, dq, dmem, d_sink = values_and_grads(_KERNEL, far_q, far_mem, jnp.float32(2.0),
                                                dout, dlse)
  chex.assert_trees_all_equal(
      (out, lse, dq, dmem),
      (jnp.zeros_like(out), jnp.full_like(lse, 2.0), jnp.zeros_like(dq), jnp.zeros_like(dmem)))
  np.testing.assert_allclose(d_sink, jnp.sum(dlse), rtol=1e-6)  # σ0 = 1, out = 0
  _compare((q, mem, dout, dlse), -jnp.inf, 2e-5)


@pytest.mark.parametrize("blocks, implementation, q_dtype, error", [
    (BlockSizes(block_n=3, layout="token_block"), "triton", jnp.float32, "powers of 2"),
    (BlockSizes(block_n=1, block_r=8, layout="token_block"), "triton", jnp.float32, ">= 16"),
    (BlockSizes(block_n=2, block_r=128, layout="token_block"), "mosaic_tpu", jnp.float32,
     "Triton only"),
    (BLOCKS, "triton", jnp.float64, "float64 only with implementation='xla'"),
])
def test_token_block_checks(blocks, implementation, q_dtype, error):
  with jax.enable_x64(q_dtype == jnp.float64):
    q, mem = jnp.zeros((2, 3, 8), q_dtype), jnp.zeros((2, 4, 8), q_dtype)
    with pytest.raises((ValueError, TypeError), match=error):
      sink_readout_kernel(q, mem, sink_logit=0.0, implementation=implementation,
                          block_sizes=blocks)
  with pytest.raises(ValueError, match="layout='tokens'"):
    BlockSizes(layout="tokens")


def _lower_cuda(fn, avals):
  with use_abstract_mesh(H100):  # jax 0.11 reads the target GPU from the mesh at trace time
    return jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


def _loss(blocks, q, mem, sink_logit):
  out, lse = sink_readout_kernel(q, mem, sink_logit=sink_logit, scale=0.0625,
                                 implementation="triton", block_sizes=blocks, interpret=False)
  return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("shape, blocks", [
    ((100, 16, 64, 256), None),  # the r64 benchmark widths, default token blocks
    ((63, 12, 300, 384), None),  # padded heads and features, D > 256 defaults
    ((100, 16, 64, 256), BlockSizes(block_n=4, block_r=32, block_r_bwd=8, layout="token_block")),
], ids=["r64_d256", "r300_d384_h12", "r64_n4"])
def test_token_block_lowers_for_cuda(shape, blocks, dtype):
  BT, Hq, R, Dr = shape
  blocks = blocks or BlockSizes.get_default("triton", Dr, layout="token_block",
                                            itemsize=jnp.dtype(dtype).itemsize)
  avals = (jax.ShapeDtypeStruct((BT, Hq, Dr), dtype), jax.ShapeDtypeStruct((BT, R, Dr), dtype),
           jax.ShapeDtypeStruct((), jnp.float32))
  loss = functools.partial(_loss, blocks)
  forward_text = _lower_cuda(loss, avals)
  backward_text = _lower_cuda(jax.grad(loss, argnums=(0, 1, 2)), avals)
  assert forward_text.count("__gpu$xla.gpu.triton") == 1
  assert backward_text.count("__gpu$xla.gpu.triton") == 2  # forward + backward kernels
  assert "sink_readout_token_block_bwd" in backward_text


def test_lowering_rejects_a_token_block_interpret_accepts():
  """block_n = 3 stacks 48 rows: interpret mode computes it, Triton cannot
  lower it, so the lowering checks above are not vacuous."""
  q, mem, _, _ = _inputs(jnp.float32)
  forward = functools.partial(triton_amortised.forward, sink_logit=0.0, scale=SCALE,
                              block_n=3, block_r=16)
  got = forward(q, mem, interpret=True)
  want = _REFERENCE(q, mem, sink_logit=0.0)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="power of 2"):
    _lower_cuda(forward, (q, mem))


def test_default_token_blocks_fit_hopper_shared_memory():
  """The f32 default once asked an H200 for 294,912 bytes (the smem model's calibration
  point); the defaults now fit at both widths and both element sizes, at 16 heads."""
  old_f32 = BlockSizes(block_n=2, block_r=64, block_r_bwd=16, num_warps=4, layout="token_block")
  assert token_block_forward_smem_bytes(old_f32, 16, 256, 4) == 294912 > HOPPER_SMEM_BYTES
  for route_dim in (256, 512):
    for itemsize in (2, 4):
      blocks = BlockSizes.get_default("triton", route_dim, layout="token_block",
                                      itemsize=itemsize)
      used = token_block_forward_smem_bytes(blocks, 16, route_dim, itemsize)
      assert used <= HOPPER_SMEM_BYTES, (route_dim, itemsize, used)
  # bf16 keeps the routes per step it had (the r64 benchmark rows were timed with them).
  assert BlockSizes.get_default("triton", 256, layout="token_block").block_r == 64


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_token_block_on_gpu(dtype):
  """Compiled by Triton, default token blocks, r64 widths, a ragged token count."""
  BT, Hq, R, Dr = 301, 16, 64, 256
  kq, km, ko, kl = jax.random.split(jax.random.key(4), 4)
  args = (jax.random.normal(kq, (BT, Hq, Dr), jnp.float32).astype(dtype),
          jax.random.normal(km, (BT, R, Dr), jnp.float32).astype(dtype),
          jax.random.normal(ko, (BT, Hq, Dr), jnp.float32).astype(dtype),
          jax.random.normal(kl, (BT, Hq), jnp.float32))
  readout = functools.partial(sink_readout_kernel, scale=SCALE, implementation="triton",
                              block_sizes=BlockSizes.get_default(
                                  "triton", Dr, layout="token_block",
                                  itemsize=jnp.dtype(dtype).itemsize))
  # f32 dots on the GPU may run as TF32 inside XLA's reference.
  _compare(args, 1.0, 3e-2 if dtype == jnp.bfloat16 else 5e-3, readout=readout)
