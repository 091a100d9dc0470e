"""Sampling from a `DecoderLM`: greedy, temperature and top-k, with or without cache.

Both paths run as one jitted program (nnx.split outside, nnx.merge inside,
the steps in `lax.scan`):
  cached    prefill once, then one `decode_step` per new token;
  uncached  the slow reference: every step reruns the full forward over a
            fixed-size buffer (prompt + new tokens) and reads the logits at
            each row's last real token. Causality makes the unfilled tail
            irrelevant, so one compiled shape serves all steps.
Step i draws with `fold_in(rng, i)` in both paths, so with equal logits they
draw equal tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx


def sample_logits(logits_BxV, rng, *, temperature=1.0, top_k=None, greedy=False):
  """One token per row (int32 [B]).

  top_k samples among exactly the k largest logits (`lax.top_k` indices), so
  ties at the k-th value never let a (k+1)-th token in.
  """
  logits_BxV = logits_BxV.astype(jnp.float32)
  if greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  scaled_BxV = logits_BxV / jnp.asarray(temperature, jnp.float32)
  if top_k is None:
    return jax.random.categorical(rng, scaled_BxV, axis=-1).astype(jnp.int32)
  top_BxK, idx_BxK = jax.lax.top_k(scaled_BxV, top_k)
  choice_B = jax.random.categorical(rng, top_BxK, axis=-1)
  return jnp.take_along_axis(idx_BxK, choice_B[:, None], axis=1)[:, 0].astype(jnp.int32)


def generate(model, prompt_tokens_BxT, *, prompt_lengths=None, max_new_tokens: int, rng,
             temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
             use_cache: bool = True):
  """Continues each (right-padded) prompt by `max_new_tokens` tokens.

  Args:
    model: a `DecoderLM`.
    prompt_tokens_BxT: int prompts, right-padded to a common length T.
    prompt_lengths: int [B] real prompt tokens per row, each >= 1 (default T).
    max_new_tokens: tokens to generate per row.
    rng: a PRNG key (unused when greedy).
    temperature, top_k, greedy: the sampler (see `sample_logits`).
    use_cache: KV cache + Lngram decode state (fast) or full recompute (slow).

  Returns:
    int32 [B, max_new_tokens], the new tokens of each row.
  """
  c = model.config
  prompt_tokens_BxT = jnp.asarray(prompt_tokens_BxT, jnp.int32)
  B, T = prompt_tokens_BxT.shape
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1.")
  if T + max_new_tokens > c.max_len:
    raise ValueError(
        f"generate: prompt length {T} + max_new_tokens={max_new_tokens} exceeds "
        f"max_len={c.max_len}.")
  if top_k is not None and not 1 <= top_k <= c.vocab_size:
    raise ValueError(f"generate: top_k={top_k} must be in [1, vocab_size={c.vocab_size}].")
  if not greedy and temperature <= 0:
    raise ValueError(f"generate: temperature={temperature} must be > 0 (or greedy=True).")
  lengths_B = (jnp.full((B,), T, jnp.int32) if prompt_lengths is None
               else jnp.asarray(prompt_lengths, jnp.int32))
  if lengths_B.shape != (B,):
    raise ValueError(f"generate: prompt_lengths must have shape ({B},); got {lengths_B.shape}.")
  graphdef, state = nnx.split(model)
  run = _generate_cached if use_cache else _generate_uncached
  return run(graphdef, state, prompt_tokens_BxT, lengths_B, rng,
             jnp.asarray(temperature, jnp.float32), max_new_tokens=max_new_tokens,
             top_k=top_k, greedy=greedy)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "top_k", "greedy"))
def _generate_cached(graphdef, state, prompt_BxT, lengths_B, rng, temperature, *,
                     max_new_tokens, top_k, greedy):
  model = nnx.merge(graphdef, state)
  B, T = prompt_BxT.shape
  logits_BxTxV, cache = model.prefill(prompt_BxT, lengths=lengths_B,
                                      cache_len=T + max_new_tokens)
  logits_BxV = logits_BxTxV[jnp.arange(B), lengths_B - 1]

  def step(carry, i):
    logits_BxV, cache = carry
    token_B = sample_logits(logits_BxV, jax.random.fold_in(rng, i),
                            temperature=temperature, top_k=top_k, greedy=greedy)
    logits_BxV, cache = model.decode_step(token_B[:, None], cache)
    return (logits_BxV, cache), token_B

  # The last step's decode is wasted work; it keeps the scan body uniform.
  _, tokens_NxB = jax.lax.scan(step, (logits_BxV, cache), jnp.arange(max_new_tokens))
  return tokens_NxB.T


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "top_k", "greedy"))
def _generate_uncached(graphdef, state, prompt_BxT, lengths_B, rng, temperature, *,
                       max_new_tokens, top_k, greedy):
  model = nnx.merge(graphdef, state)
  B, T = prompt_BxT.shape
  S = T + max_new_tokens
  rows_B = jnp.arange(B)
  buffer_BxS = jnp.pad(prompt_BxT, ((0, 0), (0, max_new_tokens)))
  # Padding between a short prompt and the buffer end is overwritten in order.
  buffer_BxS = jnp.where(jnp.arange(S)[None, :] < lengths_B[:, None], buffer_BxS, 0)

  def step(buffer_BxS, i):
    length_B = lengths_B + i
    valid_BxS = jnp.arange(S)[None, :] < length_B[:, None]
    logits_BxSxV = model(buffer_BxS, valid=valid_BxS)
    token_B = sample_logits(logits_BxSxV[rows_B, length_B - 1], jax.random.fold_in(rng, i),
                            temperature=temperature, top_k=top_k, greedy=greedy)
    return buffer_BxS.at[rows_B, length_B].set(token_B), token_B

  _, tokens_NxB = jax.lax.scan(step, buffer_BxS, jnp.arange(max_new_tokens))
  return tokens_NxB.T
