"""The decoder block, defined once: pre-norm attention and FFN with two branch slots.

Per block (x the residual stream):

    x = x + memory(x)                          memory slot, at config.memory_layers
    x = x + Attention(RMSNorm(x))              GQA, RoPE, causal, segment-aware
    x = x + FFN(RMSNorm(x)) + ffn_branch(x)    beside-FFN slot, at config.ffn_branch_layers

The FFN is a SwiGLU, or the mixture of experts (experiments/models/moe/) at
config.moe_layers. The memory slot holds Lngram v2 (paper §2.4: its delta enters
before the layer's attention) or a comparison arm; the beside-FFN slot holds PVM
or the iso-parameter MLP, reading the post-attention x. Branches implement the
protocol of experiments/models/branches.py, so one `Block.__call__` serves every
mode:

    parallel     the training / scoring forward over whole rows;
    prefill      the parallel forward over right-padded prompts that also returns
                 the layer's `LayerCache` (K, V and the branch decode states);
    decode       one token per row against the cache;
    decode_rows  decode that returns the token's K/V rows instead of writing the
                 cache (a scanned span's layer, experiments/models/layer_scan.py).

`DecoderLM` (experiments/models/lm.py) builds the blocks, attaches the branches
and runs them.
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models import layout
from experiments.models.attention import Attention
from experiments.models.branches import BranchContext
from experiments.models.cache import LayerCache
from experiments.models.config import LMConfig
from experiments.models.layers import RMSNorm, SwiGLU
from experiments.models.moe import MoEFFN
from experiments.models.remat import recompute_after_cotangent

Mode = Literal["parallel", "prefill", "decode", "decode_rows"]


def _run_branch(branch, mode: Mode, x_BxTxD, ctx, state):
  """(y, aux or state) of one slot branch in the given mode."""
  if mode == "parallel":
    return branch.forward(x_BxTxD, ctx)
  if mode == "prefill":
    return branch.prefill(x_BxTxD, ctx)
  return branch.decode_step(x_BxTxD, state, ctx)


def lm_norm(c: LMConfig) -> RMSNorm:
  """The RMSNorm of a decoder of config c (its blocks' and its final norm)."""
  return RMSNorm(c.d_model, eps=c.norm_eps, param_dtype=c.param_dtype,
                 scale_in_dtype=c.norm_scale_in_dtype)


class Block(nnx.Module):
  """One pre-norm decoder block with a memory slot and a beside-FFN slot.

  `memory` and `ffn_branch` are attached by `DecoderLM` after every backbone
  parameter is drawn (see there); a block built alone has neither.
  """

  def __init__(self, config: LMConfig, layer: int, *, rngs: nnx.Rngs):
    # The slots are filled by DecoderLM, which knows their layers; `layer` picks
    # the FFN (dense SwiGLU, or the mixture of experts at config.moe_layers).
    c = config
    out_std = c.init_std / math.sqrt(2 * c.n_layers)
    self.memory = None
    self.attn_norm = lm_norm(c)
    self.attn = Attention(
        d_model=c.d_model, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads,
        head_dim=c.head_dim, rope_theta=c.rope_theta, dtype=c.dtype,
        param_dtype=c.param_dtype, init_std=c.init_std, out_std=out_std, rngs=rngs,
        qkv_bias=c.qkv_bias, qk_norm=c.qk_norm, rope_scaling=c.rope_scaling,
        norm_eps=c.norm_eps, norm_scale_in_dtype=c.norm_scale_in_dtype,
        mrope_section=c.mrope_section, mrope_interleaved=c.mrope_interleaved,
        implementation=c.attention)
    self.mlp_norm = lm_norm(c)
    if layer in c.moe_layers:   # drawn where the dense FFN would be (experiments/models/moe/layer.py)
      self.mlp = MoEFFN(c.moe, dtype=c.dtype, param_dtype=c.param_dtype, init_std=c.init_std,
                        out_std=out_std, rngs=rngs)
    else:
      self.mlp = SwiGLU(c.d_model, c.ffn_dim, dtype=c.dtype, param_dtype=c.param_dtype,
                        init_std=c.init_std, out_std=out_std, rngs=rngs)
    self.ffn_branch = None
    self.cache_dtype = c.dtype

  def __call__(self, x_BxTxD, ctx: BranchContext, *, mode: Mode, positions_BxT,
               cache: LayerCache | None = None, cache_len: int | None = None,
               index_B=None, key_ok_BxS=None):
    """One block in one mode.

    parallel  -> (x, aux): aux {"memory/<name>", "ffn_branch/<name>"} and, with
                 ctx.probe, "attn/probs" [B, Hq, T, T].
    prefill   -> (x, LayerCache with `cache_len` slots); ctx.valid_BxT and
                 ctx.lengths_B describe the prompt.
    decode    -> (x_Bx1xD, next LayerCache); `cache` is this layer's, `index_B`
                 the slot to write, `key_ok_BxS` the slots to read (new one marked).
    decode_rows -> (x_Bx1xD, (k, v) rows [B, Hkv, Dh]): decode without writing
                 `cache` (a scanned stack's slice); `key_ok_BxS` marks the slots to
                 read besides the new token. Blocks without branches only.
    """
    if mode == "decode_rows":
      if self.memory is not None or self.ffn_branch is not None:
        raise ValueError("Block: mode 'decode_rows' is for blocks without branches.")
      h_Bx1xD = self.attn_norm(x_BxTxD)
      attn_Bx1xD, k_BxHkvxDh, v_BxHkvxDh = self.attn.decode_rows(
          h_Bx1xD, positions_BxT, cache.k_BxSxHkvxDh, cache.v_BxSxHkvxDh, key_ok_BxS=key_ok_BxS)
      x_BxTxD = x_BxTxD + attn_Bx1xD
      return x_BxTxD + self._mlp(x_BxTxD, ctx, {}, mode), (k_BxHkvxDh, v_BxHkvxDh)
    states = {"memory": None, "ffn_branch": None}
    aux = {}

    def branch(slot, x_BxTxD):
      slot_ctx = ctx
      if slot == "memory":
        slot_ctx = ctx.replace(attn_norm_scale_D=self.attn_norm.scale[...])
      with jax.named_scope(slot):   # names its operations (plan --explain_memory)
        y_BxTxD, out = _run_branch(getattr(self, slot), mode, x_BxTxD, slot_ctx,
                                   None if cache is None else getattr(cache, f"{slot}_state"))
      if mode == "parallel":
        aux.update({f"{slot}/{name}": v for name, v in out.items()})
      else:
        states[slot] = out
      return y_BxTxD.astype(x_BxTxD.dtype)

    if self.memory is not None:
      x_BxTxD = x_BxTxD + branch("memory", x_BxTxD)
    h_BxTxD = self.attn_norm(x_BxTxD)
    if mode == "decode":
      attn_BxTxD, k_cache, v_cache = self.attn.decode(
          h_BxTxD, positions_BxT, cache.k_BxSxHkvxDh, cache.v_BxSxHkvxDh, index_B=index_B,
          key_ok_BxS=key_ok_BxS)
    else:
      with jax.named_scope("attention"):
        attn_BxTxD, extras = self.attn(
            h_BxTxD, positions_BxT, segment_ids=ctx.segment_ids_BxT, valid=ctx.valid_BxT,
            return_kv=True, return_probs=bool(ctx.probe), mesh=layout.sharded(ctx.mesh))
      if ctx.probe:
        aux["attn/probs"] = extras["probs"]
    x_BxTxD = x_BxTxD + attn_BxTxD
    y_ffn_BxTxD = None if self.ffn_branch is None else branch("ffn_branch", x_BxTxD)
    x_BxTxD = x_BxTxD + self._mlp(x_BxTxD, ctx, aux, mode)
    if y_ffn_BxTxD is not None:
      x_BxTxD = x_BxTxD + y_ffn_BxTxD
    if mode == "parallel":
      return x_BxTxD, aux
    if mode == "prefill":
      T = x_BxTxD.shape[1]
      pad = ((0, 0), (0, cache_len - T), (0, 0), (0, 0))
      k_cache = jnp.pad(extras["k"].astype(self.cache_dtype), pad)
      v_cache = jnp.pad(extras["v"].astype(self.cache_dtype), pad)
    return x_BxTxD, LayerCache(k_BxSxHkvxDh=k_cache, v_BxSxHkvxDh=v_cache,
                               memory_state=states["memory"],
                               ffn_branch_state=states["ffn_branch"])

  def _mlp(self, x_BxTxD, ctx: BranchContext, aux: dict, mode: Mode):
    """The FFN's output (dense or MoE; the MoE's aux into `aux` in parallel mode)."""
    with jax.named_scope("mlp"):   # names its operations (plan --explain_memory)
      return self._ffn(x_BxTxD, ctx, aux, mode)

  def _ffn(self, x_BxTxD, ctx: BranchContext, aux: dict, mode: Mode):
    if isinstance(self.mlp, MoEFFN):
      y_mlp_BxTxD, moe_aux = self.mlp(self.mlp_norm(x_BxTxD), valid_BxT=ctx.valid_BxT,
                                      mesh=ctx.mesh)
      if mode == "parallel":
        aux.update({f"moe/{name}": v for name, v in moe_aux.items()})
      return y_mlp_BxTxD
    return self.mlp(self.mlp_norm(x_BxTxD), mesh=layout.sharded(ctx.mesh))

  def init_cache(self, batch: int, max_len: int, ctx: BranchContext) -> LayerCache:
    kv_shape = (batch, max_len, self.attn.n_kv_heads, self.attn.head_dim)
    return LayerCache(
        k_BxSxHkvxDh=jnp.zeros(kv_shape, self.cache_dtype),
        v_BxSxHkvxDh=jnp.zeros(kv_shape, self.cache_dtype),
        memory_state=None if self.memory is None else self.memory.init_decode_state(batch, ctx),
        ffn_branch_state=None if self.ffn_branch is None
        else self.ffn_branch.init_decode_state(batch, ctx))


def parallel_block(block, x_BxTxD, ctx, positions_BxT):
  """(x, aux) of one block's parallel forward."""
  return block(x_BxTxD, ctx, mode="parallel", positions_BxT=positions_BxT)


def parallel_block_remat(block, x_BxTxD, ctx, positions_BxT):
  """`parallel_block` keeping only its inputs for the backward, which recomputes the
  block once the cotangent of its output has arrived (experiments/models/remat.py)."""
  graphdef, state = nnx.split(block)

  def run(state, x_BxTxD, ctx, positions_BxT):
    return parallel_block(nnx.merge(graphdef, state), x_BxTxD, ctx, positions_BxT)

  return recompute_after_cotangent(run)(state, x_BxTxD, ctx, positions_BxT)
