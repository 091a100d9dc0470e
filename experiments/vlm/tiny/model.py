"""The tiny VLM: ViT patch encoder + projector + the decoder LM, whose FFN slot holds a branch.

Sequence layout: [Nv image tokens | T text tokens]. The image tokens are the
projected visual embeddings v_BxNvxD; the text mask is 0 on them, so a branch
adds exactly 0 there. Every mode runs the one decoder block of
experiments/models/lm.py; per block (x the post-attention residual):

    x = x + Attn(norm(x))
    x = x + FFN(norm(x)) + branch(x)        branch at config.branch_layers

PVM's visual memory is v (pvm_source "raw") or the block's x at the image
positions ("hidden"); either way its keys/values are computed once per image
at prefill and kept in the decode cache as that branch's state, which every
decode step reuses. Parameter paths: `encoder/...`, `projector/...`,
`lm/...` (the DecoderLM), the branches at `lm/blocks/<i>/ffn_branch/...`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.attention import attend
from experiments.models.branches import BranchContext, ParallelMLP
from experiments.models.cache import DecodeCache
from experiments.models.generate import Prompt, last_logits, right_padded_prompt
from experiments.models.layers import RMSNorm, SwiGLU, normal
from experiments.models.lm import DecoderLM
from experiments.vlm.tiny.config import VLMConfig

__all__ = ["VLM", "Encoder", "ParallelMLP", "Projector", "ViTBlock"]


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


class VLM(nnx.Module):
  """See the module docstring."""

  def __init__(self, config: VLMConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    self.encoder = Encoder(c, rngs=rngs)
    self.projector = Projector(c.vit_dim, c.lm.d_model,
                               n_visual=c.n_visual if c.visual_pos else None, rngs=rngs)
    self.lm = DecoderLM(c.decoder, rngs=rngs)

  def visual(self, images_BxHxWx3):
    """The projected visual embeddings that enter the LM: [B, Nv, d]."""
    return self.projector(self.encoder(images_BxHxWx3)).astype(self.config.lm.dtype)

  def branch(self, layer: int):
    """The beside-FFN branch of a layer (PVMBranch / ParallelMLP) or None."""
    return self.lm.blocks[layer].ffn_branch

  def _inputs(self, v_BxNvxD, tokens_BxT, probe=False):
    """[image | text] embeddings and the context the branches read."""
    B, Nv, _ = v_BxNvxD.shape
    S = Nv + tokens_BxT.shape[1]
    x_BxSxD = jnp.concatenate([v_BxNvxD, self.lm.embed(tokens_BxT)], axis=1)
    ctx = BranchContext(text_mask_BxT=jnp.broadcast_to(jnp.arange(S) >= Nv, (B, S)),
                        visual_BxNvxD=v_BxNvxD, probe=probe)
    return x_BxSxD, ctx

  def __call__(self, images_BxHxWx3, tokens_BxT, *, valid=None, return_aux=False,
               probe=False, return_hidden: bool = False):
    """Logits [B, Nv + T, V] (float32) over the whole sequence.

    valid: [B, T] text tokens that are real (image tokens always are). With
    `return_aux` also the DecoderLM's aux dict; `probe` (analyses) adds
    `attn/<l>/probs` [B, Hq, S, S], `ffn_branch/<l>/probs` (PVM, [B, S, Hq, Nv])
    and `block/<l>/hidden` [B, S, D] for S = Nv + T (and implies return_aux).
    `return_hidden`: the blocks' output [B, S, D] instead of the logits (DecoderLM's).
    """
    return self.forward_visual(self.visual(images_BxHxWx3), tokens_BxT, valid=valid,
                               return_aux=return_aux, probe=probe,
                               return_hidden=return_hidden)

  def forward_visual(self, v_BxNvxD, tokens_BxT, *, valid=None, return_aux=False,
                     probe=False, return_hidden: bool = False):
    B, Nv, _ = v_BxNvxD.shape
    x_BxSxD, ctx = self._inputs(v_BxNvxD, tokens_BxT, probe)
    if x_BxSxD.shape[1] > self.lm.config.max_len:
      raise ValueError(f"Nv + T = {x_BxSxD.shape[1]} exceeds lm.max_len="
                       f"{self.lm.config.max_len}.")
    valid_BxS = None if valid is None else jnp.concatenate(
        [jnp.ones((B, Nv), bool), valid.astype(bool)], axis=1)
    return self.lm.forward_embedded(x_BxSxD, valid=valid_BxS, context=ctx,
                                    return_aux=return_aux or probe,
                                    return_hidden=return_hidden)

  # --- decoding -----------------------------------------------------------------

  def prefill(self, images_BxHxWx3, tokens_BxT, *, lengths, cache_len: int):
    """Forward over [image | right-padded prompt]; returns (logits [B, Nv+T, V], cache).

    lengths: int [B] real prompt tokens per row. The cache's PVM branch states
    hold each PVM layer's visual keys/values, computed here once per image.
    """
    v_BxNvxD = self.visual(images_BxHxWx3)
    x_BxSxD, ctx = self._inputs(v_BxNvxD, tokens_BxT)
    return self.lm.prefill_embedded(
        x_BxSxD, lengths=jnp.asarray(lengths, jnp.int32) + v_BxNvxD.shape[1],
        cache_len=cache_len, context=ctx)

  def decode_step(self, tokens_Bx1, cache: DecodeCache):
    """One text token per row; returns (logits_BxV, next cache)."""
    return self.lm.decode_step(tokens_Bx1, cache)

  # --- the sampler's protocol (experiments/models/generate.py) -------------------

  @property
  def decoder(self) -> DecoderLM:
    """The decoder whose max_len and vocabulary bound sampling."""
    return self.lm

  def sampling_prompt(self, prompt_tokens_BxT, *, prompt_lengths=None, images=None) -> Prompt:
    """[image | right-padded prompt] as `prefill_prompt` reads it; a row's prompt may be
    empty (lengths in [0, T]: its image comes first)."""
    if images is None:
      raise ValueError("generate: pass images= for a VLM and only for a VLM "
                       f"(got a {type(self).__name__} and images=False).")
    tokens_BxT, lengths_B = right_padded_prompt(prompt_tokens_BxT, prompt_lengths, minimum=0)
    return Prompt(tokens_BxT=tokens_BxT, lengths_B=lengths_B, inputs=jnp.asarray(images),
                  prefix=self.config.n_visual)

  def prefill_prompt(self, prompt: Prompt, *, cache_len: int):
    """(logits_BxV at each row's last [image | prompt] token, cache)."""
    logits_BxSxV, cache = self.prefill(prompt.inputs, prompt.tokens_BxT,
                                       lengths=prompt.lengths_B, cache_len=cache_len)
    return last_logits(logits_BxSxV, prompt.prefix + prompt.lengths_B), cache

  def prompt_logits(self, prompt: Prompt, tokens_BxS, valid_BxS):
    """The full forward's logits [B, Nv + S, V] (the uncached sampler)."""
    return self(prompt.inputs, tokens_BxS, valid=valid_BxS)
