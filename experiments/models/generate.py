"""Sampling from a `DecoderLM` or a VLM: greedy, temperature and top-k, with or without cache.

One `generate` serves both: with `images` the model is a VLM (experiments/vlm)
whose sequence is [Nv image tokens | prompt | new tokens]. Both paths run as
one jitted program (nnx.split outside, nnx.merge inside, the steps in
`lax.scan`):
  cached    prefill once (for the VLM this builds the PVM branches' visual
            caches, once per image), then one `decode_step` per new token;
  uncached  the slow reference: every step reruns the full forward over a
            fixed-size buffer (prompt + new tokens) and reads the logits at
            each row's last real token. Causality makes the unfilled tail
            irrelevant, so one compiled shape serves all steps.
Step i draws with `fold_in(rng, i)` in both paths, so with equal logits they
draw equal tokens. With `return_logp` each token's log-probability under the
untempered policy (log-softmax of the logits; GRPO's old log-probs) comes too.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lngram_jax import history


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


def completion_mask(tokens_BxN, eos: int = 0):
  """True up to and including the first EOS of each row."""
  is_eos = tokens_BxN == eos
  return jnp.cumsum(is_eos, axis=1) - is_eos.astype(jnp.int32) == 0


def generate(model, prompt_tokens_BxT, *, prompt_lengths=None, max_new_tokens: int, rng,
             temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
             use_cache: bool = True, images=None, return_logp: bool = False):
  """Continues each (right-padded) prompt by `max_new_tokens` tokens.

  Args:
    model: a `DecoderLM`, or a VLM (then `images` is required).
    prompt_tokens_BxT: int prompts, right-padded to a common length T.
    prompt_lengths: int [B] real prompt tokens per row, each >= 1 (default T).
    max_new_tokens: tokens to generate per row.
    rng: a PRNG key (unused when greedy).
    temperature, top_k, greedy: the sampler (see `sample_logits`).
    use_cache: KV cache + branch decode states (fast) or full recompute (slow).
    images: uint8 [B, H, W, 3] for a VLM; None for an LM.
    return_logp: also return the log-probabilities of the drawn tokens.

  Returns:
    int32 [B, max_new_tokens], the new tokens of each row; with `return_logp`
    (tokens, logp float32 [B, max_new_tokens]).
  """
  is_vlm = hasattr(model, "lm")
  if is_vlm != (images is not None):
    raise ValueError("generate: pass images= for a VLM and only for a VLM "
                     f"(got a {type(model).__name__} and images={images is not None}).")
  lm_config = model.lm.config if is_vlm else model.config
  n_prefix = model.config.n_visual if is_vlm else 0
  prompt_tokens_BxT = jnp.asarray(prompt_tokens_BxT, jnp.int32)
  B, T = prompt_tokens_BxT.shape
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1.")
  if n_prefix + T + max_new_tokens > lm_config.max_len:
    raise ValueError(
        f"generate: {'Nv + ' if is_vlm else ''}prompt length {n_prefix + T} + "
        f"max_new_tokens={max_new_tokens} exceeds max_len={lm_config.max_len}.")
  if top_k is not None and not 1 <= top_k <= lm_config.vocab_size:
    raise ValueError(
        f"generate: top_k={top_k} must be in [1, vocab_size={lm_config.vocab_size}].")
  if not greedy and not (temperature > 0 and math.isfinite(temperature)):   # NaN fails `> 0`
    raise ValueError(f"generate: temperature={temperature} must be a finite number > 0 (or "
                     "greedy=True).")
  if prompt_lengths is not None and not hasattr(prompt_lengths, "shape"):
    prompt_lengths = np.asarray(prompt_lengths)
  if prompt_lengths is not None and tuple(prompt_lengths.shape) != (B,):
    raise ValueError(f"generate: prompt_lengths must have shape ({B},); got "
                     f"{tuple(prompt_lengths.shape)}.")
  # Integers in [1, T] (a VLM's may be 0: its image comes first), checked here
  # while they are concrete: each row continues after its last real prompt
  # token, and a length past T would read clipped positions.
  lengths_B, _ = history.prompt_lengths(B, T, prompt_lengths, minimum=0 if n_prefix else 1)
  graphdef, state = nnx.split(model)
  run = _generate_cached if use_cache else _generate_uncached
  tokens_BxN, logp_BxN = run(
      graphdef, state, prompt_tokens_BxT, lengths_B,
      None if images is None else jnp.asarray(images), rng,
      jnp.asarray(temperature, jnp.float32), max_new_tokens=max_new_tokens, top_k=top_k,
      greedy=greedy, n_prefix=n_prefix, return_logp=return_logp)
  return (tokens_BxN, logp_BxN) if return_logp else tokens_BxN


def draw(logits_BxV, rng, i, temperature, top_k, greedy, return_logp):
  """Token of step i (drawn with fold_in(rng, i)) and, when asked, its log-probability
  under the raw logits: the one draw of every sampler (experiments/vlm/qwen3vl too)."""
  token_B = sample_logits(logits_BxV, jax.random.fold_in(rng, i), temperature=temperature,
                          top_k=top_k, greedy=greedy)
  if not return_logp:
    return token_B, None
  logp_BxV = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), axis=-1)
  return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], axis=1)[:, 0]


_STATIC = ("graphdef", "max_new_tokens", "top_k", "greedy", "n_prefix", "return_logp")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _generate_cached(graphdef, state, prompt_BxT, lengths_B, images, rng, temperature, *,
                     max_new_tokens, top_k, greedy, n_prefix, return_logp):
  model = nnx.merge(graphdef, state)
  B, T = prompt_BxT.shape
  cache_len = n_prefix + T + max_new_tokens
  if images is None:
    logits_BxTxV, cache = model.prefill(prompt_BxT, lengths=lengths_B, cache_len=cache_len)
  else:
    logits_BxTxV, cache = model.prefill(images, prompt_BxT, lengths=lengths_B,
                                        cache_len=cache_len)
  logits_BxV = logits_BxTxV[jnp.arange(B), n_prefix + lengths_B - 1]

  def step(carry, i):
    logits_BxV, cache = carry
    token_B, logp_B = draw(logits_BxV, rng, i, temperature, top_k, greedy, return_logp)
    logits_BxV, cache = model.decode_step(token_B[:, None], cache)
    return (logits_BxV, cache), (token_B, logp_B)

  # The last step's decode is wasted work; it keeps the scan body uniform.
  _, (tokens_NxB, logp_NxB) = jax.lax.scan(step, (logits_BxV, cache),
                                           jnp.arange(max_new_tokens))
  return tokens_NxB.T, None if logp_NxB is None else logp_NxB.T


@functools.partial(jax.jit, static_argnames=_STATIC)
def _generate_uncached(graphdef, state, prompt_BxT, lengths_B, images, rng, temperature, *,
                       max_new_tokens, top_k, greedy, n_prefix, return_logp):
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
    if images is None:
      logits_BxSxV = model(buffer_BxS, valid=valid_BxS)
    else:
      logits_BxSxV = model(images, buffer_BxS, valid=valid_BxS)
    token_B, logp_B = draw(logits_BxSxV[rows_B, n_prefix + length_B - 1], rng, i,
                           temperature, top_k, greedy, return_logp)
    return buffer_BxS.at[rows_B, length_B].set(token_B), (token_B, logp_B)

  _, (tokens_NxB, logp_NxB) = jax.lax.scan(step, buffer_BxS, jnp.arange(max_new_tokens))
  return tokens_NxB.T, None if logp_NxB is None else logp_NxB.T
