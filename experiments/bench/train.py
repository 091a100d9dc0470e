"""Training throughput on this machine: every memory arm against lm_baseline and lm_lngram, same run.

    python -m experiments.bench.train --steps=20 --repeats=3
    python -m experiments.bench.train --models=lm_baseline,lm_lngram

The models train on the same batches of the embedded corpus with their
default configs (or `--args=smoke`); timing rounds alternate between them
(A B C ... A B C ...) so load from other processes hits all alike. Reports
the median tokens/s of each and its ratio to lm_baseline and to lm_lngram
(JSON, then a markdown table); compile time is excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.configs import load_config
from experiments.data import TrainIterator, corpus_spec, load_corpus
from experiments.models import DecoderLM, lm_config
from experiments.train import optimizer as optim_lib
from experiments.train import step as step_lib
from experiments.train.lm_task import lm_loss

CONFIGS = {"lm_baseline": "experiments/configs/lm_baseline.py",
           "lm_lngram": "experiments/configs/lm_lngram.py",
           "lm_pkm": "experiments/configs/lm_pkm.py",
           "lm_engram": "experiments/configs/lm_engram.py",
           "lm_lngram_v1": "experiments/configs/lm_lngram_v1.py",
           "lm_sparse_ffn": "experiments/configs/lm_sparse_ffn.py"}


def _runner(config, batches):
  """A closure timing one round of len(batches) train steps (the loop's own step)."""
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=config.train.seed))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  tx = optim_lib.make_optimizer(config.optim, params, config.train.steps)
  lr = optim_lib.learning_rate_schedule(config.optim, config.train.steps)
  train_step = step_lib.make_train_step(graphdef, tx, lr, lm_loss)
  state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
  state, metrics = train_step(state, rest, batches[0])  # compile
  jax.block_until_ready(metrics)
  holder = {"state": state}

  def run():
    state = holder["state"]
    t0 = time.perf_counter()
    for batch in batches:
      state, metrics = train_step(state, rest, batch)
    jax.block_until_ready((state, metrics))
    holder["state"] = state
    return time.perf_counter() - t0

  return run


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20, help="steps per timing round")
  parser.add_argument("--repeats", type=int, default=3, help="timing rounds per model")
  parser.add_argument("--args", default="", help="config arg for every file, e.g. smoke")
  parser.add_argument("--models", default=",".join(CONFIGS),
                      help=f"comma-separated subset of {list(CONFIGS)}")
  ns = parser.parse_args(argv)
  names = [n for n in ns.models.split(",") if n]
  unknown = sorted(set(names) - set(CONFIGS))
  if unknown:
    parser.error(f"unknown --models {unknown}; choose from {list(CONFIGS)}")
  configs = {name: load_config(f"{CONFIGS[name]}:{ns.args}" if ns.args else CONFIGS[name])
             for name in names}
  first = next(iter(configs.values()))
  corpus = load_corpus(corpus_spec(first))
  data = TrainIterator(corpus, seq_len=first.data.seq_len, batch_size=first.data.batch_size,
                       seed=first.data.seed, prefetch=0)
  batches = [next(data) for _ in range(ns.steps)]
  tokens = ns.steps * first.data.batch_size * first.data.seq_len
  runners = {name: _runner(c, batches) for name, c in configs.items()}
  times = {name: [] for name in runners}
  for _ in range(ns.repeats):
    for name, run in runners.items():
      times[name].append(run())
  tok_s = {name: tokens / statistics.median(t) for name, t in times.items()}
  result = {
      "date": time.strftime("%Y-%m-%d"),
      "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, jax backend "
                 f"{jax.default_backend()}, Python {platform.python_version()}",
      "load_average_1min": round(os.getloadavg()[0], 1),
      "jax": jax.__version__, "steps": ns.steps, "repeats": ns.repeats,
      "tokens_per_step": first.data.batch_size * first.data.seq_len,
      "tokens_per_s": {k: round(v, 1) for k, v in tok_s.items()},
  }
  for ref in ("lm_baseline", "lm_lngram"):
    if ref in tok_s:
      result[f"ratio_over_{ref}"] = {k: round(v / tok_s[ref], 3) for k, v in tok_s.items()}
  print(json.dumps(result, indent=1))
  print(markdown(result))
  return result


def markdown(result: dict) -> str:
  """The result as a markdown table: tokens/s and the two ratios per model."""
  refs = [r for r in ("lm_baseline", "lm_lngram") if f"ratio_over_{r}" in result]
  head = "| model | tokens/s | " + " | ".join(f"÷ {r}" for r in refs) + " |"
  lines = [head, "|---|---:|" + "---:|" * len(refs)]
  for name, value in result["tokens_per_s"].items():
    ratios = " | ".join(f"{result[f'ratio_over_{r}'][name]:.3f}" for r in refs)
    lines.append(f"| {name} | {value:.0f} | {ratios} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
