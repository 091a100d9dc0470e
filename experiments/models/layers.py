"""Small building blocks of the decoder LM: RMSNorm, rotary embeddings, SwiGLU.

Shape legend: experiments/models/__init__.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lngram_jax.norms import rms_norm


def normal(std: float):
  return nnx.initializers.normal(stddev=std)


class RMSNorm(nnx.Module):
  """RMSNorm with a learned scale; statistics in float32 (lngram_jax.rms_norm)."""

  def __init__(self, dim: int, *, eps: float, param_dtype, scale_in_dtype: bool = False):
    self.eps = eps
    # Hugging Face Llama / Qwen multiply by the scale after casting the
    # normalised x back to its dtype; with bf16 that rounds differently.
    self.scale_in_dtype = scale_in_dtype
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))

  def __call__(self, x_BxTxD):
    if not self.scale_in_dtype:
      return rms_norm(x_BxTxD, self.scale[...], eps=self.eps)
    y_BxTxD = rms_norm(x_BxTxD, None, eps=self.eps)
    scale_D = self.scale[...]
    return (scale_D * y_BxTxD.astype(scale_D.dtype)).astype(
        jnp.promote_types(scale_D.dtype, x_BxTxD.dtype))


def segment_positions(segment_ids_BxT) -> jnp.ndarray:
  """Positions that restart at 0 at every segment start: int32 [B, T].

  A segment starts where the id differs from the previous token's id, so a
  packed row [a a a b b c] gets positions [0 1 2 0 1 0].
  """
  B, T = segment_ids_BxT.shape
  t_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  prev_BxT = jnp.pad(segment_ids_BxT[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
  starts_BxT = jnp.where(segment_ids_BxT != prev_BxT, t_BxT, 0)
  # The latest start at or before t is a running max of the start indices.
  return t_BxT - jax.lax.cummax(starts_BxT, axis=1)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> np.ndarray:
  """The Dh/2 inverse frequencies theta^(-2i/Dh), float32, optionally rescaled.

  scaling = {"rope_type": "llama3", "factor", "low_freq_factor",
  "high_freq_factor", "original_max_position_embeddings"}: Llama 3's rule
  (transformers `_compute_llama3_parameters`): wavelengths longer than
  original/low_freq_factor are slowed by `factor`, shorter than
  original/high_freq_factor kept, and those between blended linearly in
  original/wavelength. Computed in numpy at build time (a constant).
  """
  inv_freq_F = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  inv_freq_F = inv_freq_F.astype(np.float32)
  if not scaling:
    return inv_freq_F
  if scaling.get("rope_type") != "llama3":
    raise ValueError(f"rope scaling {scaling.get('rope_type')!r} is not supported "
                     "(supported: 'llama3').")
  factor = float(scaling["factor"])
  low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
  old_len = float(scaling["original_max_position_embeddings"])
  wavelen_F = 2 * np.pi / inv_freq_F
  scaled_F = np.where(wavelen_F > old_len / low, inv_freq_F / factor, inv_freq_F)
  smooth_F = (old_len / wavelen_F - low) / (high - low)
  smoothed_F = (1 - smooth_F) * scaled_F / factor + smooth_F * scaled_F
  medium_F = ~(wavelen_F < old_len / high) & ~(wavelen_F > old_len / low)
  return np.where(medium_F, smoothed_F, scaled_F).astype(np.float32)


def mrope_axes(head_dim: int, mrope_section, interleaved: bool) -> np.ndarray:
  """Which position axis (0 t, 1 h, 2 w) drives each of the Dh/2 frequencies: int [F].

  Multimodal RoPE (Qwen2-VL, arXiv 2409.12191; Qwen3-VL's interleaved form):
  `mrope_section` = (n_t, n_h, n_w) frequencies per axis, summing to Dh/2.
  Interleaved (transformers `Qwen3VLTextRotaryEmbedding`): frequency i takes h
  when i % 3 == 1 and i < 3·n_h, w when i % 3 == 2 and i < 3·n_w, else t.
  Not interleaved (Qwen2-VL): the first n_t frequencies t, the next n_h h, then w.
  """
  F = head_dim // 2
  n_t, n_h, n_w = (int(n) for n in mrope_section)
  if n_t + n_h + n_w != F:
    raise ValueError(f"mrope_section={tuple(mrope_section)} must sum to head_dim/2={F}.")
  if not interleaved:
    return np.repeat(np.arange(3), (n_t, n_h, n_w)).astype(np.int32)
  i = np.arange(F)
  axes = np.zeros(F, np.int32)
  axes[(i % 3 == 1) & (i < 3 * n_h)] = 1
  axes[(i % 3 == 2) & (i < 3 * n_w)] = 2
  return axes


def rope(x_BxTxHxDh, positions_BxT, *, theta: float, inv_freq_F=None, axes_F=None):
  """Rotary position embedding (rotate-half form), computed in float32.

  Channel i < Dh/2 pairs with channel i + Dh/2 and turns by the angle
  position · theta^(-2i/Dh) (or position · inv_freq_F[i], see `rope_inv_freq`).
  This is the Hugging Face Llama convention: x·cos + rotate_half(x)·sin.
  Multimodal RoPE: positions [3, B, T] (t, h, w) and `axes_F` (`mrope_axes`)
  naming the axis each frequency reads; [B, T] positions mean t = h = w.
  """
  Dh = x_BxTxHxDh.shape[-1]
  half = Dh // 2
  if inv_freq_F is None:
    inv_freq_F = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / Dh)
  if positions_BxT.ndim == 3:
    if axes_F is None:
      raise ValueError("rope: positions [3, B, T] need axes_F (an mrope_section).")
    angle_3xBxTxF = positions_BxT.astype(jnp.float32)[..., None] * inv_freq_F
    # One-hot select of the axis per frequency: exact (a sum of one nonzero term).
    pick_3xF = jnp.asarray(np.arange(3)[:, None] == np.asarray(axes_F)[None, :])
    angle_BxTxF = jnp.where(pick_3xF[:, None, None, :], angle_3xBxTxF, 0.0).sum(0)
  else:
    angle_BxTxF = positions_BxT.astype(jnp.float32)[..., None] * inv_freq_F
  sin_BxTx1xF = jnp.sin(angle_BxTxF)[:, :, None, :]
  cos_BxTx1xF = jnp.cos(angle_BxTxF)[:, :, None, :]
  x = x_BxTxHxDh.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos_BxTx1xF - x2 * sin_BxTx1xF,
                         x2 * cos_BxTx1xF + x1 * sin_BxTx1xF], axis=-1)
  return out.astype(x_BxTxHxDh.dtype)


class SwiGLU(nnx.Module):
  """y = (SiLU(x W_gate) ⊙ x W_up) W_down."""

  def __init__(self, d_model: int, ffn_dim: int, *, dtype, param_dtype, init_std: float,
               out_std: float, rngs: nnx.Rngs):
    self.dtype = dtype
    self.w_gate = nnx.Param(normal(init_std)(rngs.params(), (d_model, ffn_dim), param_dtype))
    self.w_up = nnx.Param(normal(init_std)(rngs.params(), (d_model, ffn_dim), param_dtype))
    self.w_down = nnx.Param(normal(out_std)(rngs.params(), (ffn_dim, d_model), param_dtype))

  def __call__(self, x_BxTxD, mesh=None):
    """`mesh`: the device mesh of a sharded forward (None: one device). On it each
    weight is read whole (`whole`), the FSDP pattern."""
    x_BxTxD = x_BxTxD.astype(self.dtype)
    w_gate, w_up, w_down = (whole(cast(w[...], self.dtype), mesh)
                            for w in (self.w_gate, self.w_up, self.w_down))
    gate_BxTxF = jnp.einsum("btd,df->btf", x_BxTxD, w_gate)
    up_BxTxF = jnp.einsum("btd,df->btf", x_BxTxD, w_up)
    return jnp.einsum("btf,fd->btd", jax.nn.silu(gate_BxTxF) * up_BxTxF, w_down)


def cast(w, dtype):
  """`w` in `dtype`, the same array when it already is: qwix's LoRA (experiments/models/
  lora.py) finds a projection's weight by identity, and outside jit a no-op astype under
  `jax.grad` makes a new tracer."""
  return w if w.dtype == jnp.dtype(dtype) else w.astype(dtype)


def whole(w, mesh):
  """`w` replicated on every device of `mesh` where it is read: the FSDP gather, so the
  activations keep their batch layout and the weight's gradient is reduced back to its
  shards. Left to itself XLA's partitioner sometimes computes with the weight's shard
  instead, moving the activations: in Qwen3-VL-8B's Stage II step it gathered a
  [8, 16,646, 4,096] output gradient and swapped [16,646, 12,288] SwiGLU products between
  devices by all-to-all (15.5 GiB a device per step; BENCHMARKS.md). `w` unchanged
  without a mesh of more than one device."""
  if mesh is None or mesh.size == 1:
    return w
  from jax.sharding import NamedSharding, PartitionSpec
  return jax.lax.with_sharding_constraint(w, NamedSharding(mesh, PartitionSpec()))


class Embedding(nnx.Module):
  """Token embedding; `attend` is the tied output projection (float32 logits)."""

  def __init__(self, vocab_size: int, d_model: int, *, dtype, param_dtype,
               init_std: float, rngs: nnx.Rngs):
    self.dtype = dtype
    self.table = nnx.Param(normal(init_std)(rngs.params(), (vocab_size, d_model), param_dtype))

  def __call__(self, tokens_BxT):
    return jnp.take(self.table[...], tokens_BxT, axis=0).astype(self.dtype)

  def attend(self, x_BxTxD):
    return jnp.einsum("btd,vd->btv", x_BxTxD, self.table[...].astype(self.dtype),
                      preferred_element_type=jnp.float32)
