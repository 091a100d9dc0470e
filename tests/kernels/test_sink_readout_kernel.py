"""The sink-readout kernels against their XLA reference.

Every kernel case runs in interpret mode on CPU (values and gradients of q and
mem, with cotangents on both outputs); shapes are tiny and ragged (N and R not
multiples of the blocks). Lowering for CUDA (Triton) and TPU (Mosaic) is
checked on CPU at realistic shapes, so a kernel that interpret mode accepts
but a real backend would reject fails here. sink_logit and scale are
differentiated as well: it may be traced, and here it always is. scale is a
compile-time constant.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lowering import KERNEL_CALL, lower_text
from readout_checks import compare_with_reference, readout_inputs, values_and_grads

from kernels.sink_readout import (
  BlockSizes,
  mosaic_tpu,
  sink_readout_kernel,
  sink_readout_reference,
  triton_gpu,
)

# One tiny shape (N, Hq, R, D) for every interpret case, so that the reference
# compiles once per dtype. Per implementation, block sizes that leave a partial
# last token block and a partial last route block; for Triton, Hq and D also
# need padding to power-of-2 tiles.
SHAPE = (5, 3, 150, 24)
SCALE = 0.25
BLOCKS = {
    "triton": BlockSizes(block_n=2, block_r=64, block_n_bwd=3, block_r_bwd=32),
    "mosaic_tpu": BlockSizes(block_n=2, block_r=128),
}
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
_REFERENCE = functools.partial(sink_readout_reference, scale=SCALE)


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
  """On GPUs XLA may run float32 dots as TF32; the comparisons here want float32."""
  with jax.default_matmul_precision("highest"):
    yield


def _compare(readout, args, sink_logit, tol):
  compare_with_reference(readout, _REFERENCE, args, sink_logit, tol)


# --- the reference itself ------------------------------------------------------


def test_reference_hand_computed_single_route():
  """One token, one head, one route: α = e^s/(e^b0 + e^s), out = α·mem."""
  q = jnp.array([[[1.0, 2.0]]])
  mem = jnp.array([[[0.5, -1.0]]])
  b0, scale = 0.7, 0.5
  out, lse = jax.jit(sink_readout_reference, static_argnames="scale")(
      q, mem, sink_logit=b0, scale=scale)
  s = scale * (1.0 * 0.5 + 2.0 * -1.0)
  alpha = math.exp(s) / (math.exp(b0) + math.exp(s))
  np.testing.assert_allclose(out[0, 0], alpha * np.array([0.5, -1.0]), rtol=1e-6)
  np.testing.assert_allclose(lse[0, 0], math.log(math.exp(b0) + math.exp(s)), rtol=1e-6)


class Float64Test(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_reference_and_xla_path_keep_float64(self):
    """float64 in, float64 statistics out: equal to the float64 per-head loop of
    `lngram_jax.reference` (keys = values = mem, one KV head, T = 1) to ~1e-13, in
    values and in the gradients of q, mem and b0, jitted and not. A float32 step
    anywhere would show as ~1e-7. The Pallas kernels refuse float64 with a message."""
    from lngram_jax import reference  # the test's reference loop; kernels import no model

    with jax.enable_x64(True):
      rng = np.random.default_rng(0)
      q = jnp.asarray(rng.normal(size=(4, 3, 6)), jnp.float64)
      mem = jnp.asarray(rng.normal(size=(4, 5, 6)), jnp.float64)
      dout = jnp.asarray(rng.normal(size=(4, 3, 6)), jnp.float64)
      dlse = jnp.asarray(rng.normal(size=(4, 3)), jnp.float64)
      b0 = jnp.float64(0.7)
      scale = 1.0 / math.sqrt(6)  # the loop's 1/√Dh

      def loop(q, mem, sink_logit):
        kv = mem[:, None, :, None, :]            # [BT, 1, R, Hkv = 1, Dr]
        o, lse = reference.sink_gqa_reference(q[:, None], kv, kv, sink_logit=sink_logit)
        return o[:, 0], lse[:, 0]

      def values_and_grads(readout, q, mem, b0):
        (out, lse), vjp = jax.vjp(lambda q, m, b: readout(q, m, sink_logit=b), q, mem, b0)
        return (out, lse, *vjp((dout, dlse)))

      want = values_and_grads(loop, q, mem, b0)
      run = self.variant(values_and_grads, static_argnums=0)
      for readout in (functools.partial(sink_readout_reference, scale=scale),
                      functools.partial(sink_readout_kernel, scale=scale, implementation="xla")):
        got = run(readout, q, mem, b0)
        chex.assert_type(got, jnp.float64)
        chex.assert_trees_all_close(got, want, rtol=1e-13, atol=1e-13)
      with pytest.raises(TypeError, match="float64 only with implementation='xla'"):
        sink_readout_kernel(q, mem, sink_logit=0.0, implementation="triton")


# --- kernels in interpret mode ------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("implementation", ["triton", "mosaic_tpu"])
def test_kernel_matches_reference_ragged(implementation, dtype):
  N, Hq, R, D = SHAPE
  blocks = BLOCKS[implementation]
  assert N % blocks.block_n and R % blocks.block_r  # both last blocks are partial
  readout = functools.partial(sink_readout_kernel, scale=SCALE, implementation=implementation,
                              block_sizes=blocks, interpret=True)
  _compare(readout, readout_inputs(N, Hq, R, D, dtype), 0.8, TOLERANCE[dtype])


@pytest.mark.parametrize("implementation", ["triton", "mosaic_tpu"])
def test_kernel_sink_only_extreme(implementation):
  """Every score far below b0: all mass on the sink, out = 0, lse = b0 exactly."""
  q, mem, dout, dlse = readout_inputs(*SHAPE, jnp.float32, seed=1)
  mem = jnp.abs(mem) + 0.5
  q = -100.0 * (jnp.abs(q) + 0.5)  # every score <= -25·D·SCALE = -150: exp underflows
  b0 = 2.0
  readout = functools.partial(sink_readout_kernel, scale=SCALE, implementation=implementation,
                              block_sizes=BLOCKS[implementation], interpret=True)
  out, lse, dq, dmem, d_sink = values_and_grads(readout, q, mem, jnp.float32(b0), dout, dlse)
  chex.assert_trees_all_equal(
      (out, lse, dq, dmem),
      (jnp.zeros_like(out), jnp.full_like(lse, b0), jnp.zeros_like(dq), jnp.zeros_like(dmem)))
  np.testing.assert_allclose(d_sink, jnp.sum(dlse), rtol=1e-6)  # σ0 = 1, out = 0
  _compare(readout, (q, mem, dout, dlse), b0, 1e-6)


@pytest.mark.parametrize("implementation, backward", [("mosaic_tpu", "pallas"),
                                                     ("triton", "xla")])
def test_kernel_even_blocks(implementation, backward):
  """Blocks that divide N and R (for Mosaic one route block: the unmasked code
  path), and the XLA-VJP fallback of the backward."""
  N, Hq, R, D = 4, 2, 32, 16
  block_r = R if implementation == "mosaic_tpu" else 16
  readout = functools.partial(sink_readout_kernel, scale=SCALE, implementation=implementation,
                              interpret=True, backward=backward,
                              block_sizes=BlockSizes(block_n=2, block_r=block_r))
  _compare(readout, readout_inputs(N, Hq, R, D, jnp.float32, seed=2), 0.3, 2e-5)


def test_xla_implementation_is_the_reference():
  readout = functools.partial(sink_readout_kernel, scale=SCALE, implementation="xla")
  _compare(readout, readout_inputs(*SHAPE, jnp.float32), 0.5, 1e-7)


# --- dispatch and input checks -------------------------------------------------


def test_default_implementation_by_platform():
  from kernels.sink_readout import default_implementation
  assert default_implementation("gpu") == "triton"
  assert default_implementation("tpu") == "mosaic_tpu"
  assert default_implementation("cpu") == "triton"  # run in interpret mode


@pytest.mark.parametrize("kwargs, q_shape, mem_shape, dtype, error", [
    ({}, (2, 3), (2, 4, 8), jnp.float32, "q must be"),
    ({}, (2, 3, 8), (3, 4, 8), jnp.float32, "must agree"),
    ({}, (2, 3, 8), (2, 4, 8), jnp.int32, "dtype"),
    ({"implementation": "cuda"}, (2, 3, 8), (2, 4, 8), jnp.float32, "implementation"),
    ({"backward": "torch"}, (2, 3, 8), (2, 4, 8), jnp.float32, "backward"),
    ({"implementation": "triton", "block_sizes": BlockSizes(block_r=24)},
     (2, 3, 8), (2, 4, 8), jnp.float32, "power of 2"),
    ({"implementation": "mosaic_tpu", "block_sizes": BlockSizes(block_r=64)},
     (2, 3, 8), (2, 200, 8), jnp.float32, "multiple of 128"),
])
def test_input_checks(kwargs, q_shape, mem_shape, dtype, error):
  q = jnp.zeros(q_shape, dtype)
  mem = jnp.zeros(mem_shape, dtype)
  with pytest.raises((ValueError, TypeError), match=error):
    sink_readout_kernel(q, mem, sink_logit=0.0, **kwargs)


def test_block_sizes_validated():
  with pytest.raises(ValueError, match="block_r=0"):
    BlockSizes(block_r=0)


# --- lowering for the real backends, checked on CPU ----------------------------


def _loss(implementation, block_sizes, q, mem, sink_logit):
  out, lse = sink_readout_kernel(q, mem, sink_logit=sink_logit, scale=0.0625,
                                 implementation=implementation, block_sizes=block_sizes,
                                 interpret=False)
  return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse)


_LOWERING_CASES = {
    # default blocks: block_r 64 forward / 32 backward, 4 warps
    "triton_r121_d256": ("triton", "cuda", (100, 16, 121, 256), None),
    # heads and features padded to powers of 2, D > 256 defaults (8 warps)
    "triton_r300_d384_h12": ("triton", "cuda", (64, 12, 300, 384), None),
    # one route block (block_r >= R)
    "mosaic_r121_d256": ("mosaic_tpu", "tpu", (100, 16, 121, 256), None),
    # ragged route blocks and a ragged token block
    "mosaic_r300_d384_h12": ("mosaic_tpu", "tpu", (60, 12, 300, 384),
                             BlockSizes(block_n=8, block_r=128)),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("case", sorted(_LOWERING_CASES))
def test_forward_and_backward_lower(case, dtype):
  implementation, platform, (N, Hq, R, D), blocks = _LOWERING_CASES[case]
  avals = (jax.ShapeDtypeStruct((N, Hq, D), dtype), jax.ShapeDtypeStruct((N, R, D), dtype),
           jax.ShapeDtypeStruct((), jnp.float32))
  loss = functools.partial(_loss, implementation, blocks)
  forward_text = lower_text(loss, avals, platform)
  backward_text = lower_text(jax.grad(loss, argnums=(0, 1, 2)), avals, platform)
  assert forward_text.count(KERNEL_CALL[platform]) == 1
  assert backward_text.count(KERNEL_CALL[platform]) == 2  # forward + backward kernels


def test_lowering_rejects_what_interpret_accepts():
  """A non-power-of-2 Triton tile and a misaligned Mosaic block run in interpret
  mode but do not lower: the lowering checks above are not vacuous."""
  q, mem, _, _ = readout_inputs(2, 16, 48, 128, jnp.float32)
  triton_fwd = functools.partial(triton_gpu.forward, sink_logit=0.0, scale=0.1,
                                 block_n=1, block_r=48)
  mosaic_fwd = functools.partial(mosaic_tpu.forward, sink_logit=0.0, scale=0.1,
                                 block_n=1, block_r=20)
  want = jax.jit(functools.partial(sink_readout_reference, sink_logit=0.0, scale=0.1))(q, mem)
  for fwd in (triton_fwd, mosaic_fwd):
    got = fwd(q, mem, interpret=True)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="power of 2"):
    lower_text(triton_fwd, (q, mem), "cuda")
  with pytest.raises(ValueError, match="divisible by 8 and 128"):
    lower_text(mosaic_fwd, (q, mem), "tpu")


# --- on real hardware ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_triton_on_gpu(dtype):
  args = readout_inputs(300, 16, 121, 256, dtype)
  readout = functools.partial(sink_readout_kernel, scale=SCALE, implementation="triton")
  # f32 dots on the GPU may run as TF32 inside XLA's reference.
  _compare(readout, args, 1.0, 3e-2 if dtype == jnp.bfloat16 else 5e-3)


@pytest.mark.tpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_mosaic_on_tpu(dtype):
  args = readout_inputs(300, 16, 300, 256, dtype)
  readout = functools.partial(sink_readout_kernel, scale=SCALE, implementation="mosaic_tpu",
                              block_sizes=BlockSizes(block_n=8, block_r=128))
  _compare(readout, args, 1.0, 3e-2 if dtype == jnp.bfloat16 else 5e-3)
