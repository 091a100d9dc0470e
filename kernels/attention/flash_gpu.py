"""GPU: causal attention within segments by jax's Pallas Triton flash attention.

`flash_attention(q, k, v, segment_ids)` has `attention_reference`'s contract. The
kernel (jax.experimental.pallas.ops.gpu.attention.mha) takes as many KV heads as
query heads, so K and V are repeated over each group (O(T) memory, like K and V
themselves); it applies the causal mask and the segment-id equality itself and
has Triton backward kernels. Blocks of 128 tokens (or T when shorter) must
divide T, and Triton takes only power-of-2 tiles, so a T below 128 must be one
(`padded_length` is the length a caller pads to: an 82-token prompt goes to 128,
not to 96, whose 96-row tile XLA:GPU refuses); the head width is padded to a power
of 2 inside the kernel.
"""

from __future__ import annotations

import math
import warnings

import jax.numpy as jnp

BLOCK = 128            # forward tiles (the kernel's defaults)
BACKWARD_BLOCK = 32    # backward tiles: the dq and dkv kernels hold more per program


def forward_block(dtype, head_dim: int) -> int:
  """The forward's query and key tiles: BLOCK, or half of it for 4-byte inputs wider
  than 64 (f32 tiles of 128 x 128 asked for 257 KiB of shared memory on sm_90 and
  193 KiB on sm_80, more than a block holds: tests/kernels/test_gpu_compile.py).
  Both divide every length `supported` takes."""
  return BLOCK // 2 if jnp.dtype(dtype).itemsize >= 4 and head_dim > 64 else BLOCK


def supported(T: int, head_dim: int) -> bool:
  b = min(BLOCK, T)
  power_of_2 = b & (b - 1) == 0
  return (power_of_2 and T % b == 0 and T % min(BACKWARD_BLOCK, T) == 0 and b >= 16
          and head_dim >= 16)


def head_width_supported(head_dim: int) -> bool:
  return head_dim >= 16


def padded_length(T: int) -> int:
  """The least length >= T that `supported` takes."""
  if T > BLOCK:
    return -(-T // BLOCK) * BLOCK
  return max(16, 1 << (T - 1).bit_length())


def flash_attention(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, segment_ids_BxT, *,
                    interpret: bool = False):
  """`attention_reference` by the Triton kernel (module docstring): [B, T, Hq, Dh]."""
  with warnings.catch_warnings():
    # jax 0.11 deprecates this module for tokamax's attention, which jax 0.10 lacks; the
    # kernel is the same in both (DESIGN.md §6.8).
    warnings.filterwarnings("ignore", "jax.experimental.pallas.ops.gpu.attention",
                            DeprecationWarning)
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  if not supported(T, Dh):
    raise ValueError(f"flash_attention: T={T} must be a multiple of {min(BLOCK, T)} (>= 16) "
                     f"and Dh={Dh} >= 16.")
  G = Hq // k_BxTxHkvxDh.shape[2]
  k_BxTxHqxDh = jnp.repeat(k_BxTxHkvxDh, G, axis=2)   # query head h reads KV head h // G
  v_BxTxHqxDh = jnp.repeat(v_BxTxHkvxDh, G, axis=2)
  b, bb = min(forward_block(q_BxTxHqxDh.dtype, Dh), T), min(BACKWARD_BLOCK, T)
  sizes = gpu_attention.BlockSizes(block_q=b, block_k=b, block_q_dkv=bb, block_kv_dkv=bb,
                                   block_q_dq=bb, block_kv_dq=bb)
  return gpu_attention.mha(q_BxTxHqxDh, k_BxTxHqxDh, v_BxTxHqxDh,
                           segment_ids_BxT.astype(jnp.int32), sm_scale=1.0 / math.sqrt(Dh),
                           causal=True, block_sizes=sizes, interpret=interpret)
