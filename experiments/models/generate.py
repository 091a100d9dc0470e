"""One sampler for every model: the decoder LM, the tiny VLM and Qwen3-VL.

    generate(model, prompt, *, prompt_lengths, max_new_tokens, rng, temperature, top_k,
             greedy, use_cache, images, return_logp, eos_token_ids, pad_token_id,
             return_lengths)

A model takes part through a small protocol, each model class stating its own:

    model.decoder                          its `DecoderLM` (max_len, vocabulary)
    model.sampling_prompt(prompt, *, prompt_lengths, images) -> Prompt
        on the host: checks the model's own inputs and packs them as its prefill
        reads them: a right-padded token prompt (the LM), that and its images (the
        tiny VLM), a processor's batch: ids packed to the right, pixel values and
        multimodal positions (Qwen3-VL);
    model.prefill_prompt(prompt, *, cache_len) -> (logits_BxV, cache)
        traceable: the logits at each row's last prompt token and the decode cache
        (for a VLM the image is encoded once, here);
    model.decode_step(tokens_Bx1, cache) -> (logits_BxV, cache)
    model.prompt_logits(prompt, tokens_BxS, valid_BxS) -> logits [B, prefix + S, V]
        the full forward (the uncached twin; LM and tiny VLM).

Both paths run as one jitted program (nnx.split outside, nnx.merge inside):
  cached    the prefill, then `decode_loop`: a `lax.while_loop` over the one-token
            decode step, the cache in the carry, the new tokens written into fixed
            [B, N] buffers;
  uncached  the slow reference: every step reruns the full forward over a
            fixed-size buffer (prompt + new tokens) and reads the logits at
            each row's last real token. Causality makes the unfilled tail
            irrelevant, so one compiled shape serves all steps.
Step i draws with `fold_in(rng, i)` in both paths (`draw`), so with equal logits they
draw equal tokens. With `return_logp` each token's log-probability under the
untempered policy (log-softmax of the logits; GRPO's old log-probs) comes too.
With `eos_token_ids` a row that draws one of them is finished: the end token is kept,
every later token of that row is `pad_token_id` (log-probability 0), its length
counts the tokens up to and including the end token; the other rows go on, and the
cached loop exits as soon as every row is finished. Without them (the default) every
row runs to `max_new_tokens`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from lngram_jax import history


@struct.dataclass
class Prompt:
  """A batch of prompts as a model's prefill reads it (`model.sampling_prompt` builds it).

  tokens_BxT: int32 right-padded prompt tokens; lengths_B: int32 real tokens per row;
  inputs: whatever else the prefill reads (a pytree: the tiny VLM's images; Qwen3-VL's
  pixel values and positions); prefix: cache slots before the tokens (the tiny VLM's
  image tokens); static: hashable (name, value) pairs the prefill's program depends on
  (Qwen3-VL's image grids, visual width, mesh): part of the jit's cache key.
  """

  tokens_BxT: jax.Array
  lengths_B: jax.Array
  inputs: Any = None
  prefix: int = struct.field(pytree_node=False, default=0)
  static: tuple = struct.field(pytree_node=False, default=())


def right_padded_prompt(prompt_tokens_BxT, prompt_lengths, *, minimum: int):
  """(tokens int32 [B, T], lengths int32 [B]) of a right-padded token prompt.

  prompt_lengths: real tokens per row (default T), integers in [minimum, T], checked
  here while they are concrete: each row continues after its last real prompt
  token, and a length past T would read clipped positions."""
  tokens_BxT = jnp.asarray(prompt_tokens_BxT, jnp.int32)
  B, T = tokens_BxT.shape
  if prompt_lengths is not None and not hasattr(prompt_lengths, "shape"):
    prompt_lengths = np.asarray(prompt_lengths)
  if prompt_lengths is not None and tuple(prompt_lengths.shape) != (B,):
    raise ValueError(f"generate: prompt_lengths must have shape ({B},); got "
                     f"{tuple(prompt_lengths.shape)}.")
  lengths_B, _ = history.prompt_lengths(B, T, prompt_lengths, minimum=minimum)
  return tokens_BxT, lengths_B


def last_logits(logits_BxTxV, last_B):
  """float32 [B, V]: a prefill's logits at each row's last prompt position (`last_B`,
  the row's length counted from the sequence start)."""
  B = logits_BxTxV.shape[0]
  return logits_BxTxV[jnp.arange(B), jnp.asarray(last_B) - 1].astype(jnp.float32)


def end_ids(eos_token_ids) -> np.ndarray:
  """int32 [K] end-token ids from None (K = 0: no stop), an int or a sequence."""
  if eos_token_ids is None:
    return np.zeros((0,), np.int32)
  return np.asarray(np.atleast_1d(eos_token_ids), np.int32).reshape(-1)


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


def generate(model, prompt, *, prompt_lengths=None, max_new_tokens: int, rng=None,
             temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
             use_cache: bool = True, images=None, return_logp: bool = False,
             eos_token_ids=None, pad_token_id: int = 0, return_lengths: bool = False):
  """Continues each prompt by `max_new_tokens` tokens.

  Args:
    model: any model of the protocol (module docstring).
    prompt: what the model's prefill starts from: int prompts right-padded to a
      common length T (the LM, the tiny VLM), or a processor's dict (Qwen3-VL:
      rows padded on either side).
    prompt_lengths: int [B] real prompt tokens per row, each >= 1 (default T; a
      VLM's may be 0: its image comes first). Token prompts only.
    max_new_tokens: tokens to generate per row.
    rng: a PRNG key (unused when greedy).
    temperature, top_k, greedy: the sampler (see `sample_logits`).
    use_cache: KV cache + branch decode states (fast) or full recompute (slow).
    images: uint8 [B, H, W, 3] for the tiny VLM; None otherwise.
    return_logp: also return the log-probabilities of the drawn tokens.
    eos_token_ids: an id or ids that end a row (None: no stop); pad_token_id: what
      a finished row emits after its end token.
    return_lengths: also return each row's new tokens (its end token included).

  Returns:
    int32 [B, max_new_tokens], the new tokens of each row; with `return_logp` also
    logp float32 [B, max_new_tokens]; with `return_lengths` also int32 [B].
  """
  if max_new_tokens < 1:
    raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1.")
  lm_config = model.decoder.config
  if top_k is not None and not 1 <= top_k <= lm_config.vocab_size:
    raise ValueError(
        f"generate: top_k={top_k} must be in [1, vocab_size={lm_config.vocab_size}].")
  if not greedy and not (temperature > 0 and math.isfinite(temperature)):   # NaN fails `> 0`
    raise ValueError(f"generate: temperature={temperature} must be a finite number > 0 (or "
                     "greedy=True).")
  if not greedy and rng is None:
    raise ValueError("generate: pass rng= (or greedy=True).")
  packed = model.sampling_prompt(prompt, prompt_lengths=prompt_lengths, images=images)
  T = packed.tokens_BxT.shape[1]
  if packed.prefix + T + max_new_tokens > lm_config.max_len:
    raise ValueError(
        f"generate: {'Nv + ' if packed.prefix else ''}prompt length {packed.prefix + T} + "
        f"max_new_tokens={max_new_tokens} exceeds max_len={lm_config.max_len}.")
  graphdef, state = nnx.split(model)
  run = _generate_cached if use_cache else _generate_uncached
  tokens_BxN, logp_BxN, lengths_B = run(
      graphdef, state, packed, jax.random.key(0) if rng is None else rng,
      jnp.asarray(temperature, jnp.float32), jnp.asarray(end_ids(eos_token_ids)),
      max_new_tokens=max_new_tokens, pad_token_id=int(pad_token_id), top_k=top_k,
      greedy=greedy, return_logp=return_logp)
  out = (tokens_BxN,) + ((logp_BxN,) if return_logp else ()) + (
      (lengths_B,) if return_lengths else ())
  return out if len(out) > 1 else out[0]


def draw(logits_BxV, rng, i, temperature, top_k, greedy, return_logp):
  """Token of step i (drawn with fold_in(rng, i)) and, when asked, its log-probability
  under the raw logits: the one draw of every sampler."""
  token_B = sample_logits(logits_BxV, jax.random.fold_in(rng, i), temperature=temperature,
                          top_k=top_k, greedy=greedy)
  if not return_logp:
    return token_B, None
  logp_BxV = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), axis=-1)
  return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], axis=1)[:, 0]


