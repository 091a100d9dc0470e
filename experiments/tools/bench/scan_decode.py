"""Decode per token of the scanned `DecoderLM(scan=True)` against the unrolled model.

    python -m experiments.tools.bench.scan_decode                   # 28 x d 128, cache 2,048, B 1
    python -m experiments.tools.bench.scan_decode --layers 8 --batch 4
    python -m experiments.tools.bench.scan_decode --smoke           # seconds

The scanned model runs its branch-free layers as one `lax.scan` over stacked
weights (a program compiles one block body); the unrolled model is the
reference the trainer and generation use. Both are the same weights: the first
step's logits are checked to agree (to 1e-4 of their scale in float32, 5e-2 in
bfloat16) before any time is printed, and the share of greedy tokens that agree
is printed (a near-tie may fork a generation).
A prompt of `--prompt` tokens is prefilled into a cache of `--cache` slots, then
`--new-tokens` greedy steps run in one jitted `lax.scan` (the cache donated);
best of `--repeats` calls after a warm-up call. The ratio scan / unrolled is the
figure to quote on a shared machine; `experiments/models/lm.py` says where the
scanned decode's extra time goes.
"""

from __future__ import annotations

import argparse
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments.models.config import LMConfig
from experiments.tools.bench.measure import time_program
from experiments.tools.bench.scan_lm import PureLM, build_lm


def bench_config(layers: int, width: int, cache: int, dtype: str) -> LMConfig:
  """A dense byte-level LM: heads of 32, GQA 2:1, FFN 2x."""
  heads = max(2, width // 32)
  return LMConfig(d_model=width, n_layers=layers, n_heads=heads, n_kv_heads=heads // 2,
                  head_dim=32, ffn_dim=2 * width, vocab_size=256, max_len=cache,
                  dtype=dtype, param_dtype=dtype)


def time_decode(lm: PureLM, prompt_BxT, *, cache_len: int, new_tokens: int, repeats: int):
  """(best seconds per token, greedy tokens [B, N], first step's logits [B, V]): the
  warm-up call's outputs, then `repeats` timed calls, each on a fresh prefilled cache."""
  prefill = jax.jit(lm.prefill, static_argnums=2)

  def fresh():
    logits_BxV, cache = prefill(lm.params, prompt_BxT, cache_len)
    return lm.params, cache, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)  # as generate

  r = time_program(functools.partial(lm.decode, steps=new_tokens), fresh(), repeats,
                   donate=(1,), fresh=fresh)
  tokens_BxN, logits_NxBxV, _ = r["output"]
  return (r["best_ms"] / 1e3 / new_tokens, np.asarray(tokens_BxN),
          np.asarray(logits_NxBxV[0], np.float32))


def run(a) -> dict:
  config = bench_config(a.layers, a.width, a.cache, a.dtype)
  prompt_BxT = jax.random.randint(jax.random.key(1), (a.batch, a.prompt), 0, 256,
                                  dtype=jnp.int32)
  times, tokens, logits = {}, {}, {}
  for name, scan in (("unrolled", False), ("scanned", True)):
    lm = PureLM(build_lm(config, scan=scan))
    times[name], tokens[name], logits[name] = time_decode(
        lm, prompt_BxT, cache_len=a.cache, new_tokens=a.new_tokens, repeats=a.repeats)
  scale = float(np.abs(logits["unrolled"]).max())
  err = float(np.abs(logits["scanned"] - logits["unrolled"]).max()) / max(scale, 1e-30)
  if err > (1e-4 if a.dtype == "float32" else 5e-2):
    raise AssertionError(f"scan_decode: the scanned model's first-step logits differ from the "
                         f"unrolled model's by {err:.2e} of their scale.")
  return {"config": config, "ms_per_token": {k: 1e3 * v for k, v in times.items()},
          "scan_over_unrolled": times["scanned"] / times["unrolled"], "logits_rel_err": err,
          "tokens_agree": float((tokens["scanned"] == tokens["unrolled"]).mean())}


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m experiments.tools.bench.scan_decode",
                              description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="4 layers, d 64, cache 64: seconds")
  p.add_argument("--layers", type=int, default=28)
  p.add_argument("--width", type=int, default=128, help="d_model (a multiple of 64)")
  p.add_argument("--cache", type=int, default=2048, help="cache slots (max_len)")
  p.add_argument("--prompt", type=int, default=1024, help="prefilled prompt tokens")
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  a = p.parse_args(argv)
  if a.smoke:
    a.layers, a.width, a.cache, a.prompt, a.new_tokens, a.repeats = 4, 64, 64, 16, 8, 1
  if a.width % 64 or a.width < 64:
    p.error(f"--width {a.width}: expected a positive multiple of 64")
  if a.layers < 3:
    p.error(f"--layers {a.layers}: a scanned span needs at least 2 layers; use >= 3")
  if a.prompt < 1 or a.prompt + a.new_tokens > a.cache:
    p.error(f"--prompt {a.prompt} + --new-tokens {a.new_tokens} must fit --cache {a.cache}")
  if min(a.batch, a.new_tokens, a.repeats) < 1:
    p.error("--batch, --new-tokens and --repeats must be >= 1")
  return a


def main(argv=None, log=print) -> dict:
  a = parse_args(argv)
  result = run(a)
  c = result["config"]
  log(f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cores); "
      f"{c.n_layers} layers, d {c.d_model}, {c.n_heads}/{c.n_kv_heads} heads, {a.dtype}; "
      f"B {a.batch}, prompt {a.prompt}, cache {a.cache}, {a.new_tokens} greedy steps, "
      f"best of {a.repeats}")
  log(f"first-step logits agree to {result['logits_rel_err']:.1e} of their scale; "
      f"{100 * result['tokens_agree']:.0f}% of greedy tokens agree")
  log("| model | ms/token |")
  log("| --- | --- |")
  for name, ms in result["ms_per_token"].items():
    log(f"| {name} | {ms:.3f} |")
  log(f"scanned / unrolled: {result['scan_over_unrolled']:.2f}x")
  return result


if __name__ == "__main__":
  main()
