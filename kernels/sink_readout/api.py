"""Dispatch for the sink readout: XLA reference, Triton (GPU) or Mosaic (TPU).

    out, lse = sink_readout_kernel(q_BTxHqxDr, mem_BTxRxDr, sink_logit=b0, scale=1/√dh)

`implementation=None` picks by the platform the program is lowered for, not
by the process that traces it (`jax.lax.platform_dependent`): "mosaic_tpu" in
a program compiled for TPU, "triton" for a GPU, and elsewhere (CPU) the Triton
kernel in interpret mode (slow, but the same code path, so a model using it
runs everywhere). A CPU host compiling for a TPU topology (`lngram-exp plan
--target`) therefore gets the Mosaic kernel. Likewise `interpret=None` runs a
kernel compiled on its own platform and interpreted on any other. The Pallas
paths are differentiable through `jax.custom_vjp` with Pallas backward
kernels; `backward="xla"` swaps in the VJP of the XLA reference instead.

The op is standalone: it knows tokens, queries and memory rows, nothing of the
model that uses it (`lngram_jax.pallas` builds the Lngram readout on it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from kernels.out_shapes import vary_like
from kernels.sink_readout import mosaic_tpu, triton_amortised, triton_gpu
from kernels.sink_readout.common import (
  BACKWARDS,
  IMPLEMENTATIONS,
  Backward,
  BlockSizes,
  Implementation,
  check_inputs,
  check_mosaic_blocks,
  check_triton_blocks,
  sink_logit_cotangent,
)
from kernels.sink_readout.reference import (
  sink_readout_reference,
  sink_readout_reference_bwd,
  stat_dtype,
)

# The platforms (`platform_dependent`'s names) each kernel is compiled for; on any
# other platform it runs in interpret mode.
NATIVE_PLATFORMS = {"triton": ("cuda", "rocm"), "mosaic_tpu": ("tpu",)}


def default_implementation(backend: str | None = None) -> Implementation:
  """The kernel for a platform name ("gpu", "cuda", "rocm", "tpu", "cpu"); without
  one, the process's default backend (what an eager call runs on)."""
  backend = jax.default_backend() if backend is None else backend
  return "mosaic_tpu" if backend == "tpu" else "triton"


def sink_readout_kernel(q_BTxHqxDr, mem_BTxRxDr, *, sink_logit, scale: float = 1.0,
                        implementation: Implementation | None = None,
                        block_sizes: BlockSizes | None = None,
                        interpret: bool | None = None, backward: Backward = "pallas"):
  """Multi-query sink-softmax attention with keys = values = mem.

  Args:
    q_BTxHqxDr: queries, BT tokens of Hq heads of width Dr.
    mem_BTxRxDr: each token's R memory tokens (same dtype as q): float32,
      bfloat16 or float16, and also float64 for implementation="xla".
    sink_logit: the sink logit b0, a float or a scalar (it may be
      traced; its gradient is Σ σ0·(dlse - dout·out) with σ0 the sink mass).
    scale: score scale, s = scale·q·mem (a Python float: it is compiled in).
    implementation: "xla", "triton", "mosaic_tpu" or None (by the platform the
      program is lowered for: module docstring).
    block_sizes: tile sizes; None = `BlockSizes.get_default(implementation, Dr)`.
      `layout="token_block"` (Triton) selects the kernel that puts a block of
      tokens in each dot (`triton_amortised`), meant for small R. With
      implementation=None they serve every platform's kernel they fit; one they do
      not fit (the Mosaic kernel and a Triton layout) takes its defaults.
    interpret: run the Pallas kernel in interpret mode; None = on every platform
      but the kernel's own (Triton: cuda, rocm; Mosaic: tpu).
    backward: "pallas" (the backward kernel) or "xla" (VJP of the reference).

  Returns:
    out_BTxHqxDr in q's dtype and lse_BTxHq in float32 (float64 for float64
    inputs), the log-sum-exp over
    {sink, routes}: the route mass is 1 - exp(b0 - lse).
  """
  if implementation is not None and implementation not in IMPLEMENTATIONS:
    raise ValueError(f"sink_readout_kernel: implementation={implementation!r} is not one of "
                     f"{IMPLEMENTATIONS}.")
  check_inputs(q_BTxHqxDr, mem_BTxRxDr, allow_float64=implementation == "xla")
  if backward not in BACKWARDS:
    raise ValueError(f"sink_readout_kernel: backward={backward!r} is not one of {BACKWARDS}.")
  # b0 in the statistics dtype: float32 for the kernels, float64 on the xla path
  # for float64 inputs (a float32 b0 would round the whole readout to ~1e-7).
  sink_logit = jnp.asarray(sink_logit, stat_dtype(q_BTxHqxDr.dtype))
  scale = float(scale)
  if sink_logit.shape:
    raise ValueError(f"sink_readout_kernel: sink_logit must be a scalar; got shape "
                     f"{sink_logit.shape}.")
  if implementation == "xla":
    return sink_readout_reference(q_BTxHqxDr, mem_BTxRxDr, sink_logit=sink_logit, scale=scale)
  # Inside shard_map the kernel's b0 cotangent varies like q and mem: so must b0.
  sink_logit = vary_like(sink_logit, q_BTxHqxDr, mem_BTxRxDr)
  R = mem_BTxRxDr.shape[1]

  def branch(impl: Implementation, platform: str | None):
    """The kernel call of one lowering platform (None: any platform not named)."""
    try:
      blocks = _blocks(impl, block_sizes, R, mem_BTxRxDr.shape[2])
    except ValueError:
      if implementation is not None:
        raise
      # Tiles for another platform's kernel (a Triton layout, say): this one's defaults.
      blocks = _blocks(impl, None, R, mem_BTxRxDr.shape[2])
    native = platform in NATIVE_PLATFORMS[impl]
    run_interpreted = (not native) if interpret is None else bool(interpret)
    return lambda q, mem, b0: _sink_readout(q, mem, b0, scale, impl, blocks, run_interpreted,
                                            backward)

  # One branch object per kernel build: platform_dependent joins the platforms sharing it.
  if implementation is None:   # the kernel of the platform the program is lowered for
    gpu = branch("triton", "cuda")
    per_platform = {"tpu": branch("mosaic_tpu", "tpu"), "cuda": gpu, "rocm": gpu,
                    "default": branch("triton", None)}
  else:   # one kernel: compiled on its platforms, interpreted on the others
    native = branch(implementation, NATIVE_PLATFORMS[implementation][0])
    per_platform = {p: native for p in NATIVE_PLATFORMS[implementation]}
    per_platform["default"] = branch(implementation, None)
  return jax.lax.platform_dependent(q_BTxHqxDr, mem_BTxRxDr, sink_logit, **per_platform)


