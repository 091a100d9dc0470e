"""The PVM authors' `PVMMemoryBlock`, rebuilt in torch for the parity tests (no run-time use).

Reconstructed from `modeling_qwen3_vl.py` of the GitHub repository
huaixuheqing/PVM (their code targets transformers 4.57 and does not import
under 5.x): the same submodule names, so `load_state_dict(strict=True)` of a
block checks our export's names and shapes, and the same forward:

    small_h = text_reducer(h);  small_v = vision_reducer(visual_context)
    m = cross_attn(input_norm(small_h), small_v, visual_mask)    q/k RMSNorm per head, GQA
    m = m + mlp(post_attn_norm(m))                               SwiGLU of int(L·F/D)
    out = gate_alpha · RMSNorm_affine-free(output_expander(m)) · (1 - query_is_visual)

`authors_visual_context` builds the block's inputs the way their
`PVMQwen3VLModel.forward` does: each row's image-position embeddings (before
DeepStack) padded with `pad_sequence`, the mask 0 on real tokens and
finfo.min on padding, shape [B, 1, 1, Nv].
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
  def __init__(self, dim: int | None, eps: float, affine: bool = True):
    super().__init__()
    self.eps = eps
    if affine:
      self.weight = nn.Parameter(torch.ones(dim))
    else:
      self.weight = None

  def forward(self, x):
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    return x.to(dtype) if self.weight is None else self.weight * x.to(dtype)


class CrossAttention(nn.Module):
  def __init__(self, hidden: int, latent: int, heads: int, kv_heads: int, head_dim: int,
               eps: float):
    super().__init__()
    self.head_dim = head_dim
    self.num_heads = latent // head_dim
    self.num_key_value_heads = max(1, self.num_heads // (heads // kv_heads))
    self.groups = self.num_heads // self.num_key_value_heads
    self.q_proj = nn.Linear(latent, self.num_heads * head_dim, bias=False)
    self.k_proj = nn.Linear(latent, self.num_key_value_heads * head_dim, bias=False)
    self.v_proj = nn.Linear(latent, self.num_key_value_heads * head_dim, bias=False)
    self.o_proj = nn.Linear(self.num_heads * head_dim, latent, bias=False)
    self.q_norm = RMSNorm(head_dim, eps)
    self.k_norm = RMSNorm(head_dim, eps)

  def forward(self, h, v, mask=None):
    B, T = h.shape[:2]
    q = self.q_norm(self.q_proj(h).view(B, T, -1, self.head_dim)).transpose(1, 2)
    Nv = v.shape[1]
    k = self.k_norm(self.k_proj(v).view(B, Nv, -1, self.head_dim)).transpose(1, 2)
    val = self.v_proj(v).view(B, Nv, -1, self.head_dim).transpose(1, 2)
    k = k.repeat_interleave(self.groups, dim=1)
    val = val.repeat_interleave(self.groups, dim=1)
    w = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
    if mask is not None:
      w = w + mask
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(w, val).transpose(1, 2).reshape(B, T, -1)
    return self.o_proj(out)


class MLP(nn.Module):
  def __init__(self, latent: int, ffn: int):
    super().__init__()
    self.gate_proj = nn.Linear(latent, ffn, bias=False)
    self.up_proj = nn.Linear(latent, ffn, bias=False)
    self.down_proj = nn.Linear(ffn, latent, bias=False)

  def forward(self, x):
    return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class PVMMemoryBlock(nn.Module):
  """Widths from a Qwen3-VL text config, as their block derives them."""

  def __init__(self, *, hidden_size, intermediate_size, num_attention_heads,
               num_key_value_heads, head_dim, rms_norm_eps, pvm_hidden_size):
    super().__init__()
    L = pvm_hidden_size
    self.text_reducer = nn.Linear(hidden_size, L, bias=False)
    self.vision_reducer = nn.Linear(hidden_size, L, bias=False)
    self.output_expander = nn.Linear(L, hidden_size, bias=False)
    self.input_norm = RMSNorm(L, rms_norm_eps)
    self.post_attn_norm = RMSNorm(L, rms_norm_eps)
    self.cross_attn = CrossAttention(hidden_size, L, num_attention_heads, num_key_value_heads,
                                     head_dim, rms_norm_eps)
    self.mlp = MLP(L, int(L * (intermediate_size / hidden_size)))
    self.output_norm = RMSNorm(None, rms_norm_eps, affine=False)
    self.gate_alpha = nn.Parameter(torch.zeros(1))

  def forward(self, hidden_states, visual_context, visual_mask=None, query_is_visual_mask=None):
    if visual_context is None or visual_context.numel() == 0:
      return torch.zeros_like(hidden_states)
    m = self.cross_attn(self.input_norm(self.text_reducer(hidden_states)),
                        self.vision_reducer(visual_context), visual_mask)
    m = m + self.mlp(self.post_attn_norm(m))
    out = self.gate_alpha * self.output_norm(self.output_expander(m))
    if query_is_visual_mask is not None:
      out = out * (1.0 - query_is_visual_mask.to(out.dtype).unsqueeze(-1))
    return out


def block_kwargs(text_config: dict) -> dict:
  keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
          "head_dim", "rms_norm_eps", "pvm_hidden_size")
  return {k: text_config[k] for k in keys}


def authors_visual_context(inputs_embeds, visual_pos_masks):
  """(context [B, Nv, D] padded per row, mask [B, 1, 1, Nv]) as their model builds them."""
  rows = [inputs_embeds[i][visual_pos_masks[i] > 0] for i in range(inputs_embeds.shape[0])]
  context = nn.utils.rnn.pad_sequence(rows, batch_first=True)
  mask = torch.full((len(rows), 1, 1, context.shape[1]), torch.finfo(inputs_embeds.dtype).min,
                    dtype=inputs_embeds.dtype)
  for i, r in enumerate(rows):
    if r.shape[0]:
      mask[i, ..., :r.shape[0]] = 0.0
  return context, mask
