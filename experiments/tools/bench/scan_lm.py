"""The decoder of the efficiency benchmark (`lm_efficiency`): the paper's Table 12 rows
as `LMConfig`s, a `DecoderLM` of them with live Lngram branches, and that model as
pure functions of its parameters.

`build_lm(config, scan=True)` is the repository's `DecoderLM` with its runs of dense
blocks as one `lax.scan` each over stacked weights (`DecoderLM(scan=True)`: a program
compiles five block bodies, not 28, so the whole benchmark's compile time fits a short
GPU run); `scan=False` is the same model unrolled, the reference the scanned timings
are checked against (`lm_efficiency --loop-check`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.configs import CONFIG_DIR, load_config
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


def build_lm(config: LMConfig, seed: int = 0, *, scan: bool = False) -> DecoderLM:
  """A random DecoderLM whose Lngram branches (if any) add a nonzero delta.

  W_O and the conv taps are zero at init (the branch would add nothing, though
  it still costs its compute); as `liven_lngram`, drawn in the parameter dtype.
  The weights do not depend on `scan`.
  """
  lm = DecoderLM(config, rngs=nnx.Rngs(seed), scan=scan)
  for block, (i, _) in zip(lm.blocks, lm.layer_spans, strict=True):
    if i not in config.memory_layers:
      continue
    mem = block.memory
    k1, k2 = jax.random.split(jax.random.key(seed + 100 + i))
    mem.w_o[...] = (0.02 * jax.random.normal(k1, mem.w_o.shape)).astype(mem.w_o[...].dtype)
    mem.conv_kernel[...] = (0.5 * jax.random.normal(k2, mem.conv_kernel.shape)).astype(
        mem.conv_kernel[...].dtype)
  return lm


class PureLM:
  """A `DecoderLM` (scanned or unrolled) as pure functions of `params` (jit-friendly):

    forward(params, tokens_BxT)              -> logits_BxTxV (uncached)
    prefill(params, tokens_BxT, cache_len)   -> (logits_BxV at the last token, cache)
    decode(params, cache, token_B, steps)    -> (tokens_BxN, logits_NxBxV, cache), greedy
  """

  def __init__(self, lm: DecoderLM):
    self.config = lm.config
    self.static, self.params = nnx.split(lm)

  def forward(self, params, tokens_BxT):
    return nnx.merge(self.static, params)(tokens_BxT)

  def prefill(self, params, tokens_BxT, cache_len: int):
    """Full prompts (every row T real tokens)."""
    logits_BxTxV, cache = nnx.merge(self.static, params).prefill(tokens_BxT, cache_len=cache_len)
    return logits_BxTxV[:, -1], cache

  def decode(self, params, cache, token_B, steps: int):
    """`steps` greedy steps from token_B in one scan; the logits of each step's input."""
    model = nnx.merge(self.static, params)

    def step(carry, _):
      token_B, cache = carry
      logits_BxV, cache = model.decode_step(token_B[:, None], cache)
      next_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
      return (next_B, cache), (next_B, logits_BxV)

    (_, cache), (tokens_NxB, logits_NxBxV) = jax.lax.scan(step, (token_B, cache), None,
                                                          length=steps)
    return tokens_NxB.T, logits_NxBxV, cache