def decode_loop(model, logits_BxV, cache, rng, temperature, eos_K, *, max_new_tokens: int,
                pad_token_id: int = 0, top_k: int | None = None, greedy: bool = False,
                return_logp: bool = False, constrain=None):
  """(tokens int32 [B, N], logp float32 [B, N] or None, lengths int32 [B], steps int32):
  N = max_new_tokens tokens drawn from `logits_BxV` (the prefill's last logits) on, one
  `model.decode_step` per token, in one `lax.while_loop` (traceable).

  Step i draws with fold_in(rng, i). A row is finished once it drew a token of
  `eos_K` (int32 [K]; K = 0: never): it then emits `pad_token_id` with log-probability
  0 and its length stops growing (the end token counts). The loop stops after N steps
  or when every row is finished (`steps`: the steps it ran). Finished rows still go
  through the decode step (fixed shapes); what they compute is discarded, and so is
  the last step's decode (it keeps the body uniform).
  `constrain`: applied to the cache after each step (the plan's sharding constraint)."""
  B, N = logits_BxV.shape[0], max_new_tokens
  constrain = constrain or (lambda c: c)
  eos_K = jnp.asarray(eos_K, jnp.int32)

  def cond(carry):
    i, done_B = carry[0], carry[3]
    return (i < N) & ~jnp.all(done_B)

  def body(carry):
    i, logits_BxV, cache, done_B, tokens_BxN, logp_BxN, lengths_B = carry
    token_B, logp_B = draw(logits_BxV, rng, i, temperature, top_k, greedy, return_logp)
    token_B = jnp.where(done_B, pad_token_id, token_B).astype(jnp.int32)
    tokens_BxN = jax.lax.dynamic_update_slice(tokens_BxN, token_B[:, None], (0, i))
    if return_logp:
      logp_B = jnp.where(done_B, 0.0, logp_B).astype(jnp.float32)
      logp_BxN = jax.lax.dynamic_update_slice(logp_BxN, logp_B[:, None], (0, i))
    lengths_B = lengths_B + (~done_B).astype(jnp.int32)
    done_B = done_B | (token_B[:, None] == eos_K[None, :]).any(axis=1)
    logits_BxV, cache = model.decode_step(token_B[:, None], cache)
    return (i + 1, logits_BxV.astype(jnp.float32), constrain(cache), done_B, tokens_BxN,
            logp_BxN, lengths_B)

  init = (jnp.int32(0), logits_BxV.astype(jnp.float32), constrain(cache),
          jnp.zeros((B,), bool), jnp.full((B, N), pad_token_id, jnp.int32),
          jnp.zeros((B, N if return_logp else 0), jnp.float32), jnp.zeros((B,), jnp.int32))
  steps, _, _, _, tokens_BxN, logp_BxN, lengths_B = jax.lax.while_loop(cond, body, init)
  return tokens_BxN, logp_BxN if return_logp else None, lengths_B, steps


