"""The Qwen3-VL vision tower: patch embedding, interpolated positions, 2-D rotary ViT, mergers.

Shape legend: N patches of all images (each image's patches in merge-block
order: the m x m patches of one LM token are consecutive, as the HF
processor emits them), P = C·T·p·p values per patch, E the ViT width, M = N/m²
merged tokens, D the LM width.

    x_NxE = pixel_values_NxP W_patch + b + pos_embed(bilinear, per image grid)
    x_NxE = blocks(x_NxE)          attention only within one frame of one image
    merged_MxD = merger(x)         LayerNorm(E), group m² patches, MLP -> D
    deepstack[k] = merger_k(x after ViT layer deepstack_visual_indexes[k])
                                   group m² patches, LayerNorm(m²E), MLP -> D

The grid-dependent index arrays (position-table taps and weights, rotary
coordinates, frame ids) are computed on the host from `grid_thw`, which is
static: one program per set of image grids. Mirrors transformers'
`Qwen3VLVisionModel` (modeling_qwen3_vl.py) and its helpers in vision_utils.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.attention import attend
from experiments.models.layers import normal
from experiments.vlm.qwen3vl.config import VisionConfig


def _grid(grid_thw) -> np.ndarray:
  g = np.asarray(grid_thw, np.int64).reshape(-1, 3)
  if (g < 1).any():
    raise ValueError(f"image_grid_thw must hold positive (t, h, w) rows; got {g.tolist()}.")
  return g


def patch_coords(grid_thw, merge: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(row, col, frame) of every patch, int [N]: merge-block order within a frame,
  frames of an image in turn, images in turn. `frame` numbers the attention
  segments (one per frame of each image)."""
  rows, cols, frames, frame = [], [], [], 0
  for t, h, w in _grid(grid_thw):
    if h % merge or w % merge:
      raise ValueError(f"image grid (h, w)=({h}, {w}) is not a multiple of "
                       f"spatial_merge_size={merge}.")
    r, c = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    r = r.reshape(shape).transpose(0, 2, 1, 3).ravel()
    c = c.reshape(shape).transpose(0, 2, 1, 3).ravel()
    for _ in range(t):
      rows.append(r)
      cols.append(c)
      frames.append(np.full(h * w, frame))
      frame += 1
  return np.concatenate(rows), np.concatenate(cols), np.concatenate(frames)


def frame_groups(frame_N) -> tuple[np.ndarray, ...]:
  """The patch indices [F, S] of each set of F frames that hold S patches each.

  Attention runs within a frame (transformers' cu_seqlens): frames of one size
  attend as one batch, so the cost is that of the frames, never [N, N] over every
  patch of the step. A training step with one image size is one group whose
  indices are 0..N-1 in order."""
  frame_N = np.asarray(frame_N)
  starts = np.flatnonzero(np.r_[True, frame_N[1:] != frame_N[:-1]])
  lengths = np.diff(np.r_[starts, frame_N.size])
  return tuple(np.stack([np.arange(a, a + S) for a in starts[lengths == S]])
               for S in sorted(set(lengths.tolist())))


def _axis_taps(index, size, side):
  """Bilinear taps (align_corners=True, border clamp) on one axis: ([n, 2], [n, 2])."""
  src = index.astype(np.float32) * np.float32(side - 1) / np.maximum(size - 1, 1).astype(
      np.float32)
  floor = np.floor(src)
  offsets = np.arange(2)
  taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
  weights = np.clip(1 - np.abs(src[:, None] - floor[:, None] - offsets), 0, None)
  return taps, weights.astype(np.float32)


