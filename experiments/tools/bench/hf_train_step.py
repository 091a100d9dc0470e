"""The training-step cost of Lngram v2 on a Qwen3-1.7B-width backbone: the paper's Table 13
recipe against the same model without memory.

    python -m experiments.tools.bench.hf_train_step --json hf_train_step.json          # GPU, 28 layers
    python -m experiments.tools.bench.hf_train_step --layers 16 --repeats 5            # a shorter run
    python -m experiments.tools.bench.hf_train_step --tiny --json tiny.json            # CPU, seconds

Writes a synthetic Qwen3 checkpoint of Qwen3-1.7B's widths (hidden 2048, 16 query / 8 KV
heads of 128, FFN 6144, vocabulary 151,936, tied embeddings; `hf_import.write_checkpoint`,
the import path's writer, bf16) with `--layers` layers (default 28, the model's depth), then
builds two runs from it through the config path a `train --config.init_from=hf:DIR` run
takes (`experiments/configs/hf_lngram.py`, `with_hf_backbone`, `lm_config`, `insert_into`,
`init_train_state`, the trainer's jitted step with the LM loss):

  baseline    the recipe with arg `none` (no memory: the checkpoint alone);
  lngram_v2   the recipe as it is (R 121, 4-bit codes, orders 2 and 3, memory width 128,
              16/16 readout heads of 128, one-bit surrogate, conv 4 dilated 3) with
              `model.memory_layers` set explicitly to `--memory-layers` (0-based; default
              1,13 = the paper's layers 2 and 14).

Parameters float32, activations bf16, AdamW with the recipe's groups, as the recipe says.
Correctness comes before timing: the two models' logits on a check batch must agree at
step 0 (the branches' output projection and conv start at zero, so the memory model is
the checkpoint's; max |diff| printed, within two epsilons of the compute dtype times the
largest logit: the branches add zeros, but the two programs are compiled apart and XLA
may round bf16 at other places in each; 0.3% of the largest logit at 2 layers on a CPU) and
the first step's loss must be finite for both. A non-finite loss stops that row before
its timed steps; a failed check prints no table or verdict and exits 1 (the memory
model's logits exist only once it is built, after the baseline's steps: one model's
train state on the device at a time).

Times: the median over `--repeats` single steps of the compiled step, each ended by
`block_until_ready` (compile and the first step excluded), on one batch of `--batch` x
`--seq-len` random tokens (default 8 x 1024). Peak memory: `memory_stats()`'s
`peak_bytes_in_use` after each model's steps where the backend has it (the baseline runs
first and its state is freed before the memory model is built, so the second figure is
its own whenever it is the larger), else the compiled step's memory analysis (resident
arguments + temporaries + outputs - aliased; `experiments/tools/bench/measure.py`); the table
says which. Prints the table and `Lngram training-step overhead <= +5%: PASS|FAIL (x.x%)`.

Depth: at 28 layers the run holds ~60 GB on the device and compiles two unrolled train
steps; `gpu_suite.sh` runs it at 16 layers (the memory at layers 2 and 14 still) to stay
inside its 180 s step with the checkpoint write (2.1 GiB at 16 layers) included. Fewer
layers than 28 overstate the overhead (the two memory layers' fixed cost over a shallower
backbone), so a PASS at 16 layers holds at 28. `--tiny`: hf_import.TINY widths, 4 layers with the memory at
layers 1 and 3 (0-based), the recipe's `smoke` memory (4 routes, 2-bit codes, float32),
B 2 x T 32: the CPU test of the bench; its times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.configs import load_config
from experiments.hf.backbone import with_hf_backbone
from experiments.jobs.init_from import insert_into
from experiments.jobs.lm.task import lm_loss
from experiments.models import DecoderLM, layout, lm_config
from experiments.tools.bench import hf_import, measure
from experiments.trainer import optimizer as optim_lib
from experiments.trainer.placement import make_train_mesh
from experiments.trainer.state import init_train_state
from lngram_jax.layer import set_surrogate_impl
from lngram_jax.lookup import SURROGATE_IMPLS

RECIPE = "experiments/configs/hf_lngram.py"
TARGET_PCT = 5.0   # the target: Lngram's training-step overhead, percent of the baseline's
FULL = dict(layers=28, memory_layers=(1, 13), batch=8, seq_len=1024)
TINY = dict(layers=4, memory_layers=(1, 3), batch=2, seq_len=32)
ROWS = ("baseline", "lngram_v2")
GIB = 2**30


def run_config(hf_dir: Path, *, memory: bool, memory_layers, tiny: bool, seq_len: int):
  """The recipe's config for the checkpoint in `hf_dir` (memory on or off)."""
  parts = [p for p in ("smoke" if tiny else "", "" if memory else "none") if p]
  config = load_config(RECIPE + (":" + ",".join(parts) if parts else ""))
  config.init_from = f"hf:{hf_dir}"
  config.data.kind = "tokens"   # the checkpoint's own token ids (no data is read here)
  config.data.seq_len = seq_len
  config.model.max_len = max(config.model.max_len, seq_len)
  config.model.memory_layers = tuple(memory_layers) if memory else ()
  return with_hf_backbone(config)


