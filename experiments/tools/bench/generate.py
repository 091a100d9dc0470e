"""generate() throughput with and without the decode cache.

    python -m experiments.tools.bench.generate            # the small CPU model below
    python -m experiments.tools.bench.generate --new-tokens 128 --batch 8

A small byte-level LM with Lngram v2 layers (randomly initialised, with the
zero-init W_O and conv made nonzero so the branch does real work). Both paths
are timed after one warm-up call (compilation excluded; its time is printed
separately). The uncached path reruns the full forward over a fixed buffer of
prompt + new tokens each step, so its cost per token does not depend on the
position; the cached path runs prefill once and one decode step per token.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models import DecoderLM, LMConfig, generate, liven_lngram
from lngram_jax.config import LngramConfig


def bench_config() -> LMConfig:
  lngram = LngramConfig(d_model=128, routes=16, bits=4, orders=(2, 3), mem_dim=32,
                        q_heads=4, kv_heads=2, head_dim=32)
  return LMConfig(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32,
                  ffn_dim=384, max_len=512, memory_layers=(1, 3), memory=lngram)


def build_model(config: LMConfig, seed: int = 0) -> DecoderLM:
  return liven_lngram(DecoderLM(config, rngs=nnx.Rngs(seed)), key=1000, w_o_std=0.02,
                      conv_std=0.1)


def time_generate(model, prompt_BxT, *, use_cache, max_new_tokens, repeats):
  """(compile+first-call seconds, best seconds per call over `repeats`)."""
  kwargs = dict(max_new_tokens=max_new_tokens, rng=jax.random.key(0), top_k=20,
                use_cache=use_cache)
  start = time.perf_counter()
  generate(model, prompt_BxT, **kwargs).block_until_ready()
  first = time.perf_counter() - start
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    generate(model, prompt_BxT, **kwargs).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return first, best


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)

  config = bench_config()
  model = build_model(config)
  prompt_BxT = jax.random.randint(jax.random.key(1), (args.batch, args.prompt_len), 0,
                                  config.vocab_size, dtype=jnp.int32)
  params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cores),"
        f" model {params / 1e6:.2f}M params, d={config.d_model}, layers={config.n_layers},"
        f" lngram at {config.memory_layers}")
  print(f"batch {args.batch}, prompt {args.prompt_len}, new tokens {args.new_tokens},"
        f" best of {args.repeats}")
  print("| path | compile + first call s | s per call | new tokens/s | ms per step |")
  print("| --- | --- | --- | --- | --- |")
  rates = {}
  for name, use_cache in (("cached", True), ("uncached", False)):
    first, best = time_generate(model, prompt_BxT, use_cache=use_cache,
                                max_new_tokens=args.new_tokens, repeats=args.repeats)
    rates[name] = args.batch * args.new_tokens / best
    print(f"| {name} | {first:.2f} | {best:.3f} | {rates[name]:.0f} |"
          f" {1e3 * best / args.new_tokens:.2f} |")
  print(f"cached / uncached throughput: {rates['cached'] / rates['uncached']:.1f}x")


if __name__ == "__main__":
  main()
