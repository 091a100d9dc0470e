"""The decoder of the efficiency benchmark (`lm_efficiency`): the paper's Table 12 rows
as `LMConfig`s, and two runnable forms of one `DecoderLM` with the same weights.

`ScanLM` runs each stretch of dense blocks between memory layers as a `lax.scan`
over stacked weights (a program compiles five block bodies, not 28: the whole
benchmark's compile time fits a short GPU run); `LoopLM` is the repository's
unrolled `DecoderLM` behind the same interface, the reference the scanned timings
are checked against (`lm_efficiency --loop-check`) and the twin its test compares
outputs with.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.configs import CONFIG_DIR, load_config
from experiments.models.branches import BranchContext
from experiments.models.cache import LayerCache
from experiments.models.config import LMConfig
from experiments.models.lm import DecoderLM
from lngram_jax.config import LngramConfig

BACKBONE = dict(d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                ffn_dim=6144, vocab_size=256, memory_layers=(1, 13), dtype="bfloat16")
# --smoke: seconds on a 2-core CPU. Lngram keeps each row's bits and KV heads; routes
# are capped at 16 and the memory/head dim is 8 (r512/mem256 alone would be 1.1B
# parameters otherwise).
SMOKE_BACKBONE = dict(d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                      ffn_dim=192, vocab_size=256, memory_layers=(1, 2), dtype="bfloat16")
# Keye2B's Lngram v2 (paper Table 13), before a row's name overrides it.
PAPER_DEFAULTS = "r121,m4,kv16,mem128"

# --- configurations ------------------------------------------------------------


def lngram_config(name: str, d_model: int, *, smoke: bool = False, readout: str = "absorbed",
                  dtype="bfloat16") -> LngramConfig:
  """The Lngram v2 config of a Table 12 row name such as 'r23/m4/KV8/mem256'.

  The name goes through lm_lngram.py's parser (r<R>, m<M>, kv<H>, mem<Dm>,
  case-insensitive, '/' or ',' between parts) after the paper's Keye2B
  defaults, so a part it leaves out keeps the paper's value.
  """
  parts = name.lower().replace("/", ",")
  m = load_config(f"{CONFIG_DIR / 'lm_lngram.py'}:{PAPER_DEFAULTS},{parts}").model.memory
  routes, mem_dim, head_dim = m.routes, m.mem_dim, m.head_dim
  if smoke:
    routes, mem_dim, head_dim = min(routes, 16), 8, 8
  return LngramConfig(
      d_model=d_model, routes=routes, bits=m.bits, orders=tuple(m.orders), mem_dim=mem_dim,
      q_heads=16, kv_heads=m.kv_heads, head_dim=head_dim, sink=m.get("sink", True),
      conv_kernel=4, conv_dilation=3, readout=readout, dtype=dtype, param_dtype=dtype)


def lm_config(name: str, *, smoke: bool = False, readout: str = "absorbed", max_len: int = 2048,
              overrides: dict | None = None) -> LMConfig:
  """The backbone (BACKBONE or SMOKE_BACKBONE + overrides) with the row's Lngram."""
  b = {**(SMOKE_BACKBONE if smoke else BACKBONE), **(overrides or {})}
  memory_layers = tuple(b.pop("memory_layers"))
  dtype = b.pop("dtype")
  memory = None
  if name != "baseline":
    memory = lngram_config(name, b["d_model"], smoke=smoke, readout=readout, dtype=dtype)
  return LMConfig(**b, max_len=max_len, dtype=dtype, param_dtype=dtype,
                  memory_layers=memory_layers if memory else (), memory=memory)


def build_lm(config: LMConfig, seed: int = 0) -> DecoderLM:
  """A random DecoderLM whose Lngram branches (if any) add a nonzero delta.

  W_O and the conv taps are zero at init (the branch would add nothing, though
  it still costs its compute); as `liven_lngram`, drawn in the parameter dtype.
  """
  lm = DecoderLM(config, rngs=nnx.Rngs(seed))
  for i in config.memory_layers:
    mem = lm.blocks[i].memory
    k1, k2 = jax.random.split(jax.random.key(seed + 100 + i))
    mem.w_o[...] = (0.02 * jax.random.normal(k1, mem.w_o.shape)).astype(mem.w_o[...].dtype)
    mem.conv_kernel[...] = (0.5 * jax.random.normal(k2, mem.conv_kernel.shape)).astype(
        mem.conv_kernel[...].dtype)
  return lm


# --- the scanned model ---------------------------------------------------------