def synthetic_batch(vocab: int, batch: int, seq_len: int, seed: int = 0) -> dict:
  """One packed-row batch of random token ids (the LM loss's fields), one document a row."""
  rng = np.random.default_rng(seed)
  tokens_BxT1 = rng.integers(0, vocab, (batch, seq_len + 1), dtype=np.int32)
  return {"inputs": jnp.asarray(tokens_BxT1[:, :-1]), "targets": jnp.asarray(tokens_BxT1[:, 1:]),
          "segment_ids": jnp.ones((batch, seq_len), jnp.int32),
          "positions": jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (batch, seq_len)),
          "loss_mask": jnp.ones((batch, seq_len), jnp.int32)}


def build_state(config, surrogate_impl: str = "auto"):
  """The run's train state on one device, its backbone copied in from the checkpoint;
  its Lngram layers' surrogate backward is `surrogate_impl`."""
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=config.train.seed))
  info = insert_into(model, config.init_from)
  set_surrogate_impl(model, surrogate_impl)   # before the step is traced from the graph
  ts = init_train_state(model, config.optim, (config.train.steps,), make_train_mesh({}),
                        rules=layout.placement_rules(model))
  return ts, info


def check_logits(ts, batch: dict):
  """Float32 logits of the step-0 model on the check batch (host numpy)."""
  forward = jax.jit(lambda params, rest, inputs: nnx.merge(ts.graphdef, params, rest)(
      inputs).astype(jnp.float32))
  return np.asarray(forward(ts.state["params"], ts.rest, batch["inputs"][:, :64]))


def _device_peak_bytes():
  """`memory_stats()["peak_bytes_in_use"]`, or None where the backend has none."""
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:   # noqa: BLE001 - some backends raise instead of returning None
    return None
  return stats.get("peak_bytes_in_use") if stats else None


def time_steps(ts, config, batch: dict, repeats: int) -> dict:
  """Compiles the trainer's step, runs it once (step 0: the loss checked), then times
  `repeats` single steps; the state is freed afterwards."""
  lr_fn = optim_lib.learning_rate_schedule(config.optim, config.train.steps)
  step = ts.step_fn(0, lm_loss, lr_fn)
  t0 = time.perf_counter()
  compiled = step.lower(ts.state, ts.rest, batch).compile()
  compile_s = time.perf_counter() - t0
  memory = measure.peak_bytes(compiled, (ts.state, ts.rest, batch))
  state, metrics = jax.block_until_ready(compiled(ts.state, ts.rest, batch))
  loss = float(metrics["train/loss"])
  times = []
  if np.isfinite(loss):
    for _ in range(repeats):
      t0 = time.perf_counter()
      state, metrics = jax.block_until_ready(compiled(state, ts.rest, batch))
      times.append(time.perf_counter() - t0)
  n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
  ts.state = None
  del state, metrics, compiled
  device_peak = _device_peak_bytes()
  return {"loss_step0": loss, "compile_s": compile_s, "times_s": times,
          "ms_per_step": 1e3 * statistics.median(times) if times else None,
          "params": int(n_params), "compiled_peak_gib": (
              None if memory["peak_bytes"] is None else memory["peak_bytes"] / GIB),
          "device_peak_gib": None if device_peak is None else device_peak / GIB}


