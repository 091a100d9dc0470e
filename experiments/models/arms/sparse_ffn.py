"""Top-1 sparse SwiGLU in the memory slot: the Lngram paper's parameter-matched arm.

The paper ("Lngram v2: Latent N-Gram Memory with Interpretable Discrete
Representations", §4.1) inserts "a top-1 Sparse SwiGLU residual branch"
at the Lngram layers, "without discrete addressing, n-grams, memory tables,
or lookup" (GLU variants: Shazeer 2020, arXiv 2002.05202; top-1 routing and
its balance loss: Fedus et al. 2022, "Switch Transformers", arXiv 2101.03961;
shared expert: Dai et al. 2024, "DeepSeekMoE", arXiv 2401.06066). Per token:

    h = RMSNorm(x)                               affine-free (see below)
    p = softmax(h W_r)                           W_r [D, E], float32
    e = argmax p                                 top-1, no token dropping
    y = p_e · W2_e(SiLU(h W1_e) ⊙ h W3_e)        expert width F
        + W2_s(SiLU(h W1_s) ⊙ h W3_s)            shared expert of width S (S = 0: none)

and the caller adds y to the residual stream before the layer's attention.
Training adds the Switch loss α·E·Σ_e f_e·P_e (f_e = share of the valid
tokens routed to e, P_e = their mean router probability of e; padding tokens,
`valid` False, count in neither) as `aux["aux_loss"]`.

Choices the paper leaves open (DESIGN.md states them):
  * The input norm is affine-free: every reader of h is linear, so a learned
    scale would be absorbed by W_r, W1, W3 (the paper's printed counts also
    come out exactly only without norm parameters; see `param_count`).
  * W2 (expert and shared) is zero at init (`out_init_std=0`), so the branch
    adds exactly nothing at step 0 and the model starts as the baseline, as
    Lngram v2 (zero W_O) does. Router and W1/W3 get gradients once W2 moves.
  * The shared expert exists only so that `match_lngram` can match total AND
    active parameters where E and F alone cannot (Lngram r121/m4/KV16 at
    d = 2048 needs a total/active ratio of 7.43 and E experts give ~E).
  * Padding tokens get y = 0.

Dispatch (same result, different cost): "tiled" sorts the tokens by expert
into tiles of `tile` rows, each tile owned by one expert (its rows padded,
at most E·(tile-1) padding rows in all), then one batched matmul over the
tiles with the tiles' gathered weights: exact, no dropping, ~N + E·tile rows
of work (the gathered weights take G·3·D·F memory, G ≤ N/tile + E tiles). "ragged" uses `jax.lax.ragged_dot` over the expert-sorted tokens
(XLA's grouped matmul). "dense" runs every expert on every token and keeps
the chosen one (E× the work; the simplest). On 2 CPU cores, forward+backward
of 2048 tokens at D=128, E=51, F=116: tiled (tile 32) 27 ms, ragged 560 ms,
dense 800 ms (E=152, F=154: 108 ms, 3.4 s, 5.7 s).
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

DISPATCHES = ("tiled", "ragged", "dense")


@dataclasses.dataclass(frozen=True)
class SparseFFNConfig:
  """One top-1 sparse SwiGLU branch.

  d_model: D. experts: E routed experts. expert_dim: F, each expert's hidden
  width. shared_dim: S, the always-on shared expert's width (0 = none).
  balance_coef: α of the Switch loss. init_std: normal init of W_r, W1, W3.
  out_init_std: init of W2 (0 = zeros: the branch starts at exactly 0).
  eps: the input RMSNorm's epsilon. dispatch: one of DISPATCHES. tile: rows
  per tile of the "tiled" dispatch.
  """

  d_model: int
  experts: int = 8
  expert_dim: int = 128
  shared_dim: int = 0
  balance_coef: float = 0.01
  init_std: float = 0.02
  out_init_std: float = 0.0
  eps: float = 1e-6
  dispatch: str = "tiled"
  tile: int = 32

  def __post_init__(self):
    owner = "SparseFFNConfig"
    for name in ("d_model", "experts", "expert_dim", "tile"):
      dataclass_json.check_positive_int(owner, name, getattr(self, name))
    dataclass_json.check_int_at_least(owner, "shared_dim", self.shared_dim, 0)
    for name in ("balance_coef", "out_init_std"):
      dataclass_json.check_finite(owner, name, getattr(self, name), at_least=0.0)
    for name in ("init_std", "eps"):
      dataclass_json.check_finite(owner, name, getattr(self, name), above=0.0)
    if self.dispatch not in DISPATCHES:
      raise ValueError(f"SparseFFNConfig: dispatch={self.dispatch!r} must be one of "
                       f"{DISPATCHES}.")


def param_count(config: SparseFFNConfig) -> dict[str, int]:
  """Parameters of one layer.

  total:  router D·E + E experts · 3·D·F + shared 3·D·S.
  active: what one token touches: the whole router (it scores every expert),
          its one expert and the shared expert: D·E + 3·D·F + 3·D·S.
  The paper's arm (two layers, D = 2048: 155.845M total, 20.972M active) is
  exactly E = 8, F = 1568, S = 136 under this accounting (2·2048·38048 and
  2·2048·5120 parameters); without a shared expert no (E, F) gives both.
  """
  c = config
  d = c.d_model
  router, expert, shared = d * c.experts, 3 * d * c.expert_dim, 3 * d * c.shared_dim
  return {"total": router + c.experts * expert + shared, "active": router + expert + shared,
          "router": router, "experts": c.experts * expert, "shared": shared}


def _error(counts: dict, total: int, active: int) -> float:
  return max(abs(counts["total"] / total - 1), abs(counts["active"] / active - 1))


def match_counts(total: int, active: int, d_model: int, *, tolerance: float = 0.02,
                 **fields) -> SparseFFNConfig:
  """A config of width d_model whose (total, active) are within `tolerance` of the targets.

  Routed experts alone first (S = 0): the (E, F) with the smallest relative
  error, if within tolerance. Otherwise the smallest E ≥ 2 whose (F, S ≥ 0),
  solved from the two counts and rounded, is within tolerance (the largest
  routed experts, the smallest shared one). `fields` go to the config.
  """
  if not 0 < active <= total:
    raise ValueError(f"match_counts: need 0 < active={active} <= total={total}.")
  d = d_model

  def build(E, F, S):
    return SparseFFNConfig(d_model=d, experts=E, expert_dim=F, shared_dim=S, **fields)

  max_experts = max(2, int(2 * total / active) + 2)
  best = None
  for E in range(1, max_experts + 1):
    f_exact = (active / d - E) / 3
    for F in {math.floor(f_exact), math.ceil(f_exact)}:
      if F >= 1:
        err = _error(param_count(build(E, F, 0)), total, active)
        if best is None or err < best[0]:
          best = (err, E, F)
  if best is not None and best[0] <= tolerance:
    return build(best[1], best[2], 0)
  for E in range(2, max_experts + 1):
    f_exact = (total - active) / (3 * d * (E - 1))
    s_exact = (active / d - E) / 3 - f_exact
    cands = [(F, S) for F in {math.floor(f_exact), math.ceil(f_exact)}
             for S in {math.floor(s_exact), math.ceil(s_exact)} if F >= 1 and S >= 0]
    if cands:
      err, F, S = min((_error(param_count(build(E, F, S)), total, active), F, S)
                      for F, S in cands)
      if err <= tolerance:
        return build(E, F, S)
  raise ValueError(f"match_counts: no sparse FFN at d_model={d} within {tolerance:.1%} of "
                   f"total={total}, active={active}.")


def match_lngram(lngram_config, d_model: int | None = None, *, tolerance: float = 0.02,
                 **fields) -> SparseFFNConfig:
  """The sparse FFN (width d_model, default the Lngram layer's) whose total and
  active parameters per layer both match `lngram_jax.param_count(lngram_config)`
  within `tolerance` (see `match_counts`)."""
  from lngram_jax import param_count as lngram_param_count
  counts = lngram_param_count(lngram_config)
  d = lngram_config.d_model if d_model is None else d_model
  return match_counts(counts["total"], counts["active"], d, tolerance=tolerance, **fields)


def _normal(std):
  return nnx.initializers.normal(stddev=std) if std > 0 else nnx.initializers.zeros


def _swiglu(h_NxD, w_gate_DxF, w_up_DxF, w_down_FxD):
  return (jax.nn.silu(h_NxD @ w_gate_DxF) * (h_NxD @ w_up_DxF)) @ w_down_FxD


class SparseFFN(nnx.Module):
  """Top-1 sparse SwiGLU branch (module docstring). Parameters:

    router_w  [D, E]
    w_gate, w_up [E, D, F]; w_down [E, F, D]  (W1, W3, W2 of each expert)
    shared_gate, shared_up [D, S]; shared_down [S, D]   only when S > 0
  """

  def __init__(self, config: SparseFFNConfig, *, rngs: nnx.Rngs):
    self.config = c = config
    D, E, F, S = c.d_model, c.experts, c.expert_dim, c.shared_dim
    init, out = _normal(c.init_std), _normal(c.out_init_std)
    f32 = jnp.float32
    self.router_w = nnx.Param(init(rngs.params(), (D, E), f32))
    self.w_gate = nnx.Param(init(rngs.params(), (E, D, F), f32))
    self.w_up = nnx.Param(init(rngs.params(), (E, D, F), f32))
    self.w_down = nnx.Param(out(rngs.params(), (E, F, D), f32))
    if S:
      self.shared_gate = nnx.Param(init(rngs.params(), (D, S), f32))
      self.shared_up = nnx.Param(init(rngs.params(), (D, S), f32))
      self.shared_down = nnx.Param(out(rngs.params(), (S, D), f32))

  # --- the experts over N flattened tokens -------------------------------------

  def _experts_dense(self, h_NxD, e_N):
    g_NxExF = jnp.einsum("nd,edf->nef", h_NxD, self.w_gate[...])
    u_NxExF = jnp.einsum("nd,edf->nef", h_NxD, self.w_up[...])
    a_NxF = jnp.take_along_axis(jax.nn.silu(g_NxExF) * u_NxExF, e_N[:, None, None], 1)[:, 0]
    return jnp.einsum("nf,nfd->nd", a_NxF, self.w_down[...][e_N])

  def _experts_ragged(self, h_NxD, e_N):
    E = self.config.experts
    order_N = jnp.argsort(e_N, stable=True)
    sizes_E = jnp.bincount(e_N, length=E).astype(jnp.int32)
    hs_NxD = h_NxD[order_N]
    a_NxF = (jax.nn.silu(jax.lax.ragged_dot(hs_NxD, self.w_gate[...], sizes_E))
             * jax.lax.ragged_dot(hs_NxD, self.w_up[...], sizes_E))
    ys_NxD = jax.lax.ragged_dot(a_NxF, self.w_down[...], sizes_E)
    return jnp.zeros_like(ys_NxD).at[order_N].set(ys_NxD)

  def _experts_tiled(self, h_NxD, e_N):
    """Each expert's tokens, in order, fill whole tiles of `tile` rows from
    slot start_e (a multiple of tile); tile g then belongs to one expert."""
    c = self.config
    E, t = c.experts, c.tile
    N, D = h_NxD.shape
    G = -(-(N + E * (t - 1)) // t)           # enough tiles for any routing
    sizes_E = jnp.bincount(e_N, length=E)
    padded_E = -(-sizes_E // t) * t
    end_E = jnp.cumsum(padded_E)
    start_E = end_E - padded_E
    # rank of token n among the tokens of its expert (stable, by position)
    order_N = jnp.argsort(e_N, stable=True)
    first_E = jnp.cumsum(sizes_E) - sizes_E
    rank_sorted_N = jnp.arange(N) - first_E[e_N[order_N]]
    slot_N = jnp.zeros((N,), jnp.int32).at[order_N].set(
        (start_E[e_N[order_N]] + rank_sorted_N).astype(jnp.int32))
    x_GxtxD = jnp.zeros((G * t, D), h_NxD.dtype).at[slot_N].set(h_NxD).reshape(G, t, D)
    # unused tiles (past end_E[-1]) hold zero rows; any expert will do for them
    tile_e_G = jnp.minimum(jnp.searchsorted(end_E, jnp.arange(G) * t, side="right"), E - 1)
    g = jnp.einsum("gtd,gdf->gtf", x_GxtxD, self.w_gate[...][tile_e_G])
    u = jnp.einsum("gtd,gdf->gtf", x_GxtxD, self.w_up[...][tile_e_G])
    y_GxtxD = jnp.einsum("gtf,gfd->gtd", jax.nn.silu(g) * u, self.w_down[...][tile_e_G])
    return y_GxtxD.reshape(G * t, D)[slot_N]

  # --- the branch ---------------------------------------------------------------

  def route(self, x_BxTxD):
    """(h [B, T, D] float32, router probabilities p [B, T, E] float32, top-1 e [B, T])."""
    h_BxTxD = rms_norm(x_BxTxD.astype(jnp.float32), eps=self.config.eps)
    p_BxTxE = jax.nn.softmax(h_BxTxD @ self.router_w[...], axis=-1)
    return h_BxTxD, p_BxTxE, jnp.argmax(p_BxTxE, axis=-1).astype(jnp.int32)

  def __call__(self, x_BxTxD, valid_BxT=None):
    """(y [B, T, D] in x's dtype, p [B, T, E], e [B, T])."""
    c = self.config
    B, T, D = x_BxTxD.shape
    if valid_BxT is not None:
      # Padding computes from zeros (a select): a NaN there reaches no gradient
      # and no aux loss. Each token's expert output is its own (no dropping).
      x_BxTxD = jnp.where(valid_BxT.astype(bool)[..., None], x_BxTxD, 0).astype(x_BxTxD.dtype)
    h_BxTxD, p_BxTxE, e_BxT = self.route(x_BxTxD)
    experts = {"tiled": self._experts_tiled, "ragged": self._experts_ragged,
               "dense": self._experts_dense}[c.dispatch]
    h_NxD = h_BxTxD.reshape(B * T, D)
    y_NxD = experts(h_NxD, e_BxT.reshape(B * T))
    p_top_BxT = jnp.take_along_axis(p_BxTxE, e_BxT[..., None], -1)[..., 0]
    y_BxTxD = p_top_BxT[..., None] * y_NxD.reshape(B, T, D)
    if c.shared_dim:
      y_BxTxD = y_BxTxD + _swiglu(h_BxTxD, self.shared_gate[...], self.shared_up[...],
                                  self.shared_down[...])
    if valid_BxT is not None:
      y_BxTxD = jnp.where(valid_BxT.astype(bool)[..., None], y_BxTxD, 0)
    return y_BxTxD.astype(x_BxTxD.dtype), p_BxTxE, e_BxT

  def forward(self, x_BxTxD, ctx):
    """(y, aux): aux_loss = α·E·Σ f_e·P_e over the valid tokens; the busiest
    expert's share of them; the chosen experts (for `metric_sums`)."""
    c = self.config
    checks.check_layer_inputs(c.d_model, x_BxTxD, valid=ctx.valid_BxT)
    y_BxTxD, p_BxTxE, e_BxT = self(x_BxTxD, ctx.valid_BxT)
    f_E, P_E = load_and_prob(p_BxTxE, e_BxT, ctx.valid_BxT, c.experts)
    aux = {"aux_loss": (c.balance_coef * c.experts * jnp.sum(f_E * P_E)).astype(jnp.float32),
           "metric/max_expert_load": jnp.max(f_E).astype(jnp.float32),
           "expert": e_BxT}
    return y_BxTxD, aux

  def prefill(self, x_BxTxD, ctx):
    return self(x_BxTxD, ctx.valid_BxT)[0], None

  def decode_step(self, x_Bx1xD, state, ctx):
    return self(x_Bx1xD)[0], state

  def init_decode_state(self, batch, ctx):
    return None

  def metric_sums(self, aux, valid_BxT, segment_ids_BxT=None):
    """Valid tokens per expert [E] and in all, over one eval batch."""
    w_BxT = jnp.ones(aux["expert"].shape, jnp.float32) if valid_BxT is None else (
        valid_BxT.astype(bool).astype(jnp.float32))
    onehot_BxTxE = jax.nn.one_hot(aux["expert"], self.config.experts, dtype=jnp.float32)
    return {"expert_tokens": jnp.einsum("bt,bte->e", w_BxT, onehot_BxTxE),
            "tokens": w_BxT.sum()}

  @staticmethod
  def summarise_metrics(sums: dict[str, np.ndarray]) -> dict[str, float]:
    """expert_load_max / _min: the busiest / idlest expert's share of the tokens
    (1/E when balanced); experts_used: the share of experts given any token."""
    load_E = np.asarray(sums["expert_tokens"], np.float64) / max(float(sums["tokens"]), 1.0)
    return {"expert_load_max": float(load_E.max()), "expert_load_min": float(load_E.min()),
            "experts_used": float(np.mean(load_E > 0))}


def load_and_prob(p_BxTxE, e_BxT, valid_BxT, experts: int):
  """(f [E], P [E]): the share of valid tokens routed to each expert and the
  mean router probability of each over the valid tokens (f carries no gradient)."""
  ok_BxT = jnp.ones(e_BxT.shape, bool) if valid_BxT is None else valid_BxT.astype(bool)
  w_BxT = ok_BxT.astype(jnp.float32)
  n = jnp.maximum(w_BxT.sum(), 1.0)
  f_E = jnp.einsum("bt,bte->e", w_BxT, jax.nn.one_hot(e_BxT, experts, dtype=jnp.float32)) / n
  # Selected, not weighted: a NaN probability at padding must not reach the loss.
  p_BxTxE = jnp.where(ok_BxT[..., None], p_BxTxE.astype(jnp.float32), 0)
  P_E = jnp.einsum("bt,bte->e", w_BxT, p_BxTxE) / n
  return jax.lax.stop_gradient(f_E), P_E


NAME = "sparse_ffn"
SLOT = "memory"
CONFIG = SparseFFNConfig
MODULE = SparseFFN