def prefill_and_decode(model, prompt: Prompt, rng, temperature, eos_K, *,
                       max_new_tokens: int, pad_token_id: int = 0, top_k: int | None = None,
                       greedy: bool = False, return_logp: bool = False, constrain=None):
  """The model's prefill of `prompt` and `decode_loop`, traceable: the cached path of
  `generate`, and the plan's rollout program (experiments/plan/rollout.py). Returns
  `decode_loop`'s tuple."""
  T = prompt.tokens_BxT.shape[1]
  logits_BxV, cache = model.prefill_prompt(prompt, cache_len=prompt.prefix + T + max_new_tokens)
  # `decode_loop` is looked up when traced, so a test can count the traces.
  return decode_loop(model, logits_BxV, cache, rng, temperature, eos_K,
                     max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, top_k=top_k,
                     greedy=greedy, return_logp=return_logp, constrain=constrain)


_STATIC = ("graphdef", "max_new_tokens", "pad_token_id", "top_k", "greedy", "return_logp")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _generate_cached(graphdef, state, prompt, rng, temperature, eos_K, *, max_new_tokens,
                     pad_token_id, top_k, greedy, return_logp):
  tokens_BxN, logp_BxN, lengths_B, _ = prefill_and_decode(
      nnx.merge(graphdef, state), prompt, rng, temperature, eos_K,
      max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, top_k=top_k, greedy=greedy,
      return_logp=return_logp)
  return tokens_BxN, logp_BxN, lengths_B


@functools.partial(jax.jit, static_argnames=_STATIC)
def _generate_uncached(graphdef, state, prompt, rng, temperature, eos_K, *, max_new_tokens,
                       pad_token_id, top_k, greedy, return_logp):
  model = nnx.merge(graphdef, state)
  prompt_BxT, lengths_B = prompt.tokens_BxT, prompt.lengths_B
  B, T = prompt_BxT.shape
  S = T + max_new_tokens
  rows_B = jnp.arange(B)
  buffer_BxS = jnp.pad(prompt_BxT, ((0, 0), (0, max_new_tokens)))
  # Padding between a short prompt and the buffer end is overwritten in order.
  buffer_BxS = jnp.where(jnp.arange(S)[None, :] < lengths_B[:, None], buffer_BxS, 0)

  def step(buffer_BxS, i):
    length_B = lengths_B + i
    valid_BxS = jnp.arange(S)[None, :] < length_B[:, None]
    logits_BxSxV = model.prompt_logits(prompt, buffer_BxS, valid_BxS)
    token_B, logp_B = draw(logits_BxSxV[rows_B, prompt.prefix + length_B - 1], rng, i,
                           temperature, top_k, greedy, return_logp)
    return buffer_BxS.at[rows_B, length_B].set(token_B), (token_B, logp_B)

  _, (tokens_NxB, logp_NxB) = jax.lax.scan(step, buffer_BxS, jnp.arange(max_new_tokens))
  # A row's tokens after its first end token are the pad, as the cached loop emits them.
  is_end_BxN = (tokens_NxB.T[..., None] == eos_K).any(-1)
  finished_BxN = jnp.cumsum(is_end_BxN, axis=1) - is_end_BxN.astype(jnp.int32) > 0
  tokens_BxN = jnp.where(finished_BxN, pad_token_id, tokens_NxB.T).astype(jnp.int32)
  logp_BxN = None if logp_NxB is None else jnp.where(finished_BxN, 0.0, logp_NxB.T)
  return tokens_BxN, logp_BxN, (~finished_BxN).sum(1).astype(jnp.int32)