def run(hf_dir: Path, *, tiny: bool, memory_layers, batch_size: int, seq_len: int,
        repeats: int, surrogate_impl: str = "auto", log=print, save=None) -> dict:
  """Both rows on the checkpoint in `hf_dir`: the step-0 check, then their step times.
  `surrogate_impl`: the memory layers' surrogate backward (`lngram_jax.lookup`).
  `save(partial)` after each row: a run cut short keeps what it measured."""
  configs = {name: run_config(hf_dir, memory=name != "baseline", memory_layers=memory_layers,
                              tiny=tiny, seq_len=seq_len) for name in ROWS}
  vocab = configs["baseline"].model.vocab_size
  batch = synthetic_batch(vocab, batch_size, seq_len)
  rows, logits = {}, {}
  for name in ROWS:   # baseline first: its peak figure is its own (module docstring)
    t0 = time.perf_counter()
    ts, info = build_state(configs[name], surrogate_impl)
    build_s = time.perf_counter() - t0
    logits[name] = check_logits(ts, batch)
    rows[name] = {"build_s": build_s, "fresh_arrays": info["fresh"],
                  **time_steps(ts, configs[name], batch, repeats)}
    del ts
    r = rows[name]
    ms = "not timed" if r["ms_per_step"] is None else f"{r['ms_per_step']:.2f} ms/step"
    log(f"{name}: built in {build_s:.1f} s, compiled in {r['compile_s']:.1f} s, step-0 loss "
        f"{r['loss_step0']:.4f}, {ms}")
    if save:
      save({"rows": rows})
  diff = float(np.abs(logits["lngram_v2"] - logits["baseline"]).max())
  scale = float(np.abs(logits["baseline"]).max())
  compute = jnp.dtype(configs["baseline"].model.dtype)
  tol = 2 * float(jnp.finfo(compute).eps) * scale   # rounding only (module docstring)
  losses_finite = all(np.isfinite(rows[n]["loss_step0"]) for n in ROWS)
  check = {"max_abs_diff": diff, "max_abs_logit": scale, "tolerance": tol,
           "logits_equal": diff <= tol, "losses_finite": losses_finite,
           "passed": diff <= tol and losses_finite}
  out = {"rows": rows, "step0_check": check, "dtype": compute.name,
         "param_dtype": jnp.dtype(configs["baseline"].model.param_dtype).name,
         "tokens_per_step": batch_size * seq_len}
  if not check["passed"]:
    return out
  for r in rows.values():
    r["tokens_per_s"] = out["tokens_per_step"] / (r["ms_per_step"] / 1e3)
  base, mem = rows["baseline"]["ms_per_step"], rows["lngram_v2"]["ms_per_step"]
  overhead = 100.0 * (mem / base - 1.0)
  out["overhead_pct"] = overhead
  out["target"] = {"name": f"Lngram training-step overhead <= +{TARGET_PCT:g}%",
                   "limit_pct": TARGET_PCT, "value_pct": overhead,
                   "passed": overhead <= TARGET_PCT}
  return out


def format_report(result: dict) -> str:
  c = result["step0_check"]
  lines = [f"step-0 check: max |logits(lngram_v2) - logits(baseline)| = {c['max_abs_diff']:.3g} "
           f"(largest logit {c['max_abs_logit']:.3g}, tolerance {c['tolerance']:.3g}); "
           f"step-0 losses finite: {c['losses_finite']}: {'PASS' if c['passed'] else 'FAIL'}"]
  if not c["passed"]:
    return "\n".join(lines + ["not timed: the step-0 check failed"])
  device = all(r["device_peak_gib"] is not None for r in result["rows"].values())
  peak_key = "device_peak_gib" if device else "compiled_peak_gib"
  lines += ["| run | ms/step | tokens/s | peak GiB | overhead % |",
            "| --- | ---: | ---: | ---: | ---: |"]
  base = result["rows"]["baseline"]["ms_per_step"]
  for name, r in result["rows"].items():
    lines.append(f"| {name} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} | "
                 f"{r[peak_key]:.2f} | {100.0 * (r['ms_per_step'] / base - 1.0):+.1f} |")
  lines.append("peak GiB: " + ("memory_stats() peak_bytes_in_use after the run's steps"
                               if device else "the compiled step's memory analysis "
                               "(no memory_stats() on this backend)"))
  t = result["target"]
  lines.append(f"{t['name']}: {'PASS' if t['passed'] else 'FAIL'} ({t['value_pct']:.1f}%)")
  return "\n".join(lines)


