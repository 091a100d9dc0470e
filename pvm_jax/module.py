"""The PVM branch as an NNX module: parameters + input checks over `pvm_jax.branch`.

Usage beside a decoder layer's FFN (x = the post-attention residual):

    cache = pvm.visual_cache(v_img_BxNvxD, visual_valid_BxNv)   # once per image
    x = x + ffn(norm(x)) + pvm(x, cache=cache, text_mask=text_mask_BxT)

Init (DESIGN.md §3, our choice): λ = 0 and W_up ~ N(0, init_std²), so the model
at step 0 is exactly the base model while λ receives gradient. Every other
branch parameter sits behind λ, so its gradient is exactly zero at step 0 and
becomes nonzero once λ has moved (one optimizer step). The official code also
zero-inits W_up (`up_init="zero"`): then λ's gradient is zero too, and the
branch is stuck at a stationary point.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from lngram_jax import checks
from pvm_jax import branch
from pvm_jax.config import PVMConfig


class PVM(nnx.Module):
  """One Persistent Visual Memory branch (paper §4, DESIGN.md §3).

  Parameters (names are stable: checkpoints, optax masks and analyses use
  them): see `branch.PARAM_SHAPES_DOC`. RMSNorm scales (`lat_norm`,
  `q_norm`, `k_norm`, `ffn_norm`) start at 1; the output norm is affine-free;
  `gate` is the scalar λ.
  """

  def __init__(self, config: PVMConfig, *, rngs: nnx.Rngs):
    self.config = c = config
    d, L, dh, F = c.d_model, c.latent_dim, c.head_dim, c.ffn_dim
    pd = c.param_dtype
    normal = nnx.initializers.normal(stddev=c.init_std)

    def proj(shape):
      return nnx.Param(normal(rngs.params(), shape, pd))

    self.w_down_txt = proj((d, L))
    self.lat_norm = nnx.Param(jnp.ones((L,), pd))
    self.w_down_vis = proj((c.vis_dim, L))
    self.w_q = proj((L, c.q_heads * dh))
    self.w_k = proj((L, c.kv_heads * dh))
    self.w_v = proj((L, c.kv_heads * dh))
    self.q_norm = nnx.Param(jnp.ones((dh,), pd))
    self.k_norm = nnx.Param(jnp.ones((dh,), pd))
    self.w_o = proj((c.q_heads * dh, L))
    self.ffn_norm = nnx.Param(jnp.ones((L,), pd))
    self.w_gate = proj((L, F))
    self.w_in = proj((L, F))
    self.w_ffn_out = proj((F, L))
    self.w_up = proj((L, d)) if c.up_init == "normal" else nnx.Param(jnp.zeros((L, d), pd))
    self.gate = nnx.Param(jnp.zeros((), pd))

  def param_arrays(self) -> dict:
    """The raw arrays, keyed as in `branch.PARAM_SHAPES_DOC`."""
    return {name: getattr(self, name)[...] for name in branch.PARAM_SHAPES_DOC}

  def visual_cache(self, v_img_BxNvxDv, visual_valid_BxNv=None) -> branch.VisualCache:
    """Projected, QK-normed visual keys and values: compute once per image."""
    c = self.config
    checks.check_rank("v_img", v_img_BxNvxDv, 3, "[B, Nv, dv]")
    checks.check_float("v_img", v_img_BxNvxDv)
    B, Nv, Dv = v_img_BxNvxDv.shape
    if Dv != c.vis_dim:
      raise ValueError(
          f"v_img last dim {Dv} != visual width {c.vis_dim} (PVMConfig.visual_dim or d_model).")
    if Nv < 1:
      raise ValueError(f"v_img has Nv={Nv} visual tokens; need at least 1 (mask padding instead).")
    if visual_valid_BxNv is not None:
      if tuple(visual_valid_BxNv.shape) != (B, Nv):
        raise ValueError(
            f"visual_valid must have shape {(B, Nv)} ([B, Nv]); got "
            f"{tuple(visual_valid_BxNv.shape)}.")
      if visual_valid_BxNv.dtype != jnp.bool_:
        raise TypeError(f"visual_valid must be bool; got dtype {visual_valid_BxNv.dtype}.")
    return branch.visual_cache(self.param_arrays(), c, v_img_BxNvxDv, visual_valid_BxNv)

  def __call__(self, x_BxTxD, *, visual=None, visual_valid=None, cache=None, text_mask=None,
               return_probs: bool = False):
    """y: [B, T, d], the branch output to add beside the FFN.

    Give either `visual` ([B, Nv, dv] embeddings, with optional `visual_valid`
    [B, Nv] bool) or a `cache` from `visual_cache`. `text_mask` [B, T] is
    1/True on text tokens, 0/False on image tokens (None: all text). With
    `return_probs` also the cross-attention probabilities [B, T, Hq, Nv].
    """
    c = self.config
    checks.check_rank("x", x_BxTxD, 3, "[B, T, d]")
    checks.check_float("x", x_BxTxD)
    B, T, D = x_BxTxD.shape
    if D != c.d_model:
      raise ValueError(f"x last dim {D} != d_model={c.d_model}.")
    if (visual is None) == (cache is None):
      raise ValueError("give exactly one of visual= (embeddings) or cache= (from visual_cache).")
    if cache is None:
      cache = self.visual_cache(visual, visual_valid)
    elif visual_valid is not None:
      raise ValueError("visual_valid goes with visual=; a cache already holds its mask.")
    if not isinstance(cache, branch.VisualCache):
      raise TypeError(f"cache must be a VisualCache; got {type(cache).__name__}.")
    if cache.k.shape[0] != B:
      raise ValueError(f"cache batch {cache.k.shape[0]} != x batch {B}.")
    if text_mask is not None:   # bool or 0/1: a mask selects, it never scales
      text_mask = checks.check_valid("text_mask", text_mask, (B, T))
    return branch.pvm_forward(self.param_arrays(), c, x_BxTxD, cache, text_mask,
                              return_probs=return_probs)


def param_count(config: PVMConfig) -> dict[str, int]:
  """Parameters of one branch, by part.

  For Qwen3-VL-8B (d = 4096, ffn 12288, GQA 4) with d' = 512, three branches
  hold 27.92M parameters: the paper's figure.
  """
  c = config
  d, L, dh, F = c.d_model, c.latent_dim, c.head_dim, c.ffn_dim
  parts = {
      "reducers": d * L + L + c.vis_dim * L,                       # w_down_txt, lat_norm, w_down_vis
      "attention": L * (c.q_heads + 2 * c.kv_heads) * dh + 2 * dh  # w_q, w_k, w_v, q/k norms
                   + c.q_heads * dh * L,                           # w_o
      "latent_ffn": L + 3 * L * F,                                 # ffn_norm, SwiGLU
      "up": L * d,
      "gate": 1,
  }
  parts["total"] = sum(parts.values())
  return parts
