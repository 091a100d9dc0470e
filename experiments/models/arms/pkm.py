"""Product Key Memory in the memory slot (a comparison arm of the Lngram v2 paper, §4.1).

Lample et al. 2019, "Large Memory Layers with Product Keys", arXiv 1907.05242,
with the optional gated "memory+" output of Berges et al. 2024, "Memory Layers
at Scale", arXiv 2412.09764 (from the papers only; no code read from theirs).

Per token, per head h (shape legend: H heads, Dk query width, Nk sub-keys per
half (|C|), Ns = Nk² slots, P top-k picks, Dv value width):

    u = RMSNorm(x)                          affine-free input norm (x is the raw residual)
    q = QueryNorm(u @ W_q)[h] = [q1 ; q2]   W_q [D, H·Dk]; q1, q2 [Dk/2]
    s1 = q1 · C1[h]ᵀ, s2 = q2 · C2[h]ᵀ      sub-keys C1, C2 [H, Nk, Dk/2]
    top-P of s1 and of s2, then top-P over the P² sums s1_i + s2_j
      == the exact top-P of s1_i + s2_j over all Ns slots (i, j) (slot i·Nk + j)
    w = softmax over the P picked scores
    m = Σ_h Σ_p w_p V[slot_p]               values V [Ns, Dv], shared by the heads
    y = m                                   plain (Dv = D)
    y = (m ⊙ SiLU(u @ W_g)) @ W_o           gated ("memory+"), W_g [D, Dv], W_o [Dv, D]

The query norm is a per-token RMSNorm over each head's Dk with a learned scale
(`query_norm="rms"`), or none. Lample et al. use BatchNorm; its statistics mix
the tokens of a batch (output at t would depend on later tokens and other
segments, and decode would need running statistics), so we use the per-token
norm the later memory-layer work uses. `key_norm` also RMS-normalises each
sub-key (affine-free), the keys half of Berges et al.'s qk-norm.

Init: with `zero_init` (default) the output is exactly zero at init (V = 0 in
the plain form, W_o = 0 in the gated one), like Lngram v2's zero W_O: step 0
equals the memory-free model, and the arm can be inserted into a trained model.
Lample et al. draw V ~ N(0, 1/Dv) (what `zero_init=False` does).

Values' learning rate: V is the one Param of `self.tables` (path
`.../memory/tables/0`), so the optimiser puts it in the 'table' group:
table_lr_mult × the base LR and no weight decay (Lample et al. likewise give
the sparsely updated values a higher LR). Sub-keys, W_q, W_g, W_o are in the
'decay' group, the query-norm scale in 'no_decay'.

The branch is a per-token function: no decode state (None), nothing crosses
positions or segments. Padding positions (ctx.valid_BxT False) output zero.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lngram_jax import checks, dataclass_json
from lngram_jax.norms import rms_norm

QUERY_NORMS = ("rms", "none")


@dataclasses.dataclass(frozen=True)
class PKMConfig:
  """Hyper-parameters of one PKM layer.

  d_model: D, the residual width.
  heads: H query heads (each with its own sub-keys; values shared).
  key_dim: Dk, the query width per head (even: two halves).
  num_keys: Nk = |C| sub-keys per half; the memory has Nk² slots.
  topk: P slots read per head (P <= Nk).
  value_dim: Dv, the value width; 0 = d_model. The plain form needs Dv = D.
  gated: the "memory+" output (m ⊙ SiLU(u W_g)) W_o.
  query_norm: "rms" (per-token RMSNorm per head, learned scale) or "none".
  key_norm: RMS-normalise every sub-key (affine-free).
  zero_init: zero output at init (V = 0, or W_o = 0 when gated).
  init_std: normal init scale of W_q and W_g (and W_o without zero_init).
  eps: RMSNorm epsilon.
  """

  d_model: int
  heads: int = 4
  key_dim: int = 32
  num_keys: int = 128
  topk: int = 32
  value_dim: int = 0
  gated: bool = False
  query_norm: str = "rms"
  key_norm: bool = False
  zero_init: bool = True
  init_std: float = 0.02
  eps: float = 1e-6

  def __post_init__(self):
    for name in ("d_model", "heads", "key_dim", "num_keys", "topk"):
      dataclass_json.check_positive_int("PKMConfig", name, getattr(self, name))
    dataclass_json.check_int_at_least("PKMConfig", "value_dim", self.value_dim, 0,
                                      "(0 = d_model)")
    if self.key_dim % 2:
      raise ValueError(f"PKMConfig: key_dim={self.key_dim} must be even (two halves).")
    if self.topk > self.num_keys:
      raise ValueError(f"PKMConfig: topk={self.topk} must be <= num_keys={self.num_keys}.")
    if self.num_keys ** 2 > np.iinfo(np.int32).max:
      raise ValueError(f"PKMConfig: num_keys={self.num_keys} must have num_keys² fit int32.")
    for name in ("gated", "key_norm", "zero_init"):
      dataclass_json.check_bool("PKMConfig", name, getattr(self, name))
    if self.query_norm not in QUERY_NORMS:
      raise ValueError(f"PKMConfig: query_norm={self.query_norm!r} must be one of "
                       f"{QUERY_NORMS}.")
    if not self.gated and self.value_dim not in (0, self.d_model):
      raise ValueError(f"PKMConfig: value_dim={self.value_dim} must be 0 or d_model="
                       f"{self.d_model} unless gated (the plain form outputs the values).")
    for name in ("init_std", "eps"):
      dataclass_json.check_finite("PKMConfig", name, getattr(self, name), above=0)

  @property
  def dv(self) -> int:
    return self.value_dim or self.d_model

  @property
  def slots(self) -> int:
    return self.num_keys ** 2


def param_count(config: PKMConfig) -> dict[str, int]:
  """Parameters of ONE layer: {"total", "active", "values", "keys", "dense"}.

  active = what one token touches: W_q and the query-norm scale, every sub-key
  of every head (each is scored: the product-key search is exact over the Nk
  sub-keys of each half), H·P value rows of Dv, and W_g, W_o when gated.
  """
  c = config
  dense = c.d_model * c.heads * c.key_dim + (c.heads * c.key_dim if c.query_norm == "rms" else 0)
  if c.gated:
    dense += 2 * c.d_model * c.dv
  keys = c.heads * c.num_keys * c.key_dim  # two halves of Nk sub-keys of Dk/2
  values = c.slots * c.dv
  return {"total": dense + keys + values, "active": dense + keys + c.heads * c.topk * c.dv,
          "values": values, "keys": keys, "dense": dense}


def pkm_scores(q_xHxDk, c1_HxNkxDh, c2_HxNkxDh, topk: int, *, brute_force: bool = False):
  """The top-P slots of each head: (scores [..., H, P] descending, slots int32 [..., H, P]).

  Two-stage product-key search (top-P per half, then over the P² sums) or,
  with `brute_force`, top-P over all Nk² sums (the slow reference: equal up to
  ties). Slot of (i, j) = i·Nk + j.
  """
  Dh = c1_HxNkxDh.shape[-1]
  Nk = c1_HxNkxDh.shape[1]
  s1_xHxNk = jnp.einsum("...hd,hnd->...hn", q_xHxDk[..., :Dh], c1_HxNkxDh)
  s2_xHxNk = jnp.einsum("...hd,hnd->...hn", q_xHxDk[..., Dh:], c2_HxNkxDh)
  if brute_force:
    all_xHxNs = (s1_xHxNk[..., :, None] + s2_xHxNk[..., None, :]).reshape(
        *s1_xHxNk.shape[:-1], Nk * Nk)
    scores, slots = jax.lax.top_k(all_xHxNs, topk)
    return scores, slots.astype(jnp.int32)
  v1_xHxP, i1_xHxP = jax.lax.top_k(s1_xHxNk, topk)
  v2_xHxP, i2_xHxP = jax.lax.top_k(s2_xHxNk, topk)
  sums_xHxPP = (v1_xHxP[..., :, None] + v2_xHxP[..., None, :]).reshape(
      *v1_xHxP.shape[:-1], topk * topk)
  scores, pick_xHxP = jax.lax.top_k(sums_xHxPP, topk)
  i = jnp.take_along_axis(i1_xHxP, pick_xHxP // topk, axis=-1)
  j = jnp.take_along_axis(i2_xHxP, pick_xHxP % topk, axis=-1)
  return scores, (i * Nk + j).astype(jnp.int32)


class PKM(nnx.Module):
  """One Product Key Memory layer (see the module docstring)."""

  def __init__(self, config: PKMConfig, *, rngs: nnx.Rngs):
    self.config = c = config
    H, Dk, Nk, Dv, D = c.heads, c.key_dim, c.num_keys, c.dv, c.d_model
    f32 = jnp.float32
    self.w_q = nnx.Param(c.init_std * jax.random.normal(rngs.params(), (D, H * Dk), f32))
    self.query_norm = nnx.Param(jnp.ones((H, Dk), f32)) if c.query_norm == "rms" else None
    # Sub-keys ~ N(0, 2/Dk): a unit-RMS query half then scores with unit variance.
    key_std = 1.0 / math.sqrt(Dk // 2)
    self.subkeys = nnx.Param(key_std * jax.random.normal(rngs.params(), (2, H, Nk, Dk // 2), f32))
    plain_zero = c.zero_init and not c.gated
    values = (jnp.zeros((Nk * Nk, Dv), f32) if plain_zero
              else jax.random.normal(rngs.params(), (Nk * Nk, Dv), f32) / math.sqrt(Dv))
    self.tables = nnx.List([nnx.Param(values)])
    if c.gated:
      self.w_g = nnx.Param(c.init_std * jax.random.normal(rngs.params(), (D, Dv), f32))
      self.w_o = nnx.Param(jnp.zeros((Dv, D), f32) if c.zero_init
                           else c.init_std * jax.random.normal(rngs.params(), (Dv, D), f32))
    else:
      self.w_g = self.w_o = None

  def __call__(self, x_BxTxD, valid_BxT=None, *, brute_force: bool = False):
    """y [B, T, D] float32 and aux {"slots": int32 [B, T, H, P], "weights": [B, T, H, P]}."""
    c = self.config
    B, T, _ = x_BxTxD.shape
    if valid_BxT is not None:
      # Padding computes from zeros (a select): a NaN there reaches no gradient.
      x_BxTxD = jnp.where(valid_BxT.astype(bool)[..., None], x_BxTxD, 0).astype(x_BxTxD.dtype)
    u_BxTxD = rms_norm(x_BxTxD.astype(jnp.float32), eps=c.eps)
    q_BxTxHxDk = (u_BxTxD @ self.w_q[...]).reshape(B, T, c.heads, c.key_dim)
    if self.query_norm is not None:
      q_BxTxHxDk = rms_norm(q_BxTxHxDk, self.query_norm[...], eps=c.eps)
    c1, c2 = self.subkeys[...][0], self.subkeys[...][1]
    if c.key_norm:
      c1, c2 = rms_norm(c1, eps=c.eps), rms_norm(c2, eps=c.eps)
    scores_BxTxHxP, slots_BxTxHxP = pkm_scores(q_BxTxHxDk, c1, c2, c.topk,
                                               brute_force=brute_force)
    w_BxTxHxP = jax.nn.softmax(scores_BxTxHxP, axis=-1)
    # Slots are always in range; "clip" skips the out-of-bounds fill masks (faster on CPU).
    rows_BxTxHxPxDv = jnp.take(self.tables[0][...], slots_BxTxHxP, axis=0, mode="clip")
    y_BxTxD = jnp.einsum("bthp,bthpv->btv", w_BxTxHxP, rows_BxTxHxPxDv)
    if c.gated:
      y_BxTxD = (y_BxTxD * jax.nn.silu(u_BxTxD @ self.w_g[...])) @ self.w_o[...]
    if valid_BxT is not None:
      y_BxTxD = jnp.where(valid_BxT.astype(bool)[..., None], y_BxTxD, 0.0)
    return y_BxTxD, {"slots": slots_BxTxHxP, "weights": w_BxTxHxP}


class PKMMemory(PKM):
  """PKM in the memory slot; no decode state (a per-token function)."""

  def forward(self, x_BxTxD, ctx):
    """aux: `slots` [B, T, H, P], `metric/batch_slot_usage` (the share of the Nk²
    values this batch's valid tokens read: the training-time slot usage) and,
    with ctx.probe, the softmax `weights` [B, T, H, P]."""
    checks.check_layer_inputs(self.config.d_model, x_BxTxD, valid=ctx.valid_BxT)
    y_BxTxD, aux = self(x_BxTxD, ctx.valid_BxT)
    read_Ns = self.metric_sums(aux, ctx.valid_BxT)["slots_read_max"]
    out = {"slots": aux["slots"], "metric/batch_slot_usage": jnp.mean(read_Ns)}
    if ctx.probe:
      out["weights"] = aux["weights"]
    return y_BxTxD, out

  def prefill(self, x_BxTxD, ctx):
    return self(x_BxTxD, ctx.valid_BxT)[0], None

  def decode_step(self, x_Bx1xD, state, ctx):
    return self(x_Bx1xD, ctx.valid_BxT)[0], state

  def init_decode_state(self, batch, ctx):
    return None

  def metric_sums(self, aux, valid_BxT, segment_ids_BxT=None):
    """Eval sums of one batch: `slots_read_max` [Ns] 1.0 where a valid token read
    the slot (merged by max across batches) and `tokens`, the valid tokens."""
    slots_BxTxHxP = aux["slots"]
    ok_BxT = (jnp.ones(slots_BxTxHxP.shape[:2], bool) if valid_BxT is None
              else valid_BxT.astype(bool))
    read_Ns = jnp.zeros((self.config.slots,), jnp.float32).at[slots_BxTxHxP.reshape(-1)].max(
        jnp.broadcast_to(ok_BxT[:, :, None, None], slots_BxTxHxP.shape)
        .reshape(-1).astype(jnp.float32))
    return {"slots_read_max": read_Ns, "tokens": ok_BxT.sum().astype(jnp.float32)}

  @staticmethod
  def summarise_metrics(sums):
    """slot_usage: the share of the Nk² values read at least once in eval."""
    read = np.asarray(sums["slots_read_max"])
    return {"slot_usage": float((read > 0).mean())}


NAME = "pkm"
SLOT = "memory"
CONFIG = PKMConfig
MODULE = PKMMemory