def _layers(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in text.split(",") if v.strip())
  except ValueError:
    raise argparse.ArgumentTypeError(f"--memory-layers={text!r}: 0-based layer indices, "
                                     "comma-separated") from None


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m experiments.tools.bench.hf_train_step",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--tiny", action="store_true", help="tiny widths (a test of the bench)")
  parser.add_argument("--layers", type=int, default=None,
                      help=f"decoder depth (default {FULL['layers']}; --tiny {TINY['layers']})")
  parser.add_argument("--memory-layers", type=_layers, default=None,
                      help="0-based layers holding Lngram v2 (default 1,13: the paper's 2 "
                           "and 14; --tiny 1,3)")
  parser.add_argument("--batch", type=int, default=None, help="rows per step (default 8)")
  parser.add_argument("--seq-len", type=int, default=None, help="tokens per row (default 1024)")
  parser.add_argument("--repeats", type=int, default=5, help="timed steps per run (median)")
  parser.add_argument("--surrogate-impl", choices=SURROGATE_IMPLS, default="auto",
                      help="the memory layers' surrogate backward implementation "
                           "(lngram_jax.lookup; default auto)")
  parser.add_argument("--dir", default=None,
                      help="where the synthetic checkpoint goes, kept, and reused when it "
                           "already holds the same draw (default: a temporary directory, "
                           "removed afterwards)")
  parser.add_argument("--json", default=None, metavar="PATH", help="also write results here")
  args = parser.parse_args(argv)
  sizes = TINY if args.tiny else FULL
  args.layers = args.layers or sizes["layers"]
  args.batch = args.batch or sizes["batch"]
  args.seq_len = args.seq_len or sizes["seq_len"]
  if args.memory_layers is None:
    args.memory_layers = sizes["memory_layers"]
    if args.layers <= max(args.memory_layers):
      parser.error(f"--layers={args.layers} lacks layer {max(args.memory_layers)} "
                   f"(0-based) of the default memory layers {args.memory_layers}; give "
                   "--memory-layers too")
  if not args.memory_layers or min(args.memory_layers) < 0 or (
      max(args.memory_layers) >= args.layers):
    parser.error(f"--memory-layers={args.memory_layers} must name layers in "
                 f"0..{args.layers - 1}")
  for flag in ("layers", "batch", "seq_len", "repeats"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be >= 1")
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  widths = hf_import.TINY if args.tiny else hf_import.WIDTHS
  hf_dir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hf_train_step_"))
  device = jax.devices()[0]
  print(f"Lngram v2 training step at {'tiny' if args.tiny else 'Qwen3-1.7B'} widths, "
        f"{args.layers} layers, memory at {args.memory_layers} (0-based), B {args.batch} x "
        f"T {args.seq_len}, surrogate backward {args.surrogate_impl}; jax {jax.__version__}, "
        f"{device.platform} ({device.device_kind})")
  try:
    t0 = time.perf_counter()
    # A --dir that already holds this draw is reused (hf_import.write_checkpoint).
    size = hf_import.write_checkpoint(hf_dir, args.layers, widths=widths,
                                      reuse=args.dir is not None)
    write_s = time.perf_counter() - t0
    print(f"checkpoint: {size / GIB:.3f} GiB bf16 in {hf_dir}, ready in {write_s:.1f} s")
    meta = dict(
        date=time.strftime("%Y-%m-%d"), jax_version=jax.__version__,
        platform=device.platform, device_kind=device.device_kind,
        machine=f"{platform.machine()}, {os.cpu_count()} CPU cores", widths=dict(widths),
        layers=args.layers, memory_layers=list(args.memory_layers), batch=args.batch,
        seq_len=args.seq_len, repeats=args.repeats, tiny=args.tiny,
        surrogate_impl=args.surrogate_impl, checkpoint_bytes=size,
        checkpoint_write_s=write_s, recipe=RECIPE)

    def save(result):
      if args.json:
        with open(args.json, "w") as f:
          json.dump({**result, **meta}, f, indent=2)

    result = run(hf_dir, tiny=args.tiny, memory_layers=args.memory_layers,
                 batch_size=args.batch, seq_len=args.seq_len, repeats=args.repeats,
                 surrogate_impl=args.surrogate_impl, save=save)
  finally:
    if not args.dir:
      shutil.rmtree(hf_dir, ignore_errors=True)
  result["report"] = format_report(result)
  print(result["report"])
  result.update(meta)
  save(result)
  if not result["step0_check"]["passed"]:
    raise SystemExit(1)
  return result


if __name__ == "__main__":
  main()
