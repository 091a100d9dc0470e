"""Engram: hashed token n-gram memory with a context-aware gate, in the memory slot.

"Conditional Memory via Scalable Lookup: A New Axis of Sparsity for Large
Language Models" (Cheng et al. 2026, arXiv 2601.07372). Per position t, over
the canonical byte ids (ASCII case folding: 'A'..'Z' read as 'a'..'z'):

    hash_n  = XOR_{k<n} (id_{t-k} · m_k)           int32, wrapping
    row_n,h = offset_n,h + hash_n mod p_n,h         one flattened table, distinct primes
    e       = concat_{n, h} tables[row_n,h]         [D_en = |N|·H·d_head]
    g       = σ(signed_sqrt(⟨RMSNorm_q(x), RMSNorm_k(W_k e + b_k)⟩ / √d))
    v       = g · (W_v e + b_v)
    Y       = v + SiLU(DWConv(RMSNorm_c(v)))        kernel W, dilation max order, causal

An id before the sequence start, in another packed segment or on a padding
token reads the pad id (= vocab_size, no byte has it), so no n-gram crosses a
segment. Y is zero on padding tokens. The multipliers m_k (odd, bounded by
int32_max // (vocab_size + 1) so that one product never overflows) and the
primes p_n,h (distinct over every order and head, each >= table_base) are
derived from the config alone, so a restored model hashes exactly as it
trained; every Engram layer of one model therefore hashes alike (the
branch does not know its layer; each layer keeps its own tables).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from lngram_jax import checks, dataclass_json, history
from lngram_jax.addressing import shift_right
from lngram_jax.conv import short_conv
from lngram_jax.dataclass_json import is_int as _is_int
from lngram_jax.norms import rms_norm

_INT32_MAX = 2**31 - 1
_SIGNED_SQRT_FLOOR = 1e-6   # signed_sqrt(x) = sign(x)·sqrt(max(|x|, 1e-6)), as Engram


@dataclasses.dataclass(frozen=True)
class EngramConfig:
  """One Engram layer.

  Attributes:
    d_model: backbone width d.
    orders: n-gram orders N, ascending, each >= 2.
    heads: hash heads H per order (each its own prime-sized table).
    head_dim: width d_head of one table row; D_en = |N|·H·d_head.
    table_base: the smallest table size; head primes are the next distinct
      primes >= it, order by order, head by head.
    vocab_size: ids are 0..vocab_size-1 (bytes: 256); the pad id is vocab_size.
    case_fold: ASCII case folding as the canonical id map.
    hash_seed: seeds the hash multipliers.
    conv_kernel: W taps of the short conv (dilation = the largest order).
    zero_init: W_v and b_v start at zero, so Y = 0 at init (an insertion
      option; the original's value projection is random, Y != 0 at init).
    eps: RMSNorm epsilon.
    init_std, table_init_std: normal init scales of W_k/W_v and the table.
  """

  d_model: int
  orders: tuple[int, ...] = (2, 3)
  heads: int = 4
  head_dim: int = 32
  table_base: int = 8192
  vocab_size: int = 256
  case_fold: bool = True
  hash_seed: int = 0
  conv_kernel: int = 4
  zero_init: bool = False
  eps: float = 1e-6
  init_std: float = 0.02
  table_init_std: float = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    name = type(self).__name__
    if not isinstance(self.orders, (tuple, list)) or not self.orders or not all(
        _is_int(n) for n in self.orders):
      raise ValueError(f"{name}: orders={self.orders!r} must be a non-empty tuple of ints.")
    object.__setattr__(self, "orders", tuple(int(n) for n in self.orders))
    for field in ("dtype", "param_dtype"):   # one spelling, so equal configs hash alike
      object.__setattr__(self, field,
                         dataclass_json.as_float_dtype(name, field, getattr(self, field)))
    if self.orders[0] < 2 or list(self.orders) != sorted(set(self.orders)):
      raise ValueError(f"{name}: orders={self.orders} must be strictly ascending, each >= 2.")
    for field in ("d_model", "heads", "head_dim", "conv_kernel"):
      dataclass_json.check_positive_int(name, field, getattr(self, field))
    if not _is_int(self.table_base) or self.table_base < 2:
      raise ValueError(f"{name}: table_base={self.table_base!r} must be an int >= 2.")
    if not _is_int(self.vocab_size) or not 1 <= self.vocab_size <= 2**24:
      raise ValueError(f"{name}: vocab_size={self.vocab_size!r} must be an int in [1, 2**24].")
    dataclass_json.check_int_at_least(name, "hash_seed", self.hash_seed, 0)
    for field in ("case_fold", "zero_init"):
      dataclass_json.check_bool(name, field, getattr(self, field))
    dataclass_json.check_finite(name, "eps", self.eps, above=0)
    for field in ("init_std", "table_init_std"):
      dataclass_json.check_finite(name, field, getattr(self, field), at_least=0)
    # Rows are int32; primes this sparse stay below twice the base.
    if self.table_base * len(self.orders) * self.heads > 2**29:
      raise ValueError(f"{name}: table_base={self.table_base} must keep table_base·|N|·H "
                       "<= 2**29 (the flattened table's rows are int32).")

  @property
  def max_order(self) -> int:
    return self.orders[-1]

  @property
  def dilation(self) -> int:
    return self.max_order

  @property
  def conv_context(self) -> int:
    """S: previous conv inputs one step reads, (W-1)·dilation."""
    return (self.conv_kernel - 1) * self.dilation

  @property
  def memory_dim(self) -> int:
    """D_en = |N|·H·d_head."""
    return len(self.orders) * self.heads * self.head_dim

  @property
  def pad_id(self) -> int:
    return self.vocab_size


# --- hashing constants (pure Python: the same on every numpy/jax version) -----


def _splitmix64(state: int):
  """The next (state, value) of SplitMix64 (Steele et al. 2014), 64-bit unsigned."""
  mask = (1 << 64) - 1
  state = (state + 0x9E3779B97F4A7C15) & mask
  z = state
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
  return state, z ^ (z >> 31)


def hash_multipliers(config: EngramConfig) -> tuple[int, ...]:
  """m_0..m_{max order - 1}: odd, < int32_max // (vocab_size + 1), so id·m never
  overflows (as Engram's generator bounds them by int32_max / vocab)."""
  half = max(1, _INT32_MAX // (config.vocab_size + 1) // 2)
  state, out = config.hash_seed, []
  for _ in range(config.max_order):
    state, z = _splitmix64(state)
    out.append(2 * (z % half) + 1)
  return tuple(out)


def _is_prime(n: int) -> bool:
  if n < 2:
    return False
  if n % 2 == 0:
    return n == 2
  return all(n % f for f in range(3, math.isqrt(n) + 1, 2))


def head_primes(config: EngramConfig) -> tuple[tuple[int, ...], ...]:
  """p[n][h]: per order, per head, the next prime >= table_base not taken yet."""
  seen, out = set(), []
  for _ in config.orders:
    p, heads = config.table_base - 1, []
    for _ in range(config.heads):
      p += 1
      while p in seen or not _is_prime(p):
        p += 1
      seen.add(p)
      heads.append(p)
    out.append(tuple(heads))
  return tuple(out)


def head_offsets(primes) -> tuple[int, ...]:
  """First row of each (order, head) in the flattened table, order-major."""
  flat = [p for order in primes for p in order]
  return tuple(int(x) for x in np.cumsum([0] + flat[:-1]))


# --- ids, windows, hashes -------------------------------------------------------


def canonical_ids(tokens_BxT, case_fold: bool = True):
  """Byte ids with ASCII case folding ('A'..'Z' -> 'a'..'z'): int32."""
  ids = jnp.asarray(tokens_BxT, jnp.int32)
  if not case_fold:
    return ids
  return jnp.where((ids >= 65) & (ids <= 90), ids + 32, ids)


def window_ids(ids_BxT, max_order: int, pad_id: int, *, segment_ids=None, valid=None):
  """[B, T, max_order]: [..., k] = id at t-k, the pad id where t-k < 0, where it
  is padding or in another segment than t (so no n-gram crosses a segment)."""
  if valid is not None:
    ids_BxT = jnp.where(valid.astype(bool), ids_BxT, pad_id)
  cols = []
  for k in range(max_order):
    back = shift_right(ids_BxT, k, fill=pad_id)
    if segment_ids is not None and k:
      back = jnp.where(shift_right(segment_ids, k, fill=-1) == segment_ids, back, pad_id)
    cols.append(back)
  return jnp.stack(cols, axis=-1)


def ngram_hashes(window_BxTxK, orders, multipliers, primes):
  """Local indices [B, T, |N|·H] (order-major): hash_n mod p_n,h, int32 wrapping.

  hash_n = XOR_{k<n} (id_{t-k} · m_k); int32 products wrap in two's complement
  (XLA's integer multiply), and mod takes the divisor's sign (non-negative).
  """
  w = window_BxTxK.astype(jnp.int32)
  h = w[..., 0] * jnp.int32(multipliers[0])
  out, k = [], 1
  for n, ps in zip(orders, primes, strict=True):
    for j in range(k, n):
      h = jnp.bitwise_xor(h, w[..., j] * jnp.int32(multipliers[j]))
    k = n
    out.append(jnp.remainder(h[..., None], jnp.asarray(ps, jnp.int32)))
  return jnp.concatenate(out, axis=-1)


def signed_sqrt(x):
  return jnp.sign(x) * jnp.sqrt(jnp.maximum(jnp.abs(x), _SIGNED_SQRT_FLOOR))


# --- the functional core (jitted: an eager call compiles once; inside jit it inlines) --


@struct.dataclass
class EngramParams:
  """The layer's arrays (see `Engram`); table [Σ p_n,h, d_head]."""

  table: jax.Array
  w_k: jax.Array
  b_k: jax.Array
  k_norm: jax.Array
  q_norm: jax.Array
  w_v: jax.Array
  b_v: jax.Array
  conv_norm: jax.Array
  conv_kernel: jax.Array


@struct.dataclass
class EngramDecodeState:
  """H = max order - 1 history slots, S = (W-1)·dilation conv steps; oldest first.

  ids_BxH: canonical ids of the previous positions.
  ids_ok_BxH: whether that position is a real token of the current segment
    (else the window reads the pad id there).
  conv_BxSxD: the previous conv inputs RMSNorm_c(v), zero where not ok.
  """

  ids_BxH: jax.Array
  ids_ok_BxH: jax.Array
  conv_BxSxD: jax.Array


@functools.lru_cache(maxsize=64)
def hash_constants(config: EngramConfig):
  """(multipliers, primes, offsets) of a config, computed once."""
  primes = head_primes(config)
  return hash_multipliers(config), primes, head_offsets(primes)


def table_rows(config: EngramConfig, window_BxTxK):
  """Global table rows [B, T, |N|·H] of the windows."""
  multipliers, primes, offsets = hash_constants(config)
  local = ngram_hashes(window_BxTxK, config.orders, multipliers, primes)
  return local + jnp.asarray(offsets, jnp.int32)


@functools.partial(jax.jit, static_argnames=("c",))
def token_rows(c: EngramConfig, tokens_BxT, segment_ids=None, valid=None):
  """Global table rows [B, T, |N|·H] of every position's n-grams."""
  return table_rows(c, window_ids(canonical_ids(tokens_BxT, c.case_fold), c.max_order,
                                  c.pad_id, segment_ids=segment_ids, valid=valid))


def _delta(p: EngramParams, c: EngramConfig, x_BxTxD, rows_BxTxK, *, valid, conv):
  """(Y, gate [B, T], conv input) from the rows; `conv` maps the conv input to its output."""
  B, T = x_BxTxD.shape[:2]
  x = x_BxTxD.astype(c.dtype)
  if valid is not None:
    # Masks select: padding computes from zeros, so a NaN there reaches no
    # valid output and no gradient (a product would carry NaN·0 = NaN).
    valid_BxTx1 = valid.astype(bool)[:, :, None]
    x = jnp.where(valid_BxTx1, x, 0).astype(c.dtype)
  # Gather, then cast: only the rows read change dtype, never the whole table.
  e_BxTxDe = p.table[rows_BxTxK].astype(c.dtype).reshape(B, T, c.memory_dim)
  key = rms_norm(e_BxTxDe @ p.w_k.astype(c.dtype) + p.b_k.astype(c.dtype), p.k_norm,
                 eps=c.eps)
  query = rms_norm(x, p.q_norm, eps=c.eps)
  g_BxT = jax.nn.sigmoid(signed_sqrt(jnp.sum(query * key, -1) / math.sqrt(c.d_model)))
  v = g_BxT[..., None] * (e_BxTxDe @ p.w_v.astype(c.dtype) + p.b_v.astype(c.dtype))
  conv_in = rms_norm(v, p.conv_norm, eps=c.eps)
  if valid is not None:
    conv_in = jnp.where(valid_BxTx1, conv_in, 0).astype(conv_in.dtype)
  y = v + jax.nn.silu(conv(conv_in, p.conv_kernel.astype(c.dtype)))
  if valid is not None:
    y = jnp.where(valid_BxTx1, y, 0).astype(y.dtype)
  return y, g_BxT, conv_in


@functools.partial(jax.jit, static_argnames=("c",))
def parallel_forward(p: EngramParams, c: EngramConfig, x_BxTxD, tokens_BxT, segment_ids=None,
                     valid=None):
  """(Y, rows, gate, conv input) over whole rows."""
  rows = token_rows(c, tokens_BxT, segment_ids, valid)

  def conv(conv_in, kernel):
    return short_conv(conv_in, kernel, dilation=c.dilation, segment_ids=segment_ids)

  y, g, conv_in = _delta(p, c, x_BxTxD, rows, valid=valid, conv=conv)
  return y, rows, g, conv_in


@functools.partial(jax.jit, static_argnames=("c",))
def decode_forward(p: EngramParams, c: EngramConfig, x_Bx1xD, tokens_Bx1,
                   state: EngramDecodeState):
  """One token per row (itself valid, continuing the history's segment): (Y, state)."""
  window_ids, window_ok = history.step_window(state.ids_BxH, state.ids_ok_BxH,
                                          canonical_ids(tokens_Bx1, c.case_fold))
  # [B, 1, max order]: [..., k] is the id at t-k (the pad id where not ok).
  back_ids = jnp.where(window_ok, window_ids, c.pad_id)[:, ::-1][:, None, :]
  conv_steps = []

  def conv(conv_in_Bx1xD, kernel):
    conv_steps.append(history.conv_window(state.conv_BxSxD, conv_in_Bx1xD))
    return short_conv(conv_steps[0], kernel, dilation=c.dilation)[:, -1:]

  y, _, _ = _delta(p, c, x_Bx1xD, table_rows(c, back_ids), valid=None, conv=conv)
  return y, EngramDecodeState(ids_BxH=window_ids[:, 1:], ids_ok_BxH=window_ok[:, 1:],
                              conv_BxSxD=conv_steps[0][:, 1:])


@functools.partial(jax.jit, static_argnames=("c",))
def prefill_state(c: EngramConfig, tokens_BxT, conv_in_BxTxD, lengths_B, valid_BxT,
                  segment_ids=None) -> EngramDecodeState:
  """The decode state after a right-padded prompt: its last H ids, S conv inputs."""
  ids_BxH, ids_ok_BxH, conv_BxSxD = history.prefill_history(
      canonical_ids(tokens_BxT, c.case_fold), conv_in_BxTxD, lengths_B, valid_BxT,
      history=c.max_order - 1, conv_context=c.conv_context, segment_ids=segment_ids)
  return EngramDecodeState(ids_BxH=ids_BxH, ids_ok_BxH=ids_ok_BxH, conv_BxSxD=conv_BxSxD)


# --- the branch -------------------------------------------------------------------


def _normal(std):
  return nnx.initializers.normal(stddev=std)


class Engram(nnx.Module):
  """The Engram memory branch (module docstring) over `parallel_forward`/`decode_forward`.

  Parameters:
    tables[0]   [Σ p_n,h, d_head]   one flattened table (the 'table' optimiser group)
    w_k [D_en, D], b_k [D], k_norm [D]; q_norm [D]   the gate
    w_v [D_en, D], b_v [D]                          the value
    conv_norm [D], conv_kernel [W, D]                zero-init conv taps
  """

  def __init__(self, config: EngramConfig, *, rngs: nnx.Rngs):
    self.config = c = config
    d, De, pd = c.d_model, c.memory_dim, c.param_dtype
    self.multipliers, self.primes, self.offsets = hash_constants(c)
    rows = sum(p for order in self.primes for p in order)
    self.tables = nnx.List([
        nnx.Param(_normal(c.table_init_std)(rngs.params(), (rows, c.head_dim), pd))])
    self.w_k = nnx.Param(_normal(c.init_std)(rngs.params(), (De, d), pd))
    self.b_k = nnx.Param(jnp.zeros((d,), pd))
    self.k_norm = nnx.Param(jnp.ones((d,), pd))
    self.q_norm = nnx.Param(jnp.ones((d,), pd))
    w_v = _normal(c.init_std)(rngs.params(), (De, d), pd)
    self.w_v = nnx.Param(jnp.zeros_like(w_v) if c.zero_init else w_v)
    self.b_v = nnx.Param(jnp.zeros((d,), pd))
    self.conv_norm = nnx.Param(jnp.ones((d,), pd))
    self.conv_kernel = nnx.Param(jnp.zeros((c.conv_kernel, d), pd))

  def param_arrays(self) -> EngramParams:
    return EngramParams(
        table=self.tables[0][...], w_k=self.w_k[...], b_k=self.b_k[...],
        k_norm=self.k_norm[...], q_norm=self.q_norm[...], w_v=self.w_v[...],
        b_v=self.b_v[...], conv_norm=self.conv_norm[...], conv_kernel=self.conv_kernel[...])

  def rows(self, tokens_BxT, *, segment_ids=None, valid=None):
    """Global table rows [B, T, |N|·H] of every position's n-grams."""
    return token_rows(self.config, tokens_BxT, segment_ids, valid)

  def _parallel(self, x_BxTxD, ctx, valid):
    checks.check_layer_inputs(self.config.d_model, x_BxTxD, ctx.segment_ids_BxT, valid)
    if ctx.tokens_BxT is None:
      raise ValueError("Engram: the context has no tokens_BxT (Engram hashes token ids).")
    checks.check_mask("tokens_BxT", ctx.tokens_BxT, x_BxTxD.shape[:2])
    return parallel_forward(self.param_arrays(), self.config, x_BxTxD, ctx.tokens_BxT,
                            ctx.segment_ids_BxT, valid)

  # --- the branch protocol -------------------------------------------------------

  def forward(self, x_BxTxD, ctx):
    """(Y, aux): aux rows [B, T, |N|·H] int32 and metric/gate_mean."""
    valid = ctx.valid_BxT
    y, rows, g_BxT, _ = self._parallel(x_BxTxD, ctx, valid)
    ok = jnp.ones(g_BxT.shape, bool) if valid is None else valid.astype(bool)
    w = ok.astype(jnp.float32)
    gate_mean = jnp.sum(jnp.where(ok, g_BxT.astype(jnp.float32), 0)) / jnp.maximum(jnp.sum(w), 1.0)
    return y, {"rows": rows, "metric/gate_mean": gate_mean}

  def prefill(self, x_BxTxD, ctx):
    checks.check_layer_inputs(self.config.d_model, x_BxTxD, ctx.segment_ids_BxT, ctx.valid_BxT)
    B, T = x_BxTxD.shape[:2]
    lengths_B, valid = history.prompt_lengths(B, T, ctx.lengths_B, ctx.valid_BxT)
    y, _, _, conv_in = self._parallel(x_BxTxD, ctx, valid)
    return y, prefill_state(self.config, ctx.tokens_BxT, conv_in, lengths_B, valid,
                            ctx.segment_ids_BxT)

  def decode_step(self, x_Bx1xD, state, ctx):
    c = self.config
    checks.check_layer_inputs(c.d_model, x_Bx1xD)
    B = x_Bx1xD.shape[0]
    if x_Bx1xD.shape[1] != 1:
      raise ValueError(f"Engram.decode_step: x must have shape [B, 1, {c.d_model}]; got "
                       f"{tuple(x_Bx1xD.shape)}.")
    if ctx.tokens_BxT is None or tuple(ctx.tokens_BxT.shape) != (B, 1):
      raise ValueError(f"Engram.decode_step: the context needs tokens_BxT of shape [{B}, 1].")
    history.check_state_batch("Engram.decode_step", B, state.ids_BxH, state.ids_ok_BxH,
                              state.conv_BxSxD)
    H, S = c.max_order - 1, c.conv_context
    if state.ids_BxH.shape[1:] != (H,) or state.conv_BxSxD.shape[1:] != (S, c.d_model):
      raise ValueError(f"Engram.decode_step: the state holds {state.ids_BxH.shape[1]} ids and "
                       f"conv inputs {tuple(state.conv_BxSxD.shape[1:])} but this config needs "
                       f"H = max order - 1 = {H} ids and (S, D) = {(S, c.d_model)}.")
    return decode_forward(self.param_arrays(), self.config, x_Bx1xD, ctx.tokens_BxT, state)

  def init_decode_state(self, batch, ctx):
    """An empty history: every slot is 'before the sequence' (reads the pad id)."""
    c = self.config
    H, S = c.max_order - 1, c.conv_context
    return EngramDecodeState(ids_BxH=jnp.zeros((batch, H), jnp.int32),
                             ids_ok_BxH=jnp.zeros((batch, H), bool),
                             conv_BxSxD=jnp.zeros((batch, S, c.d_model), c.dtype))

  # --- evaluation statistics -------------------------------------------------------

  def metric_sums(self, aux, valid_BxT, segment_ids_BxT=None):
    """Per order n: `read_o<n>_max`, a [Σ_h p_n,h] indicator of the rows read by a
    valid token (merged by max across batches), and `tokens`."""
    c = self.config
    rows = aux["rows"]
    ok = (jnp.ones(rows.shape[:2], bool) if valid_BxT is None else valid_BxT.astype(bool))
    out = {"tokens": jnp.sum(ok.astype(jnp.float32))}
    for i, n in enumerate(c.orders):
      first, size = self.offsets[i * c.heads], sum(self.primes[i])
      local = rows[..., i * c.heads:(i + 1) * c.heads] - first
      hit = jnp.broadcast_to(ok[..., None], local.shape).astype(jnp.float32)
      out[f"read_o{n}_max"] = jnp.zeros((size,), jnp.float32).at[local.reshape(-1)].max(
          hit.reshape(-1))
    return out

  @staticmethod
  def summarise_metrics(sums):
    """slot_usage_o<n>: share of order n's rows read at least once; slot_usage: all."""
    out, read, total = {}, 0.0, 0
    for key, value in sorted(sums.items()):
      if key.startswith("read_o") and key.endswith("_max"):
        order = key.removeprefix("read_o").removesuffix("_max")
        v = np.asarray(value)
        out[f"slot_usage_o{order}"] = float(np.mean(v > 0))
        read, total = read + float(np.sum(v > 0)), total + v.size
    if total:
      out["slot_usage"] = read / total
    return out


def param_count(config: EngramConfig) -> dict[str, int]:
  """Parameters of one layer.

  total:  every parameter, the table included.
  active: what one token touches: every dense parameter (W_k, b_k, the norms,
          W_v, b_v, the conv) plus one table row per order and head (D_en).
  """
  c = config
  d, De = c.d_model, c.memory_dim
  table = sum(p for order in head_primes(c) for p in order) * c.head_dim
  dense = 2 * (De * d + d) + 3 * d + c.conv_kernel * d   # W_k,b_k,W_v,b_v; 3 norms; conv
  return {"total": table + dense, "active": dense + De, "tables": table, "dense": dense}


NAME = "engram"
SLOT = "memory"
CONFIG = EngramConfig
MODULE = Engram