def position_taps(grid_thw, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
  """Indices [N, 4] into the side x side position table and their weights [N, 4]:
  `F.interpolate(bilinear, align_corners=True)` of the table to each image grid."""
  g = _grid(grid_thw)
  row, col, _ = patch_coords(g, merge)
  counts = g.prod(1)
  heights, widths = np.repeat(g[:, 1], counts), np.repeat(g[:, 2], counts)
  h_taps, h_w = _axis_taps(row, heights, side)
  w_taps, w_w = _axis_taps(col, widths, side)
  index_Nx4 = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
  weight_Nx4 = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
  return index_Nx4, weight_Nx4


def rotary_2d(x_NxHxDh, row_N, col_N, theta: float):
  """2-D rotary embedding (rotate-half form): the first Dh/4 frequencies turn with
  the patch row, the next Dh/4 with its column (transformers'
  `Qwen3VLVisionRotaryEmbedding`). Computed in float32."""
  Dh = x_NxHxDh.shape[-1]
  half = Dh // 2
  inv_freq_F = 1.0 / (theta ** (np.arange(0, half, 2, dtype=np.float32) / half))
  angle_NxHalf = jnp.concatenate([row_N[:, None] * inv_freq_F, col_N[:, None] * inv_freq_F],
                                 axis=-1).astype(jnp.float32)
  cos, sin = jnp.cos(angle_NxHalf)[:, None], jnp.sin(angle_NxHalf)[:, None]
  x = x_NxHxDh.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_NxHxDh.dtype)


class LayerNorm(nnx.Module):
  """LayerNorm with scale and bias; statistics in float32."""

  def __init__(self, dim: int, *, eps: float, param_dtype):
    self.eps = eps
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.bias = nnx.Param(jnp.zeros((dim,), param_dtype))

  def __call__(self, x_NxE):
    x = x_NxE.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * self.scale[...] + self.bias[...]).astype(x_NxE.dtype)


class Linear(nnx.Module):
  """y = x W + b, W [in, out]."""

  def __init__(self, d_in: int, d_out: int, *, param_dtype, rngs: nnx.Rngs):
    self.w = nnx.Param(normal(0.02)(rngs.params(), (d_in, d_out), param_dtype))
    self.b = nnx.Param(jnp.zeros((d_out,), param_dtype))

  def __call__(self, x):
    return x @ self.w[...].astype(x.dtype) + self.b[...].astype(x.dtype)


def _act(name: str):
  return lambda x: jax.nn.gelu(x, approximate=name == "gelu_pytorch_tanh")


class VisionBlock(nnx.Module):
  """x += Attn(LN(x)) (2-D rotary, within a frame); x += MLP(LN(x))."""

  def __init__(self, c: VisionConfig, *, rngs: nnx.Rngs):
    E, H = c.hidden_size, c.num_heads
    self.heads, self.theta, self.act = H, c.rope_theta, _act(c.hidden_act)
    self.norm1 = LayerNorm(E, eps=c.norm_eps, param_dtype=c.param_dtype)
    self.norm2 = LayerNorm(E, eps=c.norm_eps, param_dtype=c.param_dtype)
    self.qkv = Linear(E, 3 * E, param_dtype=c.param_dtype, rngs=rngs)
    self.proj = Linear(E, E, param_dtype=c.param_dtype, rngs=rngs)
    self.fc1 = Linear(E, c.intermediate_size, param_dtype=c.param_dtype, rngs=rngs)
    self.fc2 = Linear(c.intermediate_size, E, param_dtype=c.param_dtype, rngs=rngs)

  def __call__(self, x_NxE, row_N, col_N, groups):
    N, E = x_NxE.shape
    # qkv's output axis is (3, H, Dh), HF's order.
    qkv_Nx3xHxDh = self.qkv(self.norm1(x_NxE)).reshape(N, 3, self.heads, -1)
    q, k, v = (qkv_Nx3xHxDh[:, i] for i in range(3))
    q, k = rotary_2d(q, row_N, col_N, self.theta), rotary_2d(k, row_N, col_N, self.theta)
    x_NxE = x_NxE + self.proj(_frame_attention(q, k, v, groups).reshape(N, E))
    return x_NxE + self.fc2(self.act(self.fc1(self.norm2(x_NxE))))


