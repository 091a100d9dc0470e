"""TPU: causal attention within segments by jax's splash attention kernel (Mosaic).

`splash_attention(q, k, v, segment_ids)` has `attention_reference`'s contract. The
kernel (jax.experimental.pallas.ops.tpu.splash_attention) runs per row (vmapped)
on head-major [H, T, Dh] arrays, grouped-query natively (Hq a multiple of Hkv),
with a causal mask whose fully masked blocks it skips and the segment ids as
its second mask; the backward is its own dq and dkv kernels. Scores are not
scaled by the kernel: q is multiplied by 1/√Dh first. Blocks of `block` tokens
(512, or T when shorter) must divide T, a multiple of 128: `padded_length` is the
length a caller pads to (`kernels.attention.api` does, with a segment of its own).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_BLOCK = 512


def supported(T: int, head_dim: int, block: int = DEFAULT_BLOCK) -> bool:
  """Shapes the kernel takes: T a multiple of 128 split into equal blocks, and a head
  width of 64 or a multiple of 128 (the TPU's lanes)."""
  b = min(block, T)
  return T % 128 == 0 and T % b == 0 and head_width_supported(head_dim)


def head_width_supported(head_dim: int) -> bool:
  return head_dim == 64 or head_dim % 128 == 0


def padded_length(T: int, block: int = DEFAULT_BLOCK) -> int:
  """The least length >= T that `supported` takes: a multiple of 128 up to one block,
  of the block beyond."""
  unit = 128 if T <= block else block
  return -(-T // unit) * unit


@functools.lru_cache(maxsize=32)
def _kernel(T: int, heads: int, block: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
  b = min(block, T)
  sizes = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                        block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  mask = sm.MultiHeadMask([sm.CausalMask((T, T)) for _ in range(heads)])
  # The kernel holds its block-mask tables as arrays: built concretely (not as tracers of
  # whichever trace first asks) and kept as numpy, so that the cached kernel serves every
  # later trace and holds no device memory (each trace stages them as constants).
  with jax.ensure_compile_time_eval():
    kernel = sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                interpret=interpret)
  kernel = jax.tree.map(lambda a: np.array(a, copy=True), kernel)   # a copy: a view pins it
  return kernel, sk.SegmentIds


def splash_attention(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, segment_ids_BxT, *,
                     block: int = DEFAULT_BLOCK, interpret: bool = False):
  """`attention_reference` by the splash kernel (module docstring): [B, T, Hq, Dh]."""
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  if not supported(T, Dh, block):
    raise ValueError(f"splash_attention: T={T} and Dh={Dh} do not fit the kernel (T a "
                     f"multiple of 128 and of the block {min(block, T)}; Dh 64 or a "
                     "multiple of 128).")
  kernel, segment_ids = _kernel(T, Hq, block, bool(interpret))
  scale = 1.0 / math.sqrt(Dh)
  q_BxHqxTxDh = jnp.swapaxes(q_BxTxHqxDh * jnp.asarray(scale, q_BxTxHqxDh.dtype), 1, 2)
  k_BxHkvxTxDh = jnp.swapaxes(k_BxTxHkvxDh, 1, 2)
  v_BxHkvxTxDh = jnp.swapaxes(v_BxTxHkvxDh, 1, 2)

  def row(q, k, v, seg_T):
    return kernel(q, k, v, segment_ids=segment_ids(q=seg_T, kv=seg_T))

  o_BxHqxTxDh = jax.vmap(row)(q_BxHqxTxDh, k_BxHkvxTxDh, v_BxHkvxTxDh,
                              segment_ids_BxT.astype(jnp.int32))
  return jnp.swapaxes(o_BxHqxTxDh, 1, 2).astype(q_BxTxHqxDh.dtype)
