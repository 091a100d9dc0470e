"""Benchmark: the Lngram v2 layer next to a dense decoder layer of the same width.

    python -m experiments.tools.bench.layer                        # --shape cpu on CPU, gpu otherwise
    python -m experiments.tools.bench.layer --shape gpu --repeats 20 --json bench_gpu.json
    python -m experiments.tools.bench.layer --shape cpu_r16 --readouts absorbed --repeats 7

Times, in one run, the layer's forward and forward+backward (gradients of a sum
of the output with respect to every parameter and to the input) per readout
form (literal, streaming, absorbed; one-bit surrogate) and per surrogate mode
(none, onebit, exact, ste; absorbed readout), the one-bit and exact surrogates
also with each other backward implementation of `--surrogate-impls` (rows
"... (gather)": the reference twin of `lngram_jax.lookup`; "onebit (triton)":
the one-bit backward and table gradient as one Pallas kernel, timed by
default on a GPU next to the default "blocks" row), the dense layer of
`dense.py`, and the readout functions alone (literal vs absorbed). Each
number is the median of `--repeats` runs after warm-up, every run ended by
`jax.block_until_ready`. Then it checks four speed targets:

  1. absorbed readout fwd+bwd at least 3x faster than literal (readout alone);
  2. one-bit surrogate backward (fwd+bwd minus fwd) at most 2x the `none` one;
  3. the whole layer (absorbed, one-bit) no slower than the dense layer, forward
     and forward+backward (a target at the gpu shape);
  4. one-bit forward+backward at most 1.3x the `none` one, exact at
     most 1.6x (absorbed readout, default surrogate implementation).

On shared CPUs only the ratios mean something. Shapes: `tiny` (smoke test),
`cpu` (d 256, R 64, M 4, mem 32, Hq 4, Hkv 2, B 2, T 128, float32) and `gpu`
(d 2048, R 64, M 4, mem 128, Hq 16, Hkv 8, dh 128, B 8, T 1024, bfloat16),
`cpu_r16` (the surrogate-backward target shape: d 256, R 16, M 4, mem 64, Hq 4, Hkv 2, B 4, T 512). The
streaming form runs R/4 routes per chunk so that it really streams.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.tools.bench import targets as absolute_targets
from experiments.tools.bench.dense import DenseDecoderLayer
from lngram_jax.config import READOUTS, SURROGATES, LngramConfig, sink_logit
from lngram_jax.layer import LngramV2, set_surrogate_impl
from lngram_jax.lookup import SURROGATE_IMPLS, resolve_surrogate_impl
from lngram_jax.readout import absorbed_readout, literal_readout


@dataclasses.dataclass(frozen=True)
class BenchShape:
  d_model: int
  routes: int
  bits: int
  mem_dim: int
  q_heads: int
  kv_heads: int
  head_dim: int
  batch: int
  time: int
  dtype: str

  def describe(self) -> str:
    return (f"d={self.d_model} R={self.routes} M={self.bits} mem={self.mem_dim} "
            f"Hq={self.q_heads} Hkv={self.kv_heads} dh={self.head_dim} "
            f"B={self.batch} T={self.time} {self.dtype}")


SHAPES = {
    "tiny": BenchShape(32, 4, 2, 8, 2, 1, 16, 1, 16, "float32"),
    "cpu": BenchShape(256, 64, 4, 32, 4, 2, 64, 2, 128, "float32"),
    "gpu": BenchShape(2048, 64, 4, 128, 16, 8, 128, 8, 1024, "bfloat16"),
    # The gpu shape's widths with 1/8 of its tokens, in float32: a CPU can run it.
    # Table gradients cost the same per step at any token count, so this is the
    # pessimistic side for Lngram against the dense layer.
    "gpu_width": BenchShape(2048, 64, 4, 128, 16, 8, 128, 1, 1024, "float32"),
    # Issue 14's CPU shape: fewer routes, wider memory, more tokens than `cpu`.
    "cpu_r16": BenchShape(256, 16, 4, 64, 4, 2, 64, 4, 512, "float32"),
    # The paper's widest row, r512/m4/KV8/mem256 (head dim = memory dim), at B 4, T 1024.
    "gpu_r512": BenchShape(2048, 512, 4, 256, 16, 8, 256, 4, 1024, "bfloat16"),
    # One memory layer of experiments/configs/lm_lngram.py at its training batch.
    "lm": BenchShape(128, 16, 4, 32, 4, 2, 32, 16, 128, "float32"),
}
# Surrogates whose backward has more than one implementation (lookup.SURROGATE_IMPLS).
IMPL_SURROGATES = ("onebit", "exact")
# The layer's own `surrogate_impl` (the rows without "(impl)" in their name).
DEFAULT_SURROGATE_IMPL = "auto"
LAYER_READOUTS = ("literal", "streaming", "absorbed")


def layer_config(shape: BenchShape, readout: str, surrogate: str) -> LngramConfig:
  dtype = jnp.dtype(shape.dtype)
  return LngramConfig(
      d_model=shape.d_model, routes=shape.routes, bits=shape.bits, mem_dim=shape.mem_dim,
      q_heads=shape.q_heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
      readout=readout, surrogate=surrogate, route_chunk=max(1, shape.routes // 4),
      dtype=dtype, param_dtype=dtype)


def module_fns(model: nnx.Module, h_BxTxD, surrogate_impl: str | None = None):
  """Jitted forward and forward+backward of a module (functional split/merge).

  `surrogate_impl`: the Lngram layers' backward implementation in these functions
  (None: the layers' own); `model` itself is left as it is.
  """
  graphdef, state = nnx.split(model)

  def forward(state, h):
    module = nnx.merge(graphdef, state)   # a new module per trace: setting it is local
    if surrogate_impl is not None:
      set_surrogate_impl(module, surrogate_impl)
    return module(h)

  def loss(state, h):
    return jnp.sum(forward(state, h).astype(jnp.float32))

  fwd_bwd = jax.value_and_grad(loss, argnums=(0, 1))
  return jax.jit(forward), jax.jit(fwd_bwd), (state, h_BxTxD)


def readout_fns(form, shape: BenchShape):
  """One readout function alone: gradients to q, x̂, W_K and W_V."""
  B, T, R = shape.batch, shape.time, shape.routes
  D = 2 * shape.mem_dim  # orders (2, 3)
  args = (_normal((B, T, shape.q_heads, shape.head_dim), 1.0, shape.dtype, seed=0),
          _normal((B, T, R, D), 1.0, shape.dtype, seed=1),
          _normal((D, shape.kv_heads, shape.head_dim), 0.05, shape.dtype, seed=2),
          _normal((D, shape.kv_heads, shape.head_dim), 0.05, shape.dtype, seed=3))
  b0 = sink_logit(R, 0.5)

  def forward(*x):
    return form(*x, sink_logit=b0)

  def loss(*x):
    return jnp.sum(forward(*x).astype(jnp.float32))

  fwd_bwd = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))
  return jax.jit(forward), jax.jit(fwd_bwd), args


def measure(timers: dict, *, repeats: int, warmup: int, log=print) -> dict:
  """Median ms per timer; `timers` maps name -> (fn, args).

  Every timer is compiled and warmed up first; then the timed runs go round
  robin over all timers, so that a burst of load from other processes on a
  shared machine hits every variant alike instead of one of them.
  """
  for name, (fn, args) in timers.items():
    for _ in range(max(1, warmup)):
      jax.block_until_ready(fn(*args))
    log(f"  compiled {name}")
  samples = {name: [] for name in timers}
  for _ in range(repeats):
    for name, (fn, args) in timers.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      samples[name].append(time.perf_counter() - start)
  return {name: 1e3 * statistics.median(times) for name, times in samples.items()}


def _normal(shape, std, dtype, *, seed):
  # numpy draws: eager jax.random would compile once per shape, for nothing.
  return jnp.asarray(std * np.random.default_rng(seed).standard_normal(shape), dtype)


def live_lngram(config: LngramConfig, seed: int = 0) -> LngramV2:
  """A layer with random W_O and conv kernel, as after some training."""
  model = LngramV2(config, rngs=nnx.Rngs(seed))
  pd = config.param_dtype
  model.w_o[...] = _normal(model.w_o[...].shape, 0.02, pd, seed=seed + 1)
  model.conv_kernel[...] = _normal(model.conv_kernel[...].shape, 0.1, pd, seed=seed + 2)
  return model


def dense_layer(shape: BenchShape, attention: str = "xla") -> DenseDecoderLayer:
  """The yardstick: a standard decoder layer of the model's width, d / Hq per head.

  Its heads are the model's attention heads, not the memory's readout heads, which
  may be wider (gpu_r512 reads with dh 256 at d 2048).
  """
  dtype = jnp.dtype(shape.dtype)
  return DenseDecoderLayer(
      shape.d_model, q_heads=shape.q_heads, kv_heads=shape.kv_heads,
      head_dim=shape.d_model // shape.q_heads, dtype=dtype, param_dtype=dtype,
      attention=attention, rngs=nnx.Rngs(0))


def run(shape: BenchShape, *, readouts=LAYER_READOUTS, surrogates=SURROGATES,
        surrogate_impls=(), repeats: int = 5, warmup: int = 1, attention: str = "xla",
        log=print) -> dict:
  """Times every variant; returns rows keyed by name and the target verdicts."""
  dtype = jnp.dtype(shape.dtype)
  h_BxTxD = _normal((shape.batch, shape.time, shape.d_model), 1.0, dtype, seed=42)
  variants = {}
  variants["dense decoder layer"] = module_fns(dense_layer(shape, attention), h_BxTxD)
  # Readout forms with the default one-bit surrogate, then surrogates with absorbed.
  layers = [(r, "onebit") for r in readouts]
  layers += [("absorbed", s) for s in surrogates if ("absorbed", s) not in layers]
  for readout, surrogate in layers:
    model = live_lngram(layer_config(shape, readout, surrogate))
    variants[f"lngram {readout} / {surrogate}"] = module_fns(model, h_BxTxD)
    if readout != "absorbed" or surrogate not in IMPL_SURROGATES:
      continue
    # The same layer with another backward, timed in the same round robin.
    default = resolve_surrogate_impl(model.surrogate_impl, surrogate)
    for impl in surrogate_impls:
      if resolve_surrogate_impl(impl, surrogate) != default:
        variants[f"lngram {readout} / {surrogate} ({impl})"] = module_fns(
            model, h_BxTxD, impl)
  for name, form in (("literal", literal_readout), ("absorbed", absorbed_readout)):
    variants[f"readout only: {name}"] = readout_fns(form, shape)
  timers = {}
  for name, (fwd, fwd_bwd, args) in variants.items():
    timers[f"{name} fwd"] = (fwd, args)
    timers[f"{name} fwd+bwd"] = (fwd_bwd, args)
  ms = measure(timers, repeats=repeats, warmup=warmup, log=log)
  rows = {name: _fwd_bwd_row(ms[f"{name} fwd"], ms[f"{name} fwd+bwd"]) for name in variants}
  if shape == SHAPES["gpu_r512"]:   # its target bounds peak memory too (targets.py)
    for name, (_, fwd_bwd, args) in variants.items():
      if name.startswith("lngram") and not name.endswith("(gather)"):   # not the twin
        stats = fwd_bwd.lower(*args).compile().memory_analysis()
        rows[name]["compiled_gib"] = None if stats is None else (
            stats.argument_size_in_bytes + stats.output_size_in_bytes
            + stats.temp_size_in_bytes - stats.alias_size_in_bytes) / 2**30
  dense_row = rows["dense decoder layer"]
  for row in rows.values():
    row["fwd_vs_dense"] = row["fwd_ms"] / dense_row["fwd_ms"]
    row["fwd_bwd_vs_dense"] = row["fwd_bwd_ms"] / dense_row["fwd_bwd_ms"]
  none_row = rows.get("lngram absorbed / none")
  for name, row in rows.items():
    if none_row and name.startswith("lngram absorbed / "):
      row["fwd_bwd_vs_none"] = row["fwd_bwd_ms"] / none_row["fwd_bwd_ms"]
  return {"rows": rows, "targets": check_targets(rows)}


def _fwd_bwd_row(fwd_ms: float, fwd_bwd_ms: float) -> dict:
  # Backward = fwd+bwd - fwd; timing noise on tiny shapes can push it below 0.
  return {"fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms, "bwd_ms": max(fwd_bwd_ms - fwd_ms, 0.0)}


def check_targets(rows: dict) -> list[dict]:
  """The speed targets of the module docstring, each with its measured value."""
  targets = []
  lit, absd = rows.get("readout only: literal"), rows.get("readout only: absorbed")
  if lit and absd:
    speedup = lit["fwd_bwd_ms"] / absd["fwd_bwd_ms"]
    targets.append(dict(
        name="absorbed readout fwd+bwd >= 3x faster than literal", value=speedup,
        passed=speedup >= 3.0, detail=f"{speedup:.2f}x faster"))
  onebit, none = rows.get("lngram absorbed / onebit"), rows.get("lngram absorbed / none")
  if onebit and none:
    ratio = onebit["bwd_ms"] / max(none["bwd_ms"], 1e-3)
    targets.append(dict(
        name="one-bit surrogate backward <= 2x the `none` backward", value=ratio,
        passed=ratio <= 2.0,
        detail=f"{onebit['bwd_ms']:.2f} ms vs {none['bwd_ms']:.2f} ms = {ratio:.2f}x"))
  if onebit:
    fwd, fb = onebit["fwd_vs_dense"], onebit["fwd_bwd_vs_dense"]
    targets.append(dict(
        name="layer (absorbed, onebit) no slower than the dense layer", value=max(fwd, fb),
        passed=fwd <= 1.0 and fb <= 1.0, detail=f"fwd {fwd:.2f}x, fwd+bwd {fb:.2f}x dense"))
  for surrogate, limit in (("onebit", 1.3), ("exact", 1.6)):
    row = rows.get(f"lngram absorbed / {surrogate}")
    if row and none:
      ratio = row["fwd_bwd_ms"] / none["fwd_bwd_ms"]
      targets.append(dict(
          name=f"{surrogate} fwd+bwd <= {limit}x the `none` fwd+bwd", value=ratio,
          passed=ratio <= limit,
          detail=f"{row['fwd_bwd_ms']:.2f} ms vs {none['fwd_bwd_ms']:.2f} ms = {ratio:.2f}x"))
  return targets


def format_table(rows: dict) -> str:
  lines = ["| variant | fwd ms | fwd+bwd ms | bwd ms | fwd / dense | fwd+bwd / dense |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
  for name, r in rows.items():
    lines.append(f"| {name} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {r['bwd_ms']:.2f} "
                 f"| {r['fwd_vs_dense']:.2f}x | {r['fwd_bwd_vs_dense']:.2f}x |")
  return "\n".join(lines)


def format_surrogate_ratios(rows: dict) -> str:
  """fwd+bwd of every absorbed surrogate row over the `none` one (same run)."""
  lines = ["| surrogate (absorbed) | fwd+bwd ms | fwd+bwd / none |", "| --- | ---: | ---: |"]
  for name, r in rows.items():
    if "fwd_bwd_vs_none" in r:
      label = name.removeprefix("lngram absorbed / ")
      lines.append(f"| {label} | {r['fwd_bwd_ms']:.2f} | {r['fwd_bwd_vs_none']:.2f}x |")
  return "\n".join(lines) if len(lines) > 2 else ""


def format_targets(targets: list[dict], shape_name: str) -> str:
  lines = []
  for t in targets:
    verdict = "PASS" if t["passed"] else "FAIL"
    lines.append(f"{verdict}: {t['name']}: {t['detail']} (shape {shape_name})")
  return "\n".join(lines)


def _csv(value: str, allowed, flag: str) -> tuple[str, ...]:
  names = tuple(v for v in value.split(",") if v)
  unknown = [v for v in names if v not in allowed]
  if unknown:
    raise argparse.ArgumentTypeError(f"{flag}: unknown {unknown}; choose from {tuple(allowed)}")
  return names


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m experiments.tools.bench.layer", description=__doc__.split("\n\n")[0])
  parser.add_argument("--shape", choices=sorted(SHAPES), default=None,
                      help="problem size; default cpu on a CPU backend, gpu otherwise")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs per number (median)")
  parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (compiles)")
  parser.add_argument("--readouts", default=",".join(LAYER_READOUTS),
                      type=lambda v: _csv(v, READOUTS, "--readouts"),
                      help="comma-separated readout forms of the layer (one-bit surrogate)")
  parser.add_argument("--surrogates", default=",".join(SURROGATES),
                      type=lambda v: _csv(v, SURROGATES, "--surrogates"),
                      help="comma-separated surrogate modes (absorbed readout)")
  parser.add_argument("--surrogate-impls", default=None,
                      type=lambda v: _csv(v, SURROGATE_IMPLS, "--surrogate-impls"),
                      help="backward implementations timed for the one-bit and exact "
                           "surrogates; default gather,blocks, and triton on a GPU "
                           f"(default implementation: {DEFAULT_SURROGATE_IMPL})")
  parser.add_argument("--attention", choices=("xla", "cudnn"), default="xla",
                      help="attention implementation of the dense layer")
  parser.add_argument("--json", default=None, metavar="PATH", help="also write results here")
  args = parser.parse_args(argv)
  if args.repeats < 1:
    parser.error(f"--repeats={args.repeats} must be >= 1")
  if args.surrogate_impls is None:  # the one-bit kernel only on a GPU (CPU: interpret mode)
    args.surrogate_impls = ("gather", "blocks") + (
        ("triton",) if jax.default_backend() == "gpu" else ())
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  shape_name = args.shape or ("cpu" if jax.default_backend() == "cpu" else "gpu")
  shape = SHAPES[shape_name]
  device = jax.devices()[0]
  print(f"Lngram v2 layer vs dense decoder layer, shape {shape_name}: {shape.describe()}")
  print(f"jax {jax.__version__}, {device.platform} ({device.device_kind}), "
        f"median of {args.repeats} after {args.warmup} warm-up")
  result = run(shape, readouts=args.readouts, surrogates=args.surrogates,
               surrogate_impls=args.surrogate_impls, repeats=args.repeats, warmup=args.warmup, attention=args.attention)
  print(format_table(result["rows"]))
  ratios = format_surrogate_ratios(result["rows"])
  if ratios:
    print(ratios)
  print(format_targets(result["targets"], shape_name))
  if shape_name == "gpu_r512":   # the one shape here with absolute targets
    result["absolute_targets"] = absolute_targets.r512_lines(result["rows"], shape_name)
    print("\n".join(result["absolute_targets"]))
  result.update(shape_name=shape_name, shape=dataclasses.asdict(shape),
                jax_version=jax.__version__, platform=device.platform,
                device_kind=device.device_kind, repeats=args.repeats, warmup=args.warmup,
                attention=args.attention, surrogate_impls=list(args.surrogate_impls),
                default_surrogate_impl=DEFAULT_SURROGATE_IMPL)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main()