def _frame_attention(q_NxHxDh, k_NxHxDh, v_NxHxDh, groups):
  """Attention within each frame, one batched call per group of equal-size frames."""
  N = q_NxHxDh.shape[0]
  if len(groups) == 1 and groups[0].size == N:   # one size: frames are consecutive rows
    F, S = groups[0].shape
    split = lambda a: a.reshape(F, S, *a.shape[1:])
    o_FxSxHxDh = attend(split(q_NxHxDh), split(k_NxHxDh), split(v_NxHxDh),
                        jnp.ones((1, S, S), bool))
    return o_FxSxHxDh.reshape(q_NxHxDh.shape)
  o_NxHxDh = jnp.zeros_like(q_NxHxDh)
  for index_FxS in groups:
    S = index_FxS.shape[1]
    o_FxSxHxDh = attend(q_NxHxDh[index_FxS], k_NxHxDh[index_FxS], v_NxHxDh[index_FxS],
                        jnp.ones((1, S, S), bool))
    o_NxHxDh = o_NxHxDh.at[index_FxS.reshape(-1)].set(
        o_FxSxHxDh.reshape(-1, *o_FxSxHxDh.shape[2:]))
  return o_NxHxDh


class Merger(nnx.Module):
  """m² patches -> one LM token: LN, concatenate, Linear-GELU-Linear.

  `postshuffle`: the norm runs over the concatenated m²E (DeepStack mergers),
  else over E before concatenating (the main merger)."""

  def __init__(self, c: VisionConfig, *, postshuffle: bool, rngs: nnx.Rngs):
    self.group = c.spatial_merge_size ** 2
    wide = c.hidden_size * self.group
    self.postshuffle = postshuffle
    self.norm = LayerNorm(wide if postshuffle else c.hidden_size, eps=c.norm_eps,
                          param_dtype=c.param_dtype)
    self.fc1 = Linear(wide, wide, param_dtype=c.param_dtype, rngs=rngs)
    self.fc2 = Linear(wide, c.out_hidden_size, param_dtype=c.param_dtype, rngs=rngs)

  def __call__(self, x_NxE):
    N, E = x_NxE.shape
    if self.postshuffle:
      x_MxG = self.norm(x_NxE.reshape(N // self.group, self.group * E))
    else:
      x_MxG = self.norm(x_NxE).reshape(N // self.group, self.group * E)
    return self.fc2(jax.nn.gelu(self.fc1(x_MxG), approximate=False))


class VisionTower(nnx.Module):
  """pixel_values [N, P] and image_grid_thw [n, 3] -> (merged [M, D], deepstack list)."""

  def __init__(self, config: VisionConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    self.patch_embed = Linear(c.patch_dim, c.hidden_size, param_dtype=c.param_dtype,
                              rngs=rngs)
    self.pos_embed = nnx.Param(normal(0.02)(rngs.params(),
                                            (c.num_position_embeddings, c.hidden_size),
                                            c.param_dtype))
    self.blocks = nnx.List([VisionBlock(c, rngs=rngs) for _ in range(c.depth)])
    self.merger = Merger(c, postshuffle=False, rngs=rngs)
    self.deepstack = nnx.List([Merger(c, postshuffle=True, rngs=rngs)
                               for _ in c.deepstack_visual_indexes])

  def __call__(self, pixel_values_NxP, image_grid_thw):
    c = self.config
    m = c.spatial_merge_size
    row_N, col_N, frame_N = patch_coords(image_grid_thw, m)
    N = row_N.shape[0]
    if tuple(pixel_values_NxP.shape) != (N, c.patch_dim):
      raise ValueError(f"pixel_values has shape {tuple(pixel_values_NxP.shape)}; "
                       f"image_grid_thw implies {(N, c.patch_dim)}.")
    index_Nx4, weight_Nx4 = position_taps(image_grid_thw, round(c.num_position_embeddings
                                                                ** 0.5), m)
    x_NxE = self.patch_embed(pixel_values_NxP.astype(c.dtype))
    pos_NxE = (self.pos_embed[...][index_Nx4].astype(jnp.float32)
               * weight_Nx4[:, :, None]).sum(1)
    x_NxE = x_NxE + pos_NxE.astype(x_NxE.dtype)
    groups = frame_groups(frame_N)
    row_N, col_N = jnp.asarray(row_N, jnp.float32), jnp.asarray(col_N, jnp.float32)
    deepstack = []
    for layer, block in enumerate(self.blocks):
      x_NxE = block(x_NxE, row_N, col_N, groups)
      if layer in c.deepstack_visual_indexes:
        merger = self.deepstack[c.deepstack_visual_indexes.index(layer)]
        deepstack.append(merger(x_NxE))
    return self.merger(x_NxE), deepstack
