"""Sampling from `Qwen3VL`: entry points on the one sampler (experiments/models/generate.py).

    sample(model, inputs, max_new_tokens, rng=, temperature=, greedy=, return_logp=,
           eos_token_ids=, pad_token_id=, return_lengths=)
    greedy_generate(model, inputs, max_new_tokens)      the argmax continuation
    greedy_generate_uncached(...)                       its slow reference twin
    rollout(model, ...)                                 prefill + decode loop from a packed
                                                        batch, traceable (what
                                                        `plan --program=rollout` compiles)

`sample` is `generate(model, inputs, ...)` with numpy out: the model packs its
processor's batch (`Qwen3VL.sampling_prompt`: rows padded on either side, as
transformers' `generate` wants, are first packed to the right, which changes no
position: positions count real tokens only), the prefill runs the vision tower once
and fills every layer's cache (PVM layers keep the K/V of their visual memory there),
and the one decode loop (`experiments.models.generate.decode_loop`) feeds one token
per row at position 1 + the row's largest prompt position (transformers' rope
deltas), stopping rows at `eos_token_ids`. Prefill and loop are one compiled program
per shape. The uncached twin is `greedy_generate_uncached`: the full forward per
token, the end-token stop on the host.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from experiments.models.generate import (  # noqa: F401  (re-exported: tests and tools)
  Prompt,
  decode_loop,
  end_ids,
  generate,
  last_logits,
  prefill_and_decode,
)
from experiments.vlm.qwen3vl.model import pack_right
from experiments.vlm.qwen3vl.positions import rope_index


def rollout(model, ids_BxT, pixel_values, lengths_B, position_3xBxT, rng, temperature, eos_K,
            *, grid_thw, n_visual: int, max_new_tokens: int, pad_token_id: int = 0,
            greedy: bool = False, return_logp: bool = True, mesh=None, constrain=None):
  """The sampler's program from a right-packed batch, traceable (the plan's rollout
  program, experiments/plan/rollout.py): `prefill_and_decode` of the prompt rows with
  their multimodal positions `position_3xBxT`; returns `decode_loop`'s tuple. The
  step's `mesh` goes into the branch context, so that attention runs its kernel per
  batch shard (a Pallas call is not partitioned by XLA)."""
  prompt = Prompt(tokens_BxT=ids_BxT, lengths_B=lengths_B,
                  inputs={"pixel_values": pixel_values, "positions": position_3xBxT},
                  static=(("grid_thw", grid_thw), ("n_visual", n_visual), ("mesh", mesh)))
  return prefill_and_decode(model, prompt, rng, temperature, eos_K,
                            max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
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
  out = generate(model, inputs, max_new_tokens=max_new_tokens, rng=rng,
                 temperature=temperature, greedy=greedy, return_logp=return_logp,
                 eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                 return_lengths=return_lengths)
  out = jax.device_get(out if isinstance(out, tuple) else (out,))
  dtypes = (np.int32,) + ((np.float32,) if return_logp else ()) + (
      (np.int32,) if return_lengths else ())
  out = tuple(np.asarray(a, dtype) for a, dtype in zip(out, dtypes, strict=True))
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
  loop ends when every row is finished). Every step's rows are right-padded to one
  length (prompt + max_new_tokens; causal attention never reads the padding), so one
  compiled forward serves all steps."""
  packed = pack_right(inputs)
  ids_BxT, lengths_B = packed["input_ids"], packed["lengths"]
  B = ids_BxT.shape[0]
  grid = packed.get("image_grid_thw")
  grid_thw = None if grid is None else tuple(tuple(int(n) for n in row) for row in grid)
  model.check_image_tokens(ids_BxT, grid_thw)
  positions_3xBxT, deltas_B = rope_index(ids_BxT, grid, packed["attention_mask"], model.config,
                                         mm_token_type_ids=packed.get("mm_token_type_ids"))
  ends = set(end_ids(eos_token_ids).tolist())
  rows = [list(ids_BxT[b, :lengths_B[b]]) for b in range(B)]
  done = [False] * B
  out = np.full((B, max_new_tokens), pad_token_id, np.int32)
  L = int(lengths_B.max()) + max_new_tokens
  for i in range(max_new_tokens):
    if all(done):
      break
    ids = np.zeros((B, L), np.int64)
    mask = np.zeros((B, L), np.int64)
    pos = np.zeros((3, B, L), np.int64)
    for b, r in enumerate(rows):
      n, n0 = len(r), int(lengths_B[b])
      ids[b, :n], mask[b, :n] = r, 1
      pos[:, b, :n0] = positions_3xBxT[:, b, :n0]
      pos[:, b, n0:n] = np.arange(n0, n) + deltas_B[b]
    logits_BxLxV = _full_forward(model, ids, packed.get("pixel_values"), mask, pos,
                                 grid_thw=grid_thw, n_visual=model.visual_width(ids_BxT))
    last = np.asarray(logits_BxLxV)[np.arange(B), mask.sum(1) - 1].argmax(-1)
    for b in range(B):
      if done[b]:
        continue
      rows[b].append(int(last[b]))
      out[b, i] = int(last[b])
      done[b] = int(last[b]) in ends
  return out


@nnx.jit(static_argnames=("grid_thw", "n_visual"))
def _full_forward(model, ids_BxL, pixel_values, mask_BxL, position_3xBxL, *, grid_thw,
                  n_visual):
  """The forward's logits [B, L, V] of host-built rows and positions (the uncached twin)."""
  logits_BxLxV, _ = model(ids_BxL, pixel_values=pixel_values,
                          image_grid_thw=None if grid_thw is None else np.asarray(grid_thw),
                          attention_mask_BxT=mask_BxL, position_ids=position_3xBxL,
                          n_visual=n_visual)
  return logits_BxLxV