def _blocks(impl: Implementation, block_sizes: BlockSizes | None, routes: int,
            route_dim: int) -> BlockSizes:
  """The tiles of `impl`: `block_sizes` checked for it, or its defaults."""
  blocks = BlockSizes.get_default(impl, route_dim) if block_sizes is None else block_sizes
  if impl == "triton":
    check_triton_blocks(blocks.block_n, blocks.block_r, blocks.layout)
    check_triton_blocks(blocks.bwd_n, blocks.bwd_r, blocks.layout)
  elif blocks.layout != "per_token":
    raise ValueError(f"sink_readout_kernel: layout={blocks.layout!r} is Triton only; "
                     f"implementation={impl!r} takes layout='per_token'.")
  else:
    check_mosaic_blocks(blocks.block_n, blocks.block_r, routes)
    check_mosaic_blocks(blocks.bwd_n, blocks.bwd_r, routes)
  return blocks


def _triton(blocks):
  """The Triton module of the block sizes' layout."""
  return triton_amortised if blocks.layout == "token_block" else triton_gpu


def _kernel_forward(q, mem, sink_logit, scale, impl, blocks, interpret):
  if impl == "triton":
    return _triton(blocks).forward(
        q, mem, sink_logit=sink_logit, scale=scale, block_n=blocks.block_n,
        block_r=blocks.block_r, num_warps=blocks.num_warps, num_stages=blocks.num_stages,
        interpret=interpret)
  return mosaic_tpu.forward(q, mem, sink_logit=sink_logit, scale=scale,
                            block_n=blocks.block_n, block_r=blocks.block_r,
                            interpret=interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _sink_readout(q, mem, sink_logit, scale, impl, blocks, interpret, backward):
  del backward
  return _kernel_forward(q, mem, sink_logit, scale, impl, blocks, interpret)


def _sink_readout_fwd(q, mem, sink_logit, scale, impl, blocks, interpret, backward):
  del backward
  out, lse = _kernel_forward(q, mem, sink_logit, scale, impl, blocks, interpret)
  return (out, lse), (q, mem, sink_logit, out, lse)


def _sink_readout_bwd(scale, impl, blocks, interpret, backward, residuals, cotangents):
  q, mem, sink_logit, out, lse = residuals
  dout, dlse = cotangents
  dlse = dlse.astype(jnp.float32)
  if backward == "xla":
    return sink_readout_reference_bwd(q, mem, sink_logit, dout, dlse, scale=scale)
  if impl == "triton":
    dq, dmem = _triton(blocks).backward(
        q, mem, out, lse, dout, dlse, scale=scale, block_n=blocks.bwd_n,
        block_r=blocks.bwd_r, num_warps=blocks.num_warps, num_stages=blocks.num_stages,
        interpret=interpret)
  else:
    dq, dmem = mosaic_tpu.backward(q, mem, out, lse, dout, dlse, scale=scale,
                                   block_n=blocks.bwd_n, block_r=blocks.bwd_r,
                                   interpret=interpret)
  return dq, dmem, sink_logit_cotangent(sink_logit, out, lse, dout, dlse)


_sink_readout.defvjp(_sink_readout_fwd, _sink_readout_bwd)
