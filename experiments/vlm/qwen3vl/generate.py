"""Sampling from `Qwen3VL` with the decoder's KV cache (and PVM's visual cache).

    sample(model, inputs, max_new_tokens, rng=, temperature=, greedy=, return_logp=,
           eos_token_ids=, pad_token_id=, return_lengths=)
    greedy_generate(model, inputs, max_new_tokens)      the argmax continuation
    greedy_generate_uncached(...)                       its slow reference twin
    decode_loop(model, logits_BxV, cache, ...)          the traceable decode loop
    rollout(model, ...)                                 prefill + decode loop, traceable
                                                        (what `plan --program=rollout` compiles)

Every draw is experiments/models/generate.py's `draw` (step i with fold_in(rng, i);
GRPO's old log-probabilities under the untempered logits), as for the decoder LM and
the tiny VLM.

The inputs are a processor's dict (numpy): rows may be padded on either side
(transformers' `generate` wants left padding); each row is first packed to the
right (its real tokens first, as `DecoderLM.prefill_embedded` expects), which
changes no position: positions count real tokens only. The prefill runs the
vision tower once and fills every layer's cache (PVM layers keep the K/V of
their visual memory there); each decode step then feeds one token per row at
position 1 + the row's largest prompt position (transformers' rope deltas).

Two compiled programs per shape: the prefill (`Qwen3VL.prefill`) and one decode
loop (`decode_loop` under one jit: a `lax.while_loop` over the one-token decode
step, the cache in the loop carry, the new tokens written into a fixed [B, N]
buffer). With `eos_token_ids` a row that draws one of them is finished: the end
token is kept, every later token of that row is `pad_token_id` (log-probability
0), its length counts the tokens up to and including the end token; the other
rows go on, and the loop exits as soon as every row is finished. Without them
(the default) every row runs to `max_new_tokens`, as before.
The uncached twin is `greedy_generate_uncached`: the full forward per token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.generate import draw
from experiments.vlm.qwen3vl.positions import rope_index


def pack_right(inputs: dict) -> dict:
  """The dict with each row's real tokens moved to the front (padding after them):
  `input_ids`, `attention_mask`, `mm_token_type_ids` (when present) rearranged,
  plus `lengths` int32 [B]. pixel_values and image_grid_thw stay as they are."""
  ids_BxT = np.asarray(inputs["input_ids"])
  B, T = ids_BxT.shape
  mask_BxT = np.asarray(inputs.get("attention_mask", np.ones((B, T)))).astype(bool)
  order_BxT = np.argsort(~mask_BxT, axis=1, kind="stable")
  out = dict(inputs)
  out["input_ids"] = np.where(np.sort(~mask_BxT, axis=1), 0,
                              np.take_along_axis(ids_BxT, order_BxT, axis=1))
  out["attention_mask"] = np.take_along_axis(mask_BxT, order_BxT, axis=1).astype(np.int64)
  if inputs.get("mm_token_type_ids") is not None:
    types = np.asarray(inputs["mm_token_type_ids"])
    out["mm_token_type_ids"] = np.take_along_axis(types, order_BxT, axis=1) * out[
        "attention_mask"]
  out["lengths"] = mask_BxT.sum(1).astype(np.int32)
  return out


def end_ids(eos_token_ids) -> np.ndarray:
  """int32 [K] end-token ids from None (K = 0: no stop), an int or a sequence."""
  if eos_token_ids is None:
    return np.zeros((0,), np.int32)
  return np.asarray(np.atleast_1d(eos_token_ids), np.int32).reshape(-1)


def last_logits(logits_BxTxV, lengths_B):
  """float32 [B, V]: the prefill's logits at each row's last real prompt token."""
  B = logits_BxTxV.shape[0]
  return logits_BxTxV[jnp.arange(B), jnp.asarray(lengths_B) - 1].astype(jnp.float32)


def decode_loop(model, logits_BxV, cache, rng, temperature, eos_K, *, max_new_tokens: int,
                pad_token_id: int = 0, greedy: bool = False, return_logp: bool = False,
                constrain=None):
  """(tokens int32 [B, N], logp float32 [B, N] or None, lengths int32 [B], steps int32):
  N = max_new_tokens tokens drawn from `logits_BxV` (the prefill's last logits) on, one
  `model.decode_step` per token, in one `lax.while_loop` (traceable; `sample` jits it).

  Step i draws with fold_in(rng, i). A row is finished once it drew a token of
  `eos_K` (int32 [K]; K = 0: never): it then emits `pad_token_id` with log-probability
  0 and its length stops growing (the end token counts). The loop stops after N steps
  or when every row is finished (`steps`: the steps it ran). Finished rows still go
  through the decode step (fixed shapes); what they compute is discarded.
  `constrain`: applied to the cache after each step (the plan's sharding constraint)."""
  B, N = logits_BxV.shape[0], max_new_tokens
  constrain = constrain or (lambda c: c)
  eos_K = jnp.asarray(eos_K, jnp.int32)

  def cond(carry):
    i, done_B = carry[0], carry[3]
    return (i < N) & ~jnp.all(done_B)

  def body(carry):
    i, logits_BxV, cache, done_B, tokens_BxN, logp_BxN, lengths_B = carry
    token_B, logp_B = draw(logits_BxV, rng, i, temperature, None, greedy, return_logp)
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


_LOOP_STATIC = ("max_new_tokens", "pad_token_id", "greedy", "return_logp")


@nnx.jit(static_argnames=_LOOP_STATIC)
def _decode_loop(model, logits_BxV, cache, rng, temperature, eos_K, *, max_new_tokens,
                 pad_token_id, greedy, return_logp):
  # `decode_loop` is looked up when traced, so a test can count the traces.
  return decode_loop(model, logits_BxV, cache, rng, temperature, eos_K,
                     max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                     greedy=greedy, return_logp=return_logp)


def rollout(model, ids_BxT, pixel_values, lengths_B, position_3xBxT, rng, temperature, eos_K,
            *, grid_thw, n_visual: int, max_new_tokens: int, pad_token_id: int = 0,
            greedy: bool = False, return_logp: bool = True, mesh=None, constrain=None):
  """The prefill + `decode_loop`, traceable: what `sample` runs as two programs, as one
  (the plan's rollout program, experiments/plan/rollout.py). The prompt rows are
  right-packed, `position_3xBxT` their multimodal positions; returns `decode_loop`'s
  tuple. The prefill is `Qwen3VL.prefill`'s compiled part (model.py `_prefill`) with the
  step's `mesh` in the branch context, so that attention runs its kernel per batch
  shard (a Pallas call is not partitioned by XLA)."""
  T = ids_BxT.shape[1]
  x_BxTxD, layer_adds, image_BxT, v_MxD = model.embed_inputs(ids_BxT, pixel_values,
                                                             np.asarray(grid_thw))
  context = model.context(ids_BxT, image_BxT, v_MxD, n_visual=n_visual)
  logits_BxTxV, cache = model.lm.prefill_embedded(
      x_BxTxD, lengths=lengths_B, cache_len=T + max_new_tokens,
      context=context if mesh is None else context.replace(mesh=mesh),
      positions=position_3xBxT, layer_adds=layer_adds)
  return decode_loop(model, last_logits(logits_BxTxV, lengths_B), cache, rng, temperature,
                     eos_K, max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                     greedy=greedy, return_logp=return_logp, constrain=constrain)


def sample(model, inputs: dict, max_new_tokens: int, *, rng=None, temperature: float = 1.0,
           greedy: bool = False, return_logp: bool = False, eos_token_ids=None,
           pad_token_id: int = 0, return_lengths: bool = False):
  """int32 [B, max_new_tokens], the continuation of every row; with `return_logp`
  also float32 [B, max_new_tokens], each token's log-probability; with
  `return_lengths` also int32 [B], each row's new tokens (its end token included).

  `inputs`: a processor's dict (numpy); rows padded on either side. `rng`: a PRNG key
  (unused when greedy). `eos_token_ids`: an id or ids that end a row (then padded with
  `pad_token_id`, log-probability 0); None: no stop, every row runs to max_new_tokens."""
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
  if not greedy and rng is None:
    raise ValueError("sample: pass rng= (or greedy=True).")
  rng = jax.random.key(0) if rng is None else rng
  packed = pack_right(inputs)
  ids_BxT, lengths_B = packed["input_ids"], packed["lengths"]
  T = ids_BxT.shape[1]
  logits_BxTxV, cache = model.prefill(
      ids_BxT, pixel_values=packed.get("pixel_values"),
      image_grid_thw=packed.get("image_grid_thw"), attention_mask_BxT=packed["attention_mask"],
      mm_token_type_ids=packed.get("mm_token_type_ids"), cache_len=T + max_new_tokens)
  tokens, logp, lengths, _ = _decode_loop(
      model, last_logits(logits_BxTxV, lengths_B), cache, rng,
      jnp.asarray(temperature, jnp.float32), jnp.asarray(end_ids(eos_token_ids)),
      max_new_tokens=max_new_tokens, pad_token_id=int(pad_token_id), greedy=greedy,
      return_logp=return_logp)
  out = (np.asarray(jax.device_get(tokens), np.int32),)
  if return_logp:
    out += (np.asarray(logp, np.float32),)
  if return_lengths:
    out += (np.asarray(lengths, np.int32),)
  return out if len(out) > 1 else out[0]


def greedy_generate(model, inputs: dict, max_new_tokens: int, *, eos_token_ids=None,
                    pad_token_id: int = 0) -> np.ndarray:
  """int32 [B, max_new_tokens]: the greedy continuation of every row (no stop unless
  `eos_token_ids`; then as `sample`)."""
  return sample(model, inputs, max_new_tokens, greedy=True, eos_token_ids=eos_token_ids,
                pad_token_id=pad_token_id)


def greedy_generate_uncached(model, inputs: dict, max_new_tokens: int, *, eos_token_ids=None,
                             pad_token_id: int = 0) -> np.ndarray:
  """The slow twin of `greedy_generate`: the whole forward again for every token, the
  end-token stop on the host (a finished row's later tokens are `pad_token_id`; the
  loop ends when every row is finished)."""
  packed = pack_right(inputs)
  ids_BxT, lengths_B = packed["input_ids"], packed["lengths"]
  B = ids_BxT.shape[0]
  positions_3xBxT, deltas_B = rope_index(ids_BxT, packed.get("image_grid_thw"),
                                         packed["attention_mask"], model.config,
                                         mm_token_type_ids=packed.get("mm_token_type_ids"))
  ends = set(end_ids(eos_token_ids).tolist())
  rows = [list(ids_BxT[b, :lengths_B[b]]) for b in range(B)]
  done = [False] * B
  out = np.full((B, max_new_tokens), pad_token_id, np.int32)
  for i in range(max_new_tokens):
    if all(done):
      break
    L = max(len(r) for r in rows)
    ids = np.zeros((B, L), np.int64)
    mask = np.zeros((B, L), np.int64)
    pos = np.zeros((3, B, L), np.int64)
    for b, r in enumerate(rows):
      n, n0 = len(r), int(lengths_B[b])
      ids[b, :n], mask[b, :n] = r, 1
      pos[:, b, :n0] = positions_3xBxT[:, b, :n0]
      pos[:, b, n0:n] = np.arange(n0, n) + deltas_B[b]
    logits_BxTxV, _ = model(ids, pixel_values=packed.get("pixel_values"),
                            image_grid_thw=packed.get("image_grid_thw"),
                            attention_mask_BxT=mask, position_ids=pos)
    last = np.asarray(logits_BxTxV)[np.arange(B), mask.sum(1) - 1].argmax(-1)
    for b in range(B):
      if done[b]:
        continue
      rows[b].append(int(last[b]))
      out[b, i] = int(last[b])
      done[b] = int(last[b]) in ends
  return out
