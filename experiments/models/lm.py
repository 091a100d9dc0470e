"""A decoder-only LM with Lngram v2 memory branches at chosen layers.

Per block (pre-norm; paper §2.4 for the memory branch):

    x = x + Lngram(x)                  only at `config.lngram_layers`
    x = x + Attention(RMSNorm(x))      GQA, RoPE, causal, segment-aware
    x = x + SwiGLU(RMSNorm(x))

Packed rows carry `segment_ids`: attention, the Lngram windows and its conv
never cross a segment boundary, and positions restart at every segment.
`valid` marks real tokens (padding reads nothing and the Lngram delta is 0
there). Logits are float32. Decoding (KV cache + Lngram decode state) is in
experiments/models/cache.py; these methods are its entry points.

Parameter paths (stable; optimiser groups use them): `embed/table`,
`blocks/<i>/{attn_norm,attn,mlp_norm,mlp}/...`, `blocks/<i>/lngram/...` with
the Lngram tables at `blocks/<i>/lngram/tables/<j>` and its router at
`blocks/<i>/lngram/router_w`, `final_norm/scale`, `unembed` when untied.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models import cache as cache_lib
from experiments.models.attention import Attention
from experiments.models.config import LMConfig
from experiments.models.layers import Embedding, RMSNorm, SwiGLU, normal, segment_positions
from lngram_jax.layer import LngramV2


class Block(nnx.Module):
  """One pre-norm decoder block, optionally with an Lngram branch in front."""

  def __init__(self, config: LMConfig, layer: int, *, rngs: nnx.Rngs):
    c = config
    out_std = c.init_std / math.sqrt(2 * c.n_layers)
    self.lngram = LngramV2(c.lngram, rngs=rngs) if layer in c.lngram_layers else None
    self.attn_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype)
    self.attn = Attention(
        d_model=c.d_model, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads,
        head_dim=c.head_dim, rope_theta=c.rope_theta, dtype=c.dtype,
        param_dtype=c.param_dtype, init_std=c.init_std, out_std=out_std, rngs=rngs)
    self.mlp_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype)
    self.mlp = SwiGLU(c.d_model, c.ffn_dim, dtype=c.dtype, param_dtype=c.param_dtype,
                      init_std=c.init_std, out_std=out_std, rngs=rngs)

  def __call__(self, x_BxTxD, positions_BxT, segment_ids, valid):
    """Returns (x_BxTxD, aux) with aux the Lngram diagnostics or {}."""
    aux = {}
    if self.lngram is not None:
      y_BxTxD, lngram_aux = self.lngram(x_BxTxD, segment_ids=segment_ids, valid=valid,
                                        return_aux=True)
      x_BxTxD = x_BxTxD + y_BxTxD.astype(x_BxTxD.dtype)
      aux = {"codes": lngram_aux["codes"], "route_mass": lngram_aux["route_mass"]}
    x_BxTxD = x_BxTxD + self.attn(self.attn_norm(x_BxTxD), positions_BxT,
                                  segment_ids=segment_ids, valid=valid)
    x_BxTxD = x_BxTxD + self.mlp(self.mlp_norm(x_BxTxD))
    return x_BxTxD, aux


def _run_block(block, x_BxTxD, positions_BxT, segment_ids, valid):
  return block(x_BxTxD, positions_BxT, segment_ids, valid)


_run_block_remat = nnx.remat(_run_block)


class DecoderLM(nnx.Module):
  """Decoder-only Transformer LM over byte tokens, with optional Lngram layers."""

  def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = config
    self.embed = Embedding(c.vocab_size, c.d_model, dtype=c.dtype,
                           param_dtype=c.param_dtype, init_std=c.init_std, rngs=rngs)
    self.blocks = nnx.List([Block(c, i, rngs=rngs) for i in range(c.n_layers)])
    self.final_norm = RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype)
    self.unembed = None if c.tie_embeddings else nnx.Param(
        normal(c.init_std)(rngs.params(), (c.d_model, c.vocab_size), c.param_dtype))

  def logits(self, x_BxTxD):
    """Final norm and output projection; float32 logits [B, T, V]."""
    x_BxTxD = self.final_norm(x_BxTxD)
    if self.unembed is None:
      return self.embed.attend(x_BxTxD)
    return jnp.einsum("btd,dv->btv", x_BxTxD, self.unembed[...].astype(self.config.dtype),
                      preferred_element_type=jnp.float32)

  def __call__(self, tokens_BxT, *, segment_ids=None, positions=None, valid=None,
               return_aux=False):
    """logits_BxTxV (float32); with `return_aux` also a dict of Lngram diagnostics.

    aux keys: `lngram/<layer>/codes` int32 [B, T, R] and
    `lngram/<layer>/route_mass` [B, T, Hq] (mass on real routes, not the sink).
    """
    if tokens_BxT.ndim != 2 or not jnp.issubdtype(tokens_BxT.dtype, jnp.integer):
      raise ValueError(
          f"tokens must be an int [B, T] array; got {tokens_BxT.dtype} {tokens_BxT.shape}.")
    return self.forward_embedded(self.embed(tokens_BxT), segment_ids=segment_ids,
                                 positions=positions, valid=valid, return_aux=return_aux)

  def forward_embedded(self, x_BxTxD, *, segment_ids=None, positions=None, valid=None,
                       return_aux=False):
    """The forward from input embeddings [B, T, d] (a continuous input path)."""
    B, T = x_BxTxD.shape[:2]
    if T > self.config.max_len:
      raise ValueError(f"sequence length T={T} exceeds max_len={self.config.max_len}.")
    positions_BxT = default_positions((B, T), segment_ids, positions)
    run = _run_block_remat if self.config.remat else _run_block
    aux = {}
    for i, block in enumerate(self.blocks):
      x_BxTxD, block_aux = run(block, x_BxTxD, positions_BxT, segment_ids, valid)
      for name, value in block_aux.items():
        aux[f"lngram/{i}/{name}"] = value
    logits_BxTxV = self.logits(x_BxTxD)
    return (logits_BxTxV, aux) if return_aux else logits_BxTxV

  # --- decoding (experiments/models/cache.py) ---------------------------------

  def init_cache(self, batch: int, max_len: int) -> cache_lib.DecodeCache:
    """An empty cache of `max_len` slots per row (prompt + new tokens)."""
    return cache_lib.init_cache(self, batch, max_len)

  def prefill(self, tokens_BxT, *, lengths=None, segment_ids=None, cache_len=None):
    """Parallel forward over right-padded prompts; returns (logits_BxTxV, cache).

    lengths: int [B] real tokens per row (default all T). cache_len: slots of
    the returned cache (default config.max_len).
    """
    return cache_lib.prefill(self, tokens_BxT, lengths=lengths, segment_ids=segment_ids,
                             cache_len=cache_len)

  def decode_step(self, tokens_Bx1, cache: cache_lib.DecodeCache):
    """Feeds one token per row; returns (logits_BxV float32, new cache)."""
    return cache_lib.decode_step(self, tokens_Bx1, cache)


def default_positions(batch_time, segment_ids, positions):
  """Explicit positions, else per-segment positions, else 0..T-1."""
  B, T = batch_time
  if positions is not None:
    if tuple(positions.shape) != (B, T):
      raise ValueError(f"positions must have shape {(B, T)}; got {tuple(positions.shape)}.")
    return positions
  if segment_ids is not None:
    return segment_positions(segment_ids)
  return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))


def liven_lngram(model: DecoderLM, *, key: int, w_o_std: float, conv_std: float) -> DecoderLM:
  """Draws nonzero W_O and conv taps for every Lngram branch, in place.

  Both are zero at init (the branch then adds exactly nothing), so tests and
  benchmarks that need the branch to do real work call this; branch i draws
  from jax.random.key(key + i).
  """
  for i, block in enumerate(model.blocks):
    if block.lngram is not None:
      k1, k2 = jax.random.split(jax.random.key(key + i))
      block.lngram.w_o[...] = w_o_std * jax.random.normal(k1, block.lngram.w_o.shape)
      block.lngram.conv_kernel[...] = conv_std * jax.random.normal(
          k2, block.lngram.conv_kernel.shape)
  return model

