"""Block sizes and input checks shared by the sink-readout kernels."""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import jax.numpy as jnp

# Masked scores. Finite so that (mask - running max) never turns into
# inf - inf; the running max starts at the sink logit b0, so exp(mask - max)
# underflows to exactly 0 without any special case.
MASK_VALUE = float(jnp.finfo(jnp.float32).min)

Implementation = Literal["xla", "triton", "mosaic_tpu"]
Backward = Literal["pallas", "xla"]
# How a Triton program covers its tokens: one dot per token ("per_token",
# `triton_gpu`) or all block_n tokens in one block-diagonal dot ("token_block",
# `triton_amortised`, for small R).
Layout = Literal["per_token", "token_block"]
IMPLEMENTATIONS: tuple[str, ...] = get_args(Implementation)
BACKWARDS: tuple[str, ...] = get_args(Backward)
LAYOUTS: tuple[str, ...] = get_args(Layout)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the sink-readout kernels.

  Tokens are independent (each has its own R memory tokens), so the grid runs
  over token blocks and each program loops over route blocks with an online
  softmax. Nothing is shared between tokens: a larger `block_n` only
  amortises per-program overhead (it matters on TPU, where every grid step
  costs ~0.35 µs; on GPU one token per program is the natural choice).

  Attributes:
    block_n: tokens per program, forward.
    block_r: routes per inner step, forward. Triton: a power of 2 (>= 16).
      Mosaic: a multiple of 128, or >= R (then one step covers all routes).
    block_n_bwd, block_r_bwd: the same for the backward kernel; None means
      the forward value.
    num_warps, num_stages: Triton only (None picks from the tile size).
    layout: Triton only. "per_token": a program loops over its tokens, one
      [Hq, Dr]·[Dr, block_r] dot each. "token_block": its block_n tokens (a
      power of 2) share one block-diagonal dot, amortising the per-program
      cost at small R (`triton_amortised`; defaults from
      `get_default("triton", Dr, layout="token_block")`).
  """

  block_n: int = 1
  block_r: int = 64
  block_n_bwd: int | None = None
  block_r_bwd: int | None = None
  num_warps: int | None = None
  num_stages: int = 2
  layout: Layout = "per_token"

  def __post_init__(self):
    for name in ("block_n", "block_r", "block_n_bwd", "block_r_bwd", "num_warps"):
      value = getattr(self, name)
      if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"BlockSizes: {name}={value!r} must be a positive int or None.")
    if self.layout not in LAYOUTS:
      raise ValueError(f"BlockSizes: layout={self.layout!r} is not one of {LAYOUTS}.")

  @property
  def bwd_n(self) -> int:
    return self.block_n if self.block_n_bwd is None else self.block_n_bwd

  @property
  def bwd_r(self) -> int:
    return self.block_r if self.block_r_bwd is None else self.block_r_bwd

  @classmethod
  def get_default(cls, implementation: Implementation, route_dim: int = 256,
                  layout: Layout = "per_token", itemsize: int = 2) -> BlockSizes:
    """Defaults per implementation; route_dim (Dr) sets the register budget.

    itemsize: bytes per element of q and mem (2 for bf16/f16, 4 for f32); the
    token-block forward's shared memory grows with it (see below).
    """
    if layout == "token_block":
      # Untuned (timed by `experiments.tools.bench.kernels`). The stacked tiles hold
      # block_n times the rows of the per-token ones: two tokens, and the
      # backward's [block_n·block_r, Dr] mem and dmem tiles kept at 32 rows.
      # The forward's shared memory is num_stages·(block_n·block_r)·Dr + block_n·Hq·Dr
      # elements (the pipelined mem tile and q): 288 KiB at f32, block_r 64, Dr 256,
      # Hq 16, over the 227 KiB an H100/H200 block may hold (Triton refused it on an
      # H200), so 4-byte inputs take half the routes per step.
      # An A100 block holds 163 KiB: at f32 and Dr 256 the backward's block_r 16 asked
      # for 176 KiB (XLA:GPU's compile for sm_80 refused it,
      # tests/kernels/test_gpu_compile.py), so wide f32 rows take half the routes.
      wide = itemsize >= 4
      if route_dim > 256:
        return cls(block_n=2, block_r=16 if wide else 32, block_r_bwd=8, num_warps=8,
                   layout=layout)
      wide_rows = wide and route_dim > 128
      return cls(block_n=2, block_r=16 if wide_rows else (32 if wide else 64),
                 block_r_bwd=8 if wide_rows else 16, num_warps=4, layout=layout)
    if implementation == "mosaic_tpu":
      # Untuned (no TPU measurements yet); sized so that the backward's double-
      # buffered mem and dmem blocks stay within a few MiB of VMEM at Dr = 512.
      return cls(block_n=8, block_r=256, block_n_bwd=4, block_r_bwd=256)
    # Triton (untuned: `python -m experiments.tools.bench.kernels --sweep` compares a few): the
    # backward holds q, dout, dq [Hq, Dr] and mem, dmem [block_r, Dr] in
    # registers, so it takes half the routes of the forward.
    if route_dim > 256:
      return cls(block_n=1, block_r=32, block_r_bwd=16, num_warps=8)
    return cls(block_n=1, block_r=64, block_r_bwd=32, num_warps=4)


# Shared memory one thread block may hold on an H100/H200 (Triton's error names it).
HOPPER_SMEM_BYTES = 232448


def token_block_forward_smem_bytes(blocks: BlockSizes, q_heads: int, route_dim: int,
                                   itemsize: int) -> int:
  """Shared memory the token-block forward asks for: the pipelined [block_n·block_r, Dr]
  mem tile (num_stages copies) and the [block_n·Hq, Dr] q tile, padded as Triton pads.
  Matches the 294,912 bytes an H200 refused for f32, block_n 2, block_r 64, Hq 16, Dr 256."""
  rows = blocks.num_stages * triton_pad(blocks.block_n * blocks.block_r)
  rows += triton_pad(blocks.block_n * triton_pad(q_heads))
  return rows * triton_pad(route_dim) * itemsize


def next_power_of_2(x: int) -> int:
  return 1 if x <= 1 else 1 << (x - 1).bit_length()


def triton_pad(x: int) -> int:
  """Padded tile extent for Triton: a power of 2, at least 16 (tl.dot's minimum)."""
  return max(16, next_power_of_2(x))


def sink_logit_cotangent(sink_logit, out_xHxDr, lse_xH, dout_xHxDr, dlse_xH):
  """Cotangent of b0: ∂lse/∂b0 = σ0 and ∂out/∂b0 = -σ0·out, σ0 = exp(b0 - lse).

  b0 is normally a constant: then nothing consumes this and XLA drops it.
  """
  delta_xH = jnp.sum(out_xHxDr.astype(jnp.float32) * dout_xHxDr.astype(jnp.float32), axis=-1)
  sink_mass_xH = jnp.exp(sink_logit - lse_xH)
  return jnp.sum(sink_mass_xH * (dlse_xH.astype(jnp.float32) - delta_xH))


def check_inputs(q_BTxHqxDr, mem_BTxRxDr, *, allow_float64: bool = False) -> None:
  """Shape and dtype checks of the public entry point, with named values.

  allow_float64: the XLA path computes in any float dtype; the kernels do not.
  """
  if q_BTxHqxDr.ndim != 3:
    raise ValueError(f"sink_readout: q must be [BT, Hq, Dr]; got shape {tuple(q_BTxHqxDr.shape)}.")
  if mem_BTxRxDr.ndim != 3:
    raise ValueError(
        f"sink_readout: mem must be [BT, R, Dr]; got shape {tuple(mem_BTxRxDr.shape)}.")
  BT, Hq, Dr = q_BTxHqxDr.shape
  n_mem, R, d_mem = mem_BTxRxDr.shape
  if n_mem != BT or d_mem != Dr:
    raise ValueError(
        f"sink_readout: q {tuple(q_BTxHqxDr.shape)} and mem {tuple(mem_BTxRxDr.shape)} must agree "
        f"on BT and Dr ({BT=}, {n_mem=}, {Dr=}, {d_mem=}).")
  if min(BT, Hq, R, Dr) < 1:
    raise ValueError(f"sink_readout: empty input ({BT=}, {Hq=}, {R=}, {Dr=}).")
  allowed = (jnp.float32, jnp.bfloat16, jnp.float16) + ((jnp.float64,) if allow_float64 else ())
  names = "float32, bfloat16, float16 or float64" if allow_float64 else (
      "float32, bfloat16 or float16 (float64 only with implementation='xla')")
  for name, x in (("q", q_BTxHqxDr), ("mem", mem_BTxRxDr)):
    if x.dtype not in allowed:
      raise TypeError(f"sink_readout: {name} dtype {x.dtype} must be {names}.")
  if q_BTxHqxDr.dtype != mem_BTxRxDr.dtype:
    raise TypeError(
        f"sink_readout: q dtype {q_BTxHqxDr.dtype} must equal mem dtype {mem_BTxRxDr.dtype}.")


def check_triton_blocks(block_n: int, block_r: int, layout: Layout = "per_token") -> None:
  if layout == "token_block":
    # block_n·block_r is the dot's N side (>= 16); block_r alone may be smaller.
    if block_n != next_power_of_2(block_n) or block_r != next_power_of_2(block_r) or (
        block_n * block_r < 16):
      raise ValueError(f"triton sink readout, layout='token_block': {block_n=} and {block_r=}"
                       " must be powers of 2 with block_n·block_r >= 16.")
    return
  if block_r != next_power_of_2(block_r) or block_r < 16:
    raise ValueError(f"triton sink readout: {block_r=} must be a power of 2 and >= 16.")
  del block_n  # any positive int: the token loop is sequential inside a program


def check_mosaic_blocks(block_n: int, block_r: int, routes: int) -> None:
  if block_r < routes and block_r % 128:
    raise ValueError(
        f"mosaic sink readout: {block_r=} must be a multiple of 128 or >= R={routes}.")
  del block_n  # leading (untiled) dimension: any size
