"""Decode throughput of the tiny VLM with and without PVM (both with the KV + visual caches).

    python -m experiments.vlm.bench_decode [--new-tokens 128 --batch 8 --repeats 5 --args l3]

The vlm_pvm_sft model shape (d = 128, 4 layers, PVM latent 64 at layers 1
and 3, 9 visual tokens) with random weights and λ = 0.5, so the branch does
real work; the base model shares the backbone. Calls alternate base / PVM
so both see the same machine load; best of `repeats` after one warm-up call
each (compilation excluded). Prints tokens/s and the per-token time ratio.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.configs import load_config
from experiments.vlm.generate import generate
from experiments.vlm.model import VLM
from experiments.vlm.run import vlm_config


def _call(model, images, prompt, lengths, n):
  tokens, _ = generate(model, images, prompt, lengths, max_new_tokens=n,
                       rng=jax.random.key(0), greedy=True)
  return jax.block_until_ready(tokens)


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--new-tokens", type=int, default=128)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--prompt", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--args", default="", help="vlm_pvm_sft config args, e.g. 'l3' or 'd32'")
  a = p.parse_args(argv)
  cfg = vlm_config(load_config(f"experiments/configs/vlm_pvm_sft.py:{a.args}"))
  pvm = VLM(cfg, rngs=nnx.Rngs(0))
  for layer in cfg.branch_layers:
    pvm.branches[str(layer)].gate[...] = jnp.asarray(0.5)
  base = VLM(cfg.replace(branch="none", branch_layers=(), pvm=None), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (a.batch, *cfg.image_hw, 3)).astype(np.uint8)
  prompt = rng.integers(1, 256, (a.batch, a.prompt)).astype(np.int32)
  lengths = np.full((a.batch,), a.prompt, np.int32)
  times = {"base": [], "pvm": []}
  for name, model in (("base", base), ("pvm", pvm)):
    t0 = time.perf_counter()
    _call(model, images, prompt, lengths, a.new_tokens)
    print(f"{name}: compile + first call {time.perf_counter() - t0:.1f}s")
  for _ in range(a.repeats):
    for name, model in (("base", base), ("pvm", pvm)):
      t0 = time.perf_counter()
      _call(model, images, prompt, lengths, a.new_tokens)
      times[name].append(time.perf_counter() - t0)
  best = {k: min(v) for k, v in times.items()}
  for name in ("base", "pvm"):
    print(f"{name:5s} best {best[name]:.3f}s per call  "
          f"{a.batch * a.new_tokens / best[name]:.0f} new tokens/s  "
          f"{1e3 * best[name] / a.new_tokens:.2f} ms per step")
  print(f"PVM / base time per call: {best['pvm'] / best['base']:.3f} "
        f"(median {np.median(times['pvm']) / np.median(times['base']):.3f})")


if __name__ == "__main__":
  main()
