"""Qwen3-VL sampling speed: the compiled decode loop against the uncached reference (CPU).

    python -m experiments.tools.bench.qwen3vl_sampler [--batch 4 --prompt 24 --new-tokens 32 --repeats 3]

A tiny random Qwen3-VL (experiments/vlm/qwen3vl/random_config.py, PVM at layer 1 with its gate
open), every row one image (grid 1×4×4: 4 visual tokens) and text. Three samplers,
greedy, each warmed up once (compilation excluded), then timed in alternating rounds
so that all see the same machine load:
  loop      `greedy_generate`: the prefill, then one compiled `lax.while_loop` over the
            decode step (experiments/vlm/qwen3vl/generate.py)
  per_token the prefill, then a Python loop over a jitted one-token decode step (the
            sampler before the loop was compiled), as a reference for dispatch cost
  uncached  `greedy_generate_uncached`: the whole forward again for every token
Their tokens are checked equal. Printed: new tokens per second (best round) and the
ratios to the uncached reference.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.vlm.qwen3vl.generate import (
  greedy_generate,
  greedy_generate_uncached,
  last_logits,
  pack_right,
)
from experiments.vlm.qwen3vl.model import Qwen3VL
from experiments.vlm.qwen3vl.pvm import with_pvm
from experiments.vlm.qwen3vl.random_config import RANDOM_VOCAB, random_qwen3vl_config

GRID = (1, 4, 4)   # 16 patches of 3·2·4·4 values -> 4 merged image tokens


def build(batch: int, prompt: int, seed: int = 0):
  """(model, inputs): the tiny PVM model and `batch` rows of [image | text] (`prompt`
  tokens in all, right-padded to the longest; rows 1 token shorter each, cyclically)."""
  model = Qwen3VL(with_pvm(random_qwen3vl_config(), layers=(1,), latent_dim=32), rngs=nnx.Rngs(seed))
  model.lm.blocks[1].ffn_branch.gate[...] = jnp.asarray(0.5, jnp.float32)
  c = model.config
  rng = np.random.default_rng(seed)
  head = [3, c.vision_start_token_id] + [c.image_token_id] * 4 + [c.vision_end_token_id]
  if prompt < len(head) + 4:
    raise ValueError(f"--prompt={prompt}: at least {len(head) + 4} tokens (image + text).")
  ids = np.zeros((batch, prompt), np.int64)
  mask = np.zeros_like(ids)
  for b in range(batch):
    n = prompt - b % 4
    ids[b, :n] = head + list(rng.integers(0, RANDOM_VOCAB - 8, n - len(head)))
    mask[b, :n] = 1
  inputs = dict(input_ids=ids, attention_mask=mask,
                pixel_values=rng.normal(size=(16 * batch, 96)).astype(np.float32),
                image_grid_thw=np.asarray([GRID] * batch, np.int64))
  return model, inputs


@nnx.jit
def _step(model, tokens_Bx1, cache):
  return model.decode_step(tokens_Bx1, cache)


def per_token(model, inputs: dict, n: int) -> np.ndarray:
  """Greedy tokens by a Python loop over one jitted decode step (dispatch per token)."""
  packed = pack_right(inputs)
  T = packed["input_ids"].shape[1]
  logits, cache = model.prefill(packed["input_ids"], pixel_values=packed["pixel_values"],
                                image_grid_thw=packed["image_grid_thw"],
                                attention_mask_BxT=packed["attention_mask"], cache_len=T + n)
  logits_BxV = last_logits(logits, packed["lengths"])
  out = []
  for i in range(n):
    token_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    out.append(token_B)
    if i + 1 < n:
      logits_BxV, cache = _step(model, token_B[:, None], cache)
  return np.asarray(jnp.stack(out, axis=1), np.int32)


SAMPLERS = {"loop": greedy_generate, "per_token": per_token,
            "uncached": greedy_generate_uncached}


def time_samplers(model, inputs, n: int, repeats: int, log=print) -> dict:
  """{sampler: [seconds per call]}, compilation excluded; checks their tokens agree."""
  tokens = {}
  for name, fn in SAMPLERS.items():
    t0 = time.perf_counter()
    tokens[name] = fn(model, inputs, n)
    log(f"{name}: first call (compiles) {time.perf_counter() - t0:.1f} s")
  for name in SAMPLERS:
    np.testing.assert_array_equal(tokens[name], tokens["uncached"], err_msg=name)
  times = {name: [] for name in SAMPLERS}
  for _ in range(repeats):
    for name, fn in SAMPLERS.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(model, inputs, n))
      times[name].append(time.perf_counter() - t0)
  return times


def table(times: dict, *, batch: int, n: int) -> str:
  rate = {name: batch * n / min(t) for name, t in times.items()}
  lines = ["| sampler | best s / call | median s / call | new tokens/s | × uncached |",
           "| --- | ---: | ---: | ---: | ---: |"]
  for name, t in times.items():
    lines.append(f"| {name} | {min(t):.3f} | {np.median(t):.3f} | {rate[name]:,.1f} | "
                 f"{rate[name] / rate['uncached']:.1f} |")
  return "\n".join(lines)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(prog="python -m experiments.tools.bench.qwen3vl_sampler",
                              description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--prompt", type=int, default=24)
  p.add_argument("--new-tokens", type=int, default=32)
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args(argv)
  if min(a.batch, a.new_tokens, a.repeats) < 1:
    p.error("--batch, --new-tokens and --repeats must be >= 1")
  model, inputs = build(a.batch, a.prompt)
  device = jax.devices()[0]
  print(f"jax {jax.__version__}, {device.platform}; tiny Qwen3-VL + PVM, batch {a.batch}, "
        f"prompt {a.prompt}, {a.new_tokens} new tokens, {a.repeats} rounds")
  times = time_samplers(model, inputs, a.new_tokens, a.repeats)
  print(table(times, batch=a.batch, n=a.new_tokens))
  return times


if __name__ == "__main__":
  main()
