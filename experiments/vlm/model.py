"""The tiny VLM: ViT patch encoder + projector + decoder LM + parallel branches.

Sequence layout: [Nv image tokens | T text tokens]. The image tokens are the
projected visual embeddings v_BxNvxD; the text mask is 0 on them, so a branch
adds exactly 0 there. Per decoder block (x the post-attention residual):

    x = x + Attn(norm(x))
    x = x + FFN(norm(x)) + branch(x)        branch only at config.branch_layers

PVM's visual memory is v (pvm_source "raw") or the block's x at the image
positions ("hidden"); either way its keys/values are computed once per image
(`VisualCache`) and reused by every decode step. The blocks, embedding and
output head are those of `experiments.models.DecoderLM` (`self.lm`), so its
parameter paths stay `lm/...`; the encoder is `encoder/...`, the projector
`projector/...`, the branches `branches/<layer>/...`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.attention import attend, causal_mask
from experiments.models.cache import DecodeCache, LayerCache
from experiments.models.layers import RMSNorm, SwiGLU, normal
from experiments.models.lm import DecoderLM
from experiments.vlm.config import VLMConfig
from lngram_jax.norms import rms_norm
from pvm_jax.module import PVM


class ViTBlock(nnx.Module):
  """Pre-norm bidirectional self-attention + SwiGLU over the patches."""

  def __init__(self, dim: int, heads: int, ffn: int, *, rngs: nnx.Rngs):
    self.heads = heads
    self.norm1 = RMSNorm(dim, eps=1e-6, param_dtype=jnp.float32)
    self.w_qkv = nnx.Param(normal(0.02)(rngs.params(), (dim, 3, heads, dim // heads)))
    self.w_o = nnx.Param(normal(0.02)(rngs.params(), (heads, dim // heads, dim)))
    self.norm2 = RMSNorm(dim, eps=1e-6, param_dtype=jnp.float32)
    self.mlp = SwiGLU(dim, ffn, dtype=jnp.float32, param_dtype=jnp.float32, init_std=0.02,
                      out_std=0.02, rngs=rngs)

  def __call__(self, x_BxNxE):
    B, N, _ = x_BxNxE.shape
    qkv_BxNx3xHxDh = jnp.einsum("bne,ecjh->bncjh", self.norm1(x_BxNxE), self.w_qkv[...])
    q, k, v = (qkv_BxNx3xHxDh[:, :, i] for i in range(3))
    o_BxNxHxDh = attend(q, k, v, jnp.ones((B, N, N), bool))
    x_BxNxE = x_BxNxE + jnp.einsum("bnjh,jhe->bne", o_BxNxHxDh, self.w_o[...])
    return x_BxNxE + self.mlp(self.norm2(x_BxNxE))


class Encoder(nnx.Module):
  """uint8 images [B, H, W, 3] -> patch features [B, Nv, vit_dim]."""

  def __init__(self, c: VLMConfig, *, rngs: nnx.Rngs):
    self.patch = c.patch_size
    self.w_patch = nnx.Param(normal(0.02)(rngs.params(), (c.patch_size ** 2 * 3, c.vit_dim)))
    self.pos = nnx.Param(normal(0.02)(rngs.params(), (c.n_visual, c.vit_dim)))
    self.blocks = nnx.List([ViTBlock(c.vit_dim, c.vit_heads, c.vit_ffn, rngs=rngs)
                            for _ in range(c.vit_layers)])
    self.norm = RMSNorm(c.vit_dim, eps=1e-6, param_dtype=jnp.float32)

  def __call__(self, images_BxHxWx3):
    B, H, W, C = images_BxHxWx3.shape
    P = self.patch
    x = images_BxHxWx3.astype(jnp.float32) / 255.0 - 0.5
    # Patches in reading order (row-major), channels last inside a patch.
    x = x.reshape(B, H // P, P, W // P, P, C).transpose(0, 1, 3, 2, 4, 5)
    patches_BxNxQ = x.reshape(B, (H // P) * (W // P), P * P * C)
    x_BxNxE = patches_BxNxQ @ self.w_patch[...] + self.pos[...]
    for block in self.blocks:
      x_BxNxE = block(x_BxNxE)
    return self.norm(x_BxNxE)


class Projector(nnx.Module):
  """Two-layer GELU MLP from the encoder width to the LM width d.

  With `n_visual`, a learned per-slot embedding [Nv, d] is added to its
  output: the LM-side position of each visual token. The LM's RoPE only sees
  where a token sits in the sequence, and a text position that names a grid
  cell must find that cell's token by content; without this slot identity the
  ViT's own position embedding, small beside the patch content after two
  blocks, was the only cue, and the LM never learned the lookup.
  """

  def __init__(self, vit_dim: int, d_model: int, *, n_visual: int | None = None,
               rngs: nnx.Rngs):
    self.w1 = nnx.Param(normal(0.02)(rngs.params(), (vit_dim, d_model)))
    self.w2 = nnx.Param(normal(0.02)(rngs.params(), (d_model, d_model)))
    self.pos = None if n_visual is None else nnx.Param(
        normal(0.02)(rngs.params(), (n_visual, d_model)))

  def __call__(self, x_BxNxE):
    y_BxNxD = jax.nn.gelu(x_BxNxE @ self.w1[...]) @ self.w2[...]
    return y_BxNxD if self.pos is None else y_BxNxD + self.pos[...]


class ParallelMLP(nnx.Module):
  """Iso-parameter baseline: y = λ · RMSNorm_affine-free(SwiGLU(x)) · text_mask.

  Same gate, output norm and text mask as PVM, but no cross-attention: it sees
  the text position's own hidden state only.
  """

  def __init__(self, d_model: int, hidden: int, *, rngs: nnx.Rngs):
    self.mlp = SwiGLU(d_model, hidden, dtype=jnp.float32, param_dtype=jnp.float32,
                      init_std=0.02, out_std=0.02, rngs=rngs)
    self.gate = nnx.Param(jnp.zeros((), jnp.float32))

  def __call__(self, x_BxTxD, text_mask_BxT):
    y_BxTxD = self.gate[...] * rms_norm(self.mlp(x_BxTxD), eps=1e-6)
    return jnp.where(text_mask_BxT[:, :, None], y_BxTxD, 0)


class VLM(nnx.Module):
  """See the module docstring."""

  def __init__(self, config: VLMConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    self.encoder = Encoder(c, rngs=rngs)
    self.projector = Projector(c.vit_dim, c.lm.d_model,
                               n_visual=c.n_visual if c.visual_pos else None, rngs=rngs)
    self.lm = DecoderLM(c.lm, rngs=rngs)
    branches = {}
    for i in c.branch_layers:
      if c.branch == "pvm":
        branches[str(i)] = PVM(c.pvm, rngs=rngs)
      else:
        branches[str(i)] = ParallelMLP(c.lm.d_model, c.iso_mlp_dim, rngs=rngs)
    self.branches = nnx.Dict(branches)

  # --- pieces -------------------------------------------------------------------

  def visual(self, images_BxHxWx3):
    """The projected visual embeddings that enter the LM: [B, Nv, d]."""
    return self.projector(self.encoder(images_BxHxWx3)).astype(self.config.lm.dtype)

  def branch(self, layer: int):
    return self.branches[str(layer)] if str(layer) in self.branches else None

  def _branch_out(self, layer, x_BxTxD, text_mask_BxT, vcache, *, return_probs=False):
    br = self.branch(layer)
    if isinstance(br, ParallelMLP):
      return br(x_BxTxD, text_mask_BxT), None
    out = br(x_BxTxD, cache=vcache, text_mask=text_mask_BxT, return_probs=return_probs)
    return out if return_probs else (out, None)

  def _visual_cache(self, layer, v_BxNvxD, x_BxTxD):
    br = self.branch(layer)
    if not isinstance(br, PVM):
      return None
    source = v_BxNvxD if self.config.pvm_source == "raw" else x_BxTxD[:, :v_BxNvxD.shape[1]]
    return br.visual_cache(source)

  # --- parallel forward ---------------------------------------------------------

  def __call__(self, images_BxHxWx3, tokens_BxT, *, valid=None, return_aux=False):
    """Logits [B, Nv + T, V] (float32) over the whole sequence.

    valid: [B, T] text tokens that are real (image tokens always are). With
    `return_aux`: aux["attn_probs"] per layer [B, H, Nv+T, Nv+T] (backbone),
    aux["pvm_probs"] {layer: [B, Nv+T, Hq, Nv]} and aux["hidden"] per layer.
    """
    v_BxNvxD = self.visual(images_BxHxWx3)
    return self.forward_visual(v_BxNvxD, tokens_BxT, valid=valid, return_aux=return_aux)

  def forward_visual(self, v_BxNvxD, tokens_BxT, *, valid=None, return_aux=False):
    lm = self.lm
    B, Nv, _ = v_BxNvxD.shape
    T = tokens_BxT.shape[1]
    x_BxSxD = jnp.concatenate([v_BxNvxD, lm.embed(tokens_BxT)], axis=1)
    S = Nv + T
    if S > lm.config.max_len:
      raise ValueError(f"Nv + T = {S} exceeds lm.max_len={lm.config.max_len}.")
    text_mask_BxS = jnp.broadcast_to(jnp.arange(S) >= Nv, (B, S))
    valid_BxS = None if valid is None else jnp.concatenate(
        [jnp.ones((B, Nv), bool), valid.astype(bool)], axis=1)
    positions_BxS = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    aux = {"attn_probs": [], "pvm_probs": {}, "hidden": []}
    for i, block in enumerate(lm.blocks):
      h_BxSxD = block.attn_norm(x_BxSxD)
      if return_aux:
        attn_BxSxD, probs = _attention_with_probs(block.attn, h_BxSxD, positions_BxS, valid_BxS)
        aux["attn_probs"].append(probs)
      else:
        attn_BxSxD = block.attn(h_BxSxD, positions_BxS, valid=valid_BxS)
      x_BxSxD = x_BxSxD + attn_BxSxD
      y_BxSxD = None
      if self.branch(i) is not None:
        vcache = self._visual_cache(i, v_BxNvxD, x_BxSxD)
        y_BxSxD, p = self._branch_out(i, x_BxSxD, text_mask_BxS, vcache,
                                      return_probs=return_aux and vcache is not None)
        if p is not None:
          aux["pvm_probs"][i] = p
      x_BxSxD = x_BxSxD + block.mlp(block.mlp_norm(x_BxSxD))
      if y_BxSxD is not None:
        x_BxSxD = x_BxSxD + y_BxSxD.astype(x_BxSxD.dtype)
      if return_aux:
        aux["hidden"].append(x_BxSxD)
    logits_BxSxV = lm.logits(x_BxSxD)
    return (logits_BxSxV, aux) if return_aux else logits_BxSxV

  # --- decoding -----------------------------------------------------------------

  def prefill(self, images_BxHxWx3, tokens_BxT, *, lengths, cache_len: int):
    """Forward over [image | right-padded prompt]; returns (logits, cache, visual caches).

    lengths: int [B] real prompt tokens per row. The visual caches hold each
    PVM layer's keys/values (None elsewhere), computed here once per image.
    """
    lm = self.lm
    c = lm.config
    v_BxNvxD = self.visual(images_BxHxWx3)
    B, Nv, _ = v_BxNvxD.shape
    T = tokens_BxT.shape[1]
    S = Nv + T
    if S > cache_len:
      raise ValueError(f"prefill: Nv + T = {S} exceeds cache_len={cache_len}.")
    lengths_B = jnp.asarray(lengths, jnp.int32) + Nv
    valid_BxS = jnp.arange(S)[None, :] < lengths_B[:, None]
    text_mask_BxS = jnp.broadcast_to(jnp.arange(S) >= Nv, (B, S))
    positions_BxS = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    x_BxSxD = jnp.concatenate([v_BxNvxD, lm.embed(tokens_BxT)], axis=1)
    layers, vcaches = [], []
    pad = ((0, 0), (0, cache_len - S), (0, 0), (0, 0))
    for i, block in enumerate(lm.blocks):
      attn_BxSxD, (k, v) = block.attn(block.attn_norm(x_BxSxD), positions_BxS,
                                      valid=valid_BxS, return_kv=True)
      x_BxSxD = x_BxSxD + attn_BxSxD
      vcache = self._visual_cache(i, v_BxNvxD, x_BxSxD)
      y = None
      if self.branch(i) is not None:
        y, _ = self._branch_out(i, x_BxSxD, text_mask_BxS, vcache)
      x_BxSxD = x_BxSxD + block.mlp(block.mlp_norm(x_BxSxD))
      if y is not None:
        x_BxSxD = x_BxSxD + y.astype(x_BxSxD.dtype)
      layers.append(LayerCache(k_BxSxKxDh=jnp.pad(k.astype(c.dtype), pad),
                               v_BxSxKxDh=jnp.pad(v.astype(c.dtype), pad), lngram=None))
      vcaches.append(vcache)
    cache = DecodeCache(layers=tuple(layers), index_B=lengths_B, position_B=lengths_B,
                        key_ok_BxS=jnp.pad(valid_BxS, ((0, 0), (0, cache_len - S))))
    return lm.logits(x_BxSxD), cache, tuple(vcaches)

  def decode_step(self, tokens_Bx1, cache: DecodeCache, vcaches):
    """One text token per row; returns (logits_BxV, next cache). vcaches are reused as is."""
    lm = self.lm
    B = tokens_Bx1.shape[0]
    rows_B = jnp.arange(B)
    key_ok_BxS = cache.key_ok_BxS.at[rows_B, cache.index_B].set(True)
    positions_Bx1 = cache.position_B[:, None]
    text_mask_Bx1 = jnp.ones((B, 1), bool)
    x_Bx1xD = lm.embed(tokens_Bx1)
    layers = []
    for i, (block, lc) in enumerate(zip(lm.blocks, cache.layers, strict=True)):
      attn_Bx1xD, k_cache, v_cache = block.attn.decode(
          block.attn_norm(x_Bx1xD), positions_Bx1, lc.k_BxSxKxDh, lc.v_BxSxKxDh,
          index_B=cache.index_B, key_ok_BxS=key_ok_BxS)
      x_Bx1xD = x_Bx1xD + attn_Bx1xD
      y = None
      if self.branch(i) is not None:
        y, _ = self._branch_out(i, x_Bx1xD, text_mask_Bx1, vcaches[i])
      x_Bx1xD = x_Bx1xD + block.mlp(block.mlp_norm(x_Bx1xD))
      if y is not None:
        x_Bx1xD = x_Bx1xD + y.astype(x_Bx1xD.dtype)
      layers.append(LayerCache(k_BxSxKxDh=k_cache, v_BxSxKxDh=v_cache, lngram=None))
    logits_BxV = lm.logits(x_Bx1xD)[:, 0]
    return logits_BxV, DecodeCache(layers=tuple(layers), index_B=cache.index_B + 1,
                                   position_B=cache.position_B + 1, key_ok_BxS=key_ok_BxS)


def _attention_with_probs(attn, h_BxSxD, positions_BxS, valid_BxS):
  """The block's attention, also returning its probabilities [B, H, S, S] (analyses)."""
  q_BxSxHxDh, k_BxSxKxDh, v_BxSxKxDh = attn.qkv(h_BxSxD, positions_BxS)
  B, S, H, Dh = q_BxSxHxDh.shape
  K = k_BxSxKxDh.shape[2]
  k_BxSxHxDh = jnp.repeat(k_BxSxKxDh, H // K, axis=2)
  s_BxHxSxS = jnp.einsum("bthe,bshe->bhts", q_BxSxHxDh, k_BxSxHxDh,
                         preferred_element_type=jnp.float32) / math.sqrt(Dh)
  mask_BxSxS = causal_mask((B, S), valid=valid_BxS)
  s_BxHxSxS = jnp.where(mask_BxSxS[:, None], s_BxHxSxS, jnp.finfo(jnp.float32).min)
  p_BxHxSxS = jax.nn.softmax(s_BxHxSxS, axis=-1)
  o_BxSxHxDh = attend(q_BxSxHxDh, k_BxSxKxDh, v_BxSxKxDh, mask_BxSxS)
  return attn.project_out(o_BxSxHxDh), p_BxHxSxS
