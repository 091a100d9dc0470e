"""Sampling from a VLM with the KV cache and the per-layer visual caches.

One jitted program: prefill [image | prompt] once (the visual caches are
computed there, once per image), then one `decode_step` per new token in a
`lax.scan`. Step i draws with fold_in(rng, i). Returns the new tokens and
their log-probabilities under the sampling distribution's logits (the
untempered policy's log-softmax, what GRPO needs as its old log-probs).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.generate import sample_logits


def generate(model, images_BxHxWx3, prompt_BxT, prompt_lengths_B, *, max_new_tokens: int, rng,
             temperature: float = 1.0, greedy: bool = False):
  """(tokens int32 [B, N], logp float32 [B, N]) for N = max_new_tokens."""
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1.")
  if not greedy and temperature <= 0:
    raise ValueError(f"generate: temperature={temperature} must be > 0 (or greedy=True).")
  c = model.config
  S = c.n_visual + prompt_BxT.shape[1] + max_new_tokens
  if S > c.lm.max_len:
    raise ValueError(f"generate: Nv + prompt + max_new_tokens = {S} exceeds lm.max_len="
                     f"{c.lm.max_len}.")
  graphdef, state = nnx.split(model)
  return _generate(graphdef, state, jnp.asarray(images_BxHxWx3),
                   jnp.asarray(prompt_BxT, jnp.int32), jnp.asarray(prompt_lengths_B, jnp.int32),
                   rng, jnp.asarray(temperature, jnp.float32), max_new_tokens=max_new_tokens,
                   greedy=greedy)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy"))
def _generate(graphdef, state, images, prompt_BxT, lengths_B, rng, temperature, *,
              max_new_tokens, greedy):
  model = nnx.merge(graphdef, state)
  B, T = prompt_BxT.shape
  Nv = model.config.n_visual
  logits_BxSxV, cache, vcaches = model.prefill(images, prompt_BxT, lengths=lengths_B,
                                               cache_len=Nv + T + max_new_tokens)
  logits_BxV = logits_BxSxV[jnp.arange(B), Nv + lengths_B - 1]

  def step(carry, i):
    logits_BxV, cache = carry
    token_B = sample_logits(logits_BxV, jax.random.fold_in(rng, i), temperature=temperature,
                            greedy=greedy)
    logp_BxV = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), axis=-1)
    logp_B = jnp.take_along_axis(logp_BxV, token_B[:, None], axis=1)[:, 0]
    logits_BxV, cache = model.decode_step(token_B[:, None], cache, vcaches)
    return (logits_BxV, cache), (token_B, logp_B)

  _, (tokens_NxB, logp_NxB) = jax.lax.scan(step, (logits_BxV, cache),
                                           jnp.arange(max_new_tokens))
  return tokens_NxB.T, logp_NxB.T


def completion_mask(tokens_BxN, eos: int = 0):
  """True up to and including the first EOS of each row."""
  is_eos = tokens_BxN == eos
  before_BxN = jnp.cumsum(is_eos, axis=1) - is_eos.astype(jnp.int32) == 0
  return before_BxN
