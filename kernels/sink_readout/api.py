"""Dispatch for the sink readout: XLA reference, Triton (GPU) or Mosaic (TPU).

    out, lse = sink_readout(q_BTxHqxDr, mem_BTxRxDr, sink_logit=b0, scale=1/√dh)

`implementation=None` picks by platform: "triton" on GPU, "mosaic_tpu" on
TPU, and on CPU the Triton kernel in interpret mode (slow, but the same code
path, so a model using it runs everywhere). The Pallas paths are
differentiable through `jax.custom_vjp` with Pallas backward kernels;
`backward="xla"` swaps in the VJP of the XLA reference instead.

The op is standalone: it knows tokens, queries and memory rows, nothing of the
model that uses it (`lngram_jax.pallas` builds the Lngram readout on it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

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


def default_implementation(backend: str | None = None) -> Implementation:
  """The kernel for a jax backend name ("gpu", "tpu", "cpu")."""
  backend = jax.default_backend() if backend is None else backend
  return "mosaic_tpu" if backend == "tpu" else "triton"


def sink_readout(q_BTxHqxDr, mem_BTxRxDr, *, sink_logit, scale: float = 1.0,
                 implementation: Implementation | None = None,
                 block_sizes: BlockSizes | None = None, interpret: bool | None = None,
                 backward: Backward = "pallas"):
  """Multi-query sink-softmax attention with keys = values = mem.

  Args:
    q_BTxHqxDr: queries, BT tokens of Hq heads of width Dr.
    mem_BTxRxDr: each token's R memory tokens (same dtype as q): float32,
      bfloat16 or float16, and also float64 for implementation="xla".
    sink_logit: the sink logit b0, a float or a scalar (it may be
      traced; its gradient is Σ σ0·(dlse - dout·out) with σ0 the sink mass).
    scale: score scale, s = scale·q·mem (a Python float: it is compiled in).
    implementation: "xla", "triton", "mosaic_tpu" or None (by platform).
    block_sizes: tile sizes; None = `BlockSizes.get_default(implementation, Dr)`.
      `layout="token_block"` (Triton) selects the kernel that puts a block of
      tokens in each dot (`triton_amortised`), meant for small R.
    interpret: run the Pallas kernel in interpret mode; None = only on CPU.
    backward: "pallas" (the backward kernel) or "xla" (VJP of the reference).

  Returns:
    out_BTxHqxDr in q's dtype and lse_BTxHq in float32 (float64 for float64
    inputs), the log-sum-exp over
    {sink, routes}: the route mass is 1 - exp(b0 - lse).
  """
  impl = default_implementation() if implementation is None else implementation
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"sink_readout: implementation={impl!r} is not one of {IMPLEMENTATIONS}.")
  check_inputs(q_BTxHqxDr, mem_BTxRxDr, allow_float64=impl == "xla")
  if backward not in BACKWARDS:
    raise ValueError(f"sink_readout: backward={backward!r} is not one of {BACKWARDS}.")
  # b0 in the statistics dtype: float32 for the kernels, float64 on the xla path
  # for float64 inputs (a float32 b0 would round the whole readout to ~1e-7).
  sink_logit = jnp.asarray(sink_logit, stat_dtype(q_BTxHqxDr.dtype))
  scale = float(scale)
  if sink_logit.shape:
    raise ValueError(f"sink_readout: sink_logit must be a scalar; got shape {sink_logit.shape}.")
  if impl == "xla":
    return sink_readout_reference(q_BTxHqxDr, mem_BTxRxDr, sink_logit=sink_logit, scale=scale)
  R, Dr = mem_BTxRxDr.shape[1:]
  blocks = BlockSizes.get_default(impl, Dr) if block_sizes is None else block_sizes
  if impl == "triton":
    check_triton_blocks(blocks.block_n, blocks.block_r, blocks.layout)
    check_triton_blocks(blocks.bwd_n, blocks.bwd_r, blocks.layout)
  elif blocks.layout != "per_token":
    raise ValueError(f"sink_readout: layout={blocks.layout!r} is Triton only; "
                     f"implementation={impl!r} takes layout='per_token'.")
  else:
    check_mosaic_blocks(blocks.block_n, blocks.block_r, R)
    check_mosaic_blocks(blocks.bwd_n, blocks.bwd_r, R)
  interpret = jax.default_backend() == "cpu" if interpret is None else bool(interpret)
  return _sink_readout(q_BTxHqxDr, mem_BTxRxDr, sink_logit, scale, impl, blocks, interpret,
                       backward)


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