def segments(n_layers: int, memory_layers) -> tuple:
  """(('dense', start, stop) | ('memory', layer), ...) in layer order."""
  out, start = [], 0
  for i in sorted(memory_layers):
    if i > start:
      out.append(("dense", start, i))
    out.append(("memory", i))
    start = i + 1
  if start < n_layers:
    out.append(("dense", start, n_layers))
  return tuple(out)


class ScanLM:
  """A `DecoderLM` whose runs of dense blocks execute as `lax.scan` over stacked weights.

  Same weights, same math: every block is the repository's `Block`, in every
  mode; in decode, a dense block reads and returns its slice of the stacked K/V
  cache that the scan carries. Memory blocks run unscanned. Pure functions of `params` (jit-friendly):
    forward(params, tokens_BxT)                 -> logits_BxTxV (uncached)
    prefill(params, tokens_BxT, cache_len)      -> (logits_BxV at the last token, cache)
    decode(params, cache, token_B, steps)       -> (tokens_BxN, logits_NxBxV, cache), greedy
  """

  def __init__(self, lm: DecoderLM):
    c = lm.config
    if not c.tie_embeddings:
      raise ValueError("ScanLM: the benchmark backbone ties its embeddings.")
    self.config = c
    self.segments = segments(c.n_layers, c.memory_layers)
    embed_gd, embed_st = nnx.split(lm.embed)
    norm_gd, norm_st = nnx.split(lm.final_norm)
    graphdefs, states = [], []
    for seg in self.segments:
      if seg[0] == "dense":
        split = [nnx.split(lm.blocks[i]) for i in range(seg[1], seg[2])]
        graphdefs.append(split[0][0])
        states.append(jax.tree.map(lambda *xs: jnp.stack(xs), *[s for _, s in split]))
      else:
        gd, st = nnx.split(lm.blocks[seg[1]])
        graphdefs.append(gd)
        states.append(st)
    self.static = (embed_gd, norm_gd, tuple(graphdefs))
    self.params = {"embed": embed_st, "final_norm": norm_st, "segments": tuple(states)}

  # All three are pure in `params`; `self` only contributes static structure.

  def _logits(self, params, x_BxTxD):
    embed = nnx.merge(self.static[0], params["embed"])
    norm = nnx.merge(self.static[1], params["final_norm"])
    return embed.attend(norm(x_BxTxD))

  def forward(self, params, tokens_BxT):
    B, T = tokens_BxT.shape
    x_BxTxD = nnx.merge(self.static[0], params["embed"])(tokens_BxT)
    positions_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    ctx = BranchContext(tokens_BxT=tokens_BxT)

    def run(block, x_BxTxD):
      return block(x_BxTxD, ctx, mode="parallel", positions_BxT=positions_BxT)[0]

    for seg, gd, st in zip(self.segments, self.static[2], params["segments"], strict=True):
      if seg[0] == "dense":
        x_BxTxD, _ = jax.lax.scan(lambda x, s, gd=gd: (run(nnx.merge(gd, s), x), None),
                                  x_BxTxD, st)
      else:
        x_BxTxD = run(nnx.merge(gd, st), x_BxTxD)
    return self._logits(params, x_BxTxD)

  def prefill(self, params, tokens_BxT, cache_len: int):
    """Full prompts (every row T real tokens), as `DecoderLM.prefill(lengths=None)`."""
    B, T = tokens_BxT.shape
    x_BxTxD = nnx.merge(self.static[0], params["embed"])(tokens_BxT)
    positions_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    lengths_B = jnp.full((B,), T, jnp.int32)
    valid_BxT = jnp.ones((B, T), bool)
    ctx = BranchContext(tokens_BxT=tokens_BxT, valid_BxT=valid_BxT, lengths_B=lengths_B)

    def run(block, x_BxTxD):
      return block(x_BxTxD, ctx, mode="prefill", positions_BxT=positions_BxT,
                   cache_len=cache_len)

    layers = []
    for seg, gd, st in zip(self.segments, self.static[2], params["segments"], strict=True):
      if seg[0] == "dense":
        def body(x_BxTxD, s, gd=gd):
          x_BxTxD, lc = run(nnx.merge(gd, s), x_BxTxD)
          return x_BxTxD, (lc.k_BxSxHkvxDh, lc.v_BxSxHkvxDh)
        x_BxTxD, kv = jax.lax.scan(body, x_BxTxD, st)
        layers.append(kv)
      else:
        x_BxTxD, lc = run(nnx.merge(gd, st), x_BxTxD)
        layers.append(lc)
    cache = {"layers": tuple(layers), "index_B": lengths_B, "position_B": lengths_B,
             "key_ok_BxS": jnp.pad(valid_BxT, ((0, 0), (0, cache_len - T)))}
    return self._logits(params, x_BxTxD[:, -1:])[:, 0], cache

  def decode_step(self, params, token_B, cache):
    """One token per row against the cache: (logits_BxV, next cache)."""
    B = token_B.shape[0]
    tokens_Bx1 = token_B[:, None]
    rows_B = jnp.arange(B)
    index_B = cache["index_B"]
    key_ok_BxS = cache["key_ok_BxS"].at[rows_B, index_B].set(True)
    positions_Bx1 = cache["position_B"][:, None]
    ctx = BranchContext(tokens_BxT=tokens_Bx1)
    x_Bx1xD = nnx.merge(self.static[0], params["embed"])(tokens_Bx1)
    layers = []
    for seg, gd, st, lc in zip(self.segments, self.static[2], params["segments"],
                               cache["layers"], strict=True):
      if seg[0] == "dense":
        def body(carry, xs, gd=gd):
          # The repository's Block in decode mode on layer i's slice of the stacked
          # cache; the updated slice goes back into the stack in the carry.
          x_Bx1xD, k_LxBxSxHxDh, v_LxBxSxHxDh = carry
          s, i = xs
          layer_cache = LayerCache(k_BxSxHkvxDh=k_LxBxSxHxDh[i], v_BxSxHkvxDh=v_LxBxSxHxDh[i],
                                   memory_state=None, ffn_branch_state=None)
          x_Bx1xD, layer_cache = nnx.merge(gd, s)(
              x_Bx1xD, ctx, mode="decode", positions_BxT=positions_Bx1, cache=layer_cache,
              index_B=index_B, key_ok_BxS=key_ok_BxS)
          k_LxBxSxHxDh = k_LxBxSxHxDh.at[i].set(layer_cache.k_BxSxHkvxDh)
          v_LxBxSxHxDh = v_LxBxSxHxDh.at[i].set(layer_cache.v_BxSxHkvxDh)
          return (x_Bx1xD, k_LxBxSxHxDh, v_LxBxSxHxDh), None

        n = seg[2] - seg[1]
        (x_Bx1xD, k, v), _ = jax.lax.scan(body, (x_Bx1xD, *lc),
                                          (st, jnp.arange(n, dtype=jnp.int32)))
        layers.append((k, v))
      else:
        x_Bx1xD, lc = nnx.merge(gd, st)(x_Bx1xD, ctx, mode="decode",
                                        positions_BxT=positions_Bx1, cache=lc,
                                        index_B=index_B, key_ok_BxS=key_ok_BxS)
        layers.append(lc)
    cache = {"layers": tuple(layers), "index_B": index_B + 1,
             "position_B": cache["position_B"] + 1, "key_ok_BxS": key_ok_BxS}
    return self._logits(params, x_Bx1xD)[:, 0], cache

  def decode(self, params, cache, token_B, steps: int):
    """`steps` greedy steps from token_B; the logits of each step's input token."""
    def step(carry, _):
      token_B, cache = carry
      logits_BxV, cache = self.decode_step(params, token_B, cache)
      next_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
      return (next_B, cache), (next_B, logits_BxV)

    (_, cache), (tokens_NxB, logits_NxBxV) = jax.lax.scan(step, (token_B, cache), None,
                                                          length=steps)
    return tokens_NxB.T, logits_NxBxV, cache


class LoopLM:
  """The repository's `DecoderLM` (28 unrolled blocks) behind ScanLM's interface."""

  def __init__(self, lm: DecoderLM):
    self.config = lm.config
    self.static, self.params = nnx.split(lm)

  def forward(self, params, tokens_BxT):
    return nnx.merge(self.static, params)(tokens_BxT)

  def prefill(self, params, tokens_BxT, cache_len: int):
    logits_BxTxV, cache = nnx.merge(self.static, params).prefill(tokens_BxT, cache_len=cache_len)
    return logits_BxTxV[:, -1], cache

  def decode(self, params, cache, token_B, steps: int):
    model = nnx.merge(self.static, params)

    def step(carry, _):
      token_B, cache = carry
      logits_BxV, cache = model.decode_step(token_B[:, None], cache)
      next_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
      return (next_B, cache), (next_B, logits_BxV)

    (_, cache), (tokens_NxB, logits_NxBxV) = jax.lax.scan(step, (token_B, cache), None,
                                                          length=steps)
    return tokens_NxB.T, logits_NxBxV, cache
