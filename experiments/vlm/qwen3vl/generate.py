"""Sampling from `Qwen3VL` with the decoder's KV cache (and PVM's visual cache).

    sample(model, inputs, max_new_tokens, rng=, temperature=, greedy=, return_logp=)
    greedy_generate(model, inputs, max_new_tokens)      the argmax continuation
    greedy_generate_uncached(...)                       its slow reference twin

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
The uncached twin is `greedy_generate_uncached`: the full forward per token.
"""

from __future__ import annotations

import functools

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


@nnx.jit
def _decode(model, tokens_Bx1, cache):
  return model.decode_step(tokens_Bx1, cache)


@functools.partial(jax.jit, static_argnames=("greedy", "return_logp"))
def _draw(logits_BxV, rng, i, temperature, *, greedy, return_logp):
  return draw(logits_BxV, rng, i, temperature, None, greedy, return_logp)


def sample(model, inputs: dict, max_new_tokens: int, *, rng=None, temperature: float = 1.0,
           greedy: bool = False, return_logp: bool = False):
  """int32 [B, max_new_tokens], the continuation of every row (no EOS stop), and with
  `return_logp` float32 [B, max_new_tokens], each token's log-probability.

  `inputs`: a processor's dict (numpy); rows padded on either side. `rng`: a PRNG key
  (unused when greedy)."""
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
  if not greedy and rng is None:
    raise ValueError("sample: pass rng= (or greedy=True).")
  rng = jax.random.key(0) if rng is None else rng
  packed = pack_right(inputs)
  ids_BxT, lengths_B = packed["input_ids"], packed["lengths"]
  B, T = ids_BxT.shape
  logits_BxTxV, cache = model.prefill(
      ids_BxT, pixel_values=packed.get("pixel_values"),
      image_grid_thw=packed.get("image_grid_thw"), attention_mask_BxT=packed["attention_mask"],
      mm_token_type_ids=packed.get("mm_token_type_ids"), cache_len=T + max_new_tokens)
  logits_BxV = logits_BxTxV[jnp.arange(B), jnp.asarray(lengths_B) - 1]
  temperature = jnp.asarray(temperature, jnp.float32)
  tokens, logps = [], []
  for i in range(max_new_tokens):
    token_B, logp_B = _draw(logits_BxV, rng, i, temperature, greedy=greedy,
                            return_logp=return_logp)
    tokens.append(token_B)
    logps.append(logp_B)
    if i + 1 < max_new_tokens:   # the last token needs no logits after it
      logits_BxV, cache = _decode(model, token_B[:, None], cache)
  tokens_BxN = np.asarray(jax.device_get(jnp.stack(tokens, axis=1)), np.int32)
  if not return_logp:
    return tokens_BxN
  return tokens_BxN, np.asarray(jnp.stack(logps, axis=1), np.float32)


def greedy_generate(model, inputs: dict, max_new_tokens: int) -> np.ndarray:
  """int32 [B, max_new_tokens]: the greedy continuation of every row (no EOS stop)."""
  return sample(model, inputs, max_new_tokens, greedy=True)


def greedy_generate_uncached(model, inputs: dict, max_new_tokens: int) -> np.ndarray:
  """The slow twin of `greedy_generate`: the whole forward again for every token."""
  packed = pack_right(inputs)
  ids_BxT, lengths_B = packed["input_ids"], packed["lengths"]
  B = ids_BxT.shape[0]
  positions_3xBxT, deltas_B = rope_index(ids_BxT, packed.get("image_grid_thw"),
                                         packed["attention_mask"], model.config,
                                         mm_token_type_ids=packed.get("mm_token_type_ids"))
  rows = [list(ids_BxT[b, :lengths_B[b]]) for b in range(B)]
  out = []
  for _ in range(max_new_tokens):
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
      rows[b].append(int(last[b]))
    out.append(last)
  return np.stack(out, axis=1).astype(np.int32)
