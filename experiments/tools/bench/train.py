"""Training throughput on this machine: every memory arm against lm_baseline and lm_lngram, same run.

    python -m experiments.tools.bench.train --steps=20 --repeats=3
    python -m experiments.tools.bench.train --models=lm_baseline,lm_lngram
    python -m experiments.tools.bench.train --models=lm_baseline,lm_lngram,lm_lngram:none,lm_lngram:ste
    python -m experiments.tools.bench.train --models=lm_baseline,lm_lngram --split

A model may carry its own config arg after a colon (`lm_lngram:none` is
lm_lngram with the router's surrogate off), appended to `--args` if both are given.

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
import optax
from flax import nnx

from experiments.configs import load_config
from experiments.data import TrainIterator, corpus_spec, load_corpus
from experiments.jobs.lm.task import lm_loss
from experiments.models import DecoderLM, lm_config
from experiments.trainer import optimizer as optim_lib
from experiments.trainer.placement import make_train_mesh
from experiments.trainer.state import init_train_state

CONFIGS = {"lm_baseline": "experiments/configs/lm_baseline.py",
           "lm_lngram": "experiments/configs/lm_lngram.py",
           "lm_pkm": "experiments/configs/lm_pkm.py",
           "lm_engram": "experiments/configs/lm_engram.py",
           "lm_lngram_v1": "experiments/configs/lm_lngram_v1.py",
           "lm_sparse_ffn": "experiments/configs/lm_sparse_ffn.py"}


def _config_path(name: str, common_arg: str) -> str:
  """`file[:arg]` of a --models entry `model[:own_arg]`; the args join with a comma."""
  model, _, own = name.partition(":")
  arg = ",".join(a for a in (common_arg, own) if a)
  return f"{CONFIGS[model]}:{arg}" if arg else CONFIGS[model]


def _state(config):
  """The model's train state on one device, as the trainer sets it up."""
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=config.train.seed))
  return init_train_state(model, config.optim, (config.train.steps,), make_train_mesh({}))


def _part_runners(config, batches):
  """Closures timing one round of each part of the step, by itself: the loss
  (forward), its gradient (forward+backward) and the optimiser update (on a fixed
  gradient). Their sum exceeds the step's time by what the fused step shares."""
  ts = _state(config)
  graphdef, params, rest, tx = ts.graphdef, ts.state["params"], ts.rest, ts.txs[0]

  def objective(p, batch):
    return lm_loss(nnx.merge(graphdef, p, rest), batch)[0]

  loss_fn, grad_fn = jax.jit(objective), jax.jit(jax.grad(objective))
  grads = grad_fn(params, batches[0])

  @jax.jit
  def update(p, opt_state):
    updates, opt_state = tx.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state

  def timed(body):
    jax.block_until_ready(body())   # compile

    def run():
      t0 = time.perf_counter()
      jax.block_until_ready(body())
      return time.perf_counter() - t0
    return run

  opt_state0 = ts.state["opt_state"]

  def updates():
    p, o = params, opt_state0
    for _ in batches:
      p, o = update(p, o)
    return p, o

  return {"forward": timed(lambda: [loss_fn(params, b) for b in batches]),
          "forward+backward": timed(lambda: [grad_fn(params, b) for b in batches]),
          "optimizer": timed(updates)}


def _runner(config, batches):
  """A closure timing one round of len(batches) train steps (the loop's own step)."""
  ts = _state(config)
  lr = optim_lib.learning_rate_schedule(config.optim, config.train.steps)
  train_step = ts.step_fn(0, lm_loss, lr)
  rest = ts.rest
  state, metrics = train_step(ts.state, rest, batches[0])  # compile
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
  parser.add_argument("--split", action="store_true",
                      help="also time the step's parts alone: forward, forward+backward, "
                           "optimiser update (ms per step)")
  parser.add_argument("--models", default=",".join(CONFIGS),
                      help=f"comma-separated subset of {list(CONFIGS)}, each optionally "
                           "with its own config arg after a colon (lm_lngram:none)")
  ns = parser.parse_args(argv)
  names = list(dict.fromkeys(n for n in ns.models.split(",") if n))
  unknown = sorted({n.split(":", 1)[0] for n in names} - set(CONFIGS))
  if unknown:
    parser.error(f"unknown --models {unknown}; choose from {list(CONFIGS)}")
  configs = {name: load_config(_config_path(name, ns.args)) for name in names}
  first = next(iter(configs.values()))
  corpus = load_corpus(corpus_spec(first))
  data = TrainIterator(corpus, seq_len=first.data.seq_len, batch_size=first.data.batch_size,
                       seed=first.data.seed, prefetch=0)
  batches = [next(data) for _ in range(ns.steps)]
  tokens = ns.steps * first.data.batch_size * first.data.seq_len
  runners = {name: _runner(c, batches) for name, c in configs.items()}
  parts = {name: _part_runners(c, batches) for name, c in configs.items()} if ns.split else {}
  times = {name: [] for name in runners}
  part_times = {(name, part): [] for name in parts for part in parts[name]}
  for _ in range(ns.repeats):
    for name, run in runners.items():
      times[name].append(run())
      for part, run_part in parts.get(name, {}).items():
        part_times[(name, part)].append(run_part())
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
  if parts:
    result["ms_per_step"] = {
        name: {"step": round(statistics.median(times[name]) / ns.steps * 1e3, 2),
               **{part: round(statistics.median(part_times[(name, part)]) / ns.steps * 1e3, 2)
                  for part in parts[name]}}
        for name in parts}
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
  if "ms_per_step" in result:
    parts = list(next(iter(result["ms_per_step"].values())))
    lines += ["", "| model (ms per step) | " + " | ".join(parts) + " |",
              "|---|" + "---:|" * len(parts)]
    for name, row in result["ms_per_step"].items():
      lines.append(f"| {name} | " + " | ".join(f"{row[p]:.1f}" for p in parts) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
