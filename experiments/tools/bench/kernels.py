"""Times the sink readout: XLA literal, XLA absorbed and the Pallas kernel.

    python -m experiments.tools.bench.kernels                 # every shape below + the whole layer (GPU)
    python -m experiments.tools.bench.kernels --shape r64     # one readout shape
    python -m experiments.tools.bench.kernels --shape tiny    # CPU smoke run (tiny shapes, seconds)
    python -m experiments.tools.bench.kernels --sweep         # also try a few Pallas block sizes
    python -m experiments.tools.bench.kernels --forms pallas  # a subset of the forms (see --help)
    python -m experiments.tools.bench.kernels --json out.json # also the rows as JSON (rewritten after each table)

Readout rows take (q [N, Hq, dh], x̂ [N, R, D], W_K, W_V [D, Hkv, dh]) as
[B=1, T=N] arrays in bfloat16 (dh = 128) and time forward and forward +
backward (gradients of all four inputs). The memory floor is one read of x̂,
N·R·D·bytes; "fwd/floor" divides the forward time by that floor at the copy
bandwidth measured in the same run (copying x̂: one read, one write), and
"floor GB/s" is N·R·D·bytes / time. The layer rows time LngramV2 at d = 2048,
r64/m4/KV8/mem128, B = 8, T = 1024, bf16 activations and the one-bit
surrogate, forward and forward + backward (all parameter gradients), with the
readouts "pallas_fused" (table rows gathered and normalised inside the
kernel: x̂ never in HBM), "pallas_fused+triton" (the same with its backward's table
gradient and one-bit surrogate in one kernel: `surrogate_impl="triton"`, DESIGN.md §2.7),
"pallas", "absorbed" and "literal".

Peak memory: "compiled GiB" is XLA's compiled memory analysis of the
forward + backward function (arguments + outputs + temporaries); "device GiB"
is `memory_stats()["peak_bytes_in_use"]` after the row, a process-wide high
water mark that only grows (the layer rows run first, the fused Pallas layer
row first of all, so that row's figure is its own).

"pallas token_block" is the Pallas readout with `BlockSizes(layout=
"token_block")` (a block of tokens in each dot, `kernels/sink_readout/
triton_amortised.py`, default token blocks), timed in the readout tables of
R <= 64 only (r64, tiny), the shapes it is meant for; `--sweep` adds a few of
its block sizes (TOKEN_BLOCK_SWEEP) there.

The fused kernel needs the tables, so it appears in the layer rows only. On
CPU the Pallas kernels run in interpret mode: their times there measure the
interpreter, not the kernel, and mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.tools.bench import targets
from kernels.sink_readout import BlockSizes
from lngram_jax import LngramConfig, LngramV2, absorbed_readout, literal_readout, sink_logit
from lngram_jax.pallas import pallas_readout


@dataclasses.dataclass(frozen=True)
class ReadoutShape:
  name: str
  N: int
  R: int
  Hq: int
  Hkv: int
  D: int
  dh: int = 128


READOUT_SHAPES = {
    "r64": ReadoutShape("r64", N=8192, R=64, Hq=16, Hkv=8, D=256),
    "r121": ReadoutShape("r121", N=8192, R=121, Hq=16, Hkv=16, D=256),
    "r512": ReadoutShape("r512", N=4096, R=512, Hq=16, Hkv=8, D=512),
}
TINY_READOUT = ReadoutShape("tiny", N=12, R=6, Hq=4, Hkv=2, D=16, dh=8)

LAYER = dict(config=LngramConfig(d_model=2048, routes=64, bits=4, orders=(2, 3), mem_dim=128,
                                 q_heads=16, kv_heads=8, head_dim=128, surrogate="onebit",
                                 dtype=jnp.bfloat16),
             batch=8, time=1024)
TINY_LAYER = dict(config=LngramConfig(d_model=16, routes=3, bits=2, orders=(2,), mem_dim=8,
                                      q_heads=4, kv_heads=2, head_dim=4, surrogate="onebit",
                                      dtype=jnp.bfloat16),
                  batch=2, time=6)

SWEEP = (BlockSizes(block_r=32, block_r_bwd=16, num_warps=4),
         BlockSizes(block_r=64, block_r_bwd=32, num_warps=4),
         BlockSizes(block_r=64, block_r_bwd=32, num_warps=8),
         BlockSizes(block_r=128, block_r_bwd=32, num_warps=8),
         BlockSizes(block_r=128, block_r_bwd=64, num_warps=8))

# Token-block layout at r64 (D 256): tokens per dot x route blocks; the backward's stacked
# mem/dmem tiles are block_n·block_r_bwd rows.
TOKEN_BLOCK_SWEEP = (
    BlockSizes(block_n=2, block_r=32, block_r_bwd=16, num_warps=4, layout="token_block"),
    BlockSizes(block_n=2, block_r=64, block_r_bwd=16, num_warps=8, layout="token_block"),
    BlockSizes(block_n=4, block_r=16, block_r_bwd=8, num_warps=4, layout="token_block"),
    BlockSizes(block_n=4, block_r=32, block_r_bwd=8, num_warps=8, layout="token_block"))
TOKEN_BLOCK_MAX_R = 64

GIB = 2.0**30


def compile_fn(fn, *args):
  """Ahead-of-time compile: one compilation serves the timing and the memory analysis."""
  return fn.lower(*args).compile()


def time_ms(fn, *args, repeats, inner):
  """Best over `repeats` of the mean time of `inner` back-to-back calls (ms)."""
  jax.block_until_ready(fn(*args))  # warm up
  best = math.inf
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(inner):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / inner)
  return 1e3 * best


def compiled_peak_gib(compiled):
  stats = compiled.memory_analysis()
  if stats is None:
    return float("nan")
  peak = getattr(stats, "peak_memory_in_bytes", 0)
  if not peak:
    peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes
            + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
  return peak / GIB


def device_peak_gib():
  stats = jax.devices()[0].memory_stats()
  if not stats or "peak_bytes_in_use" not in stats:
    return "n/a"
  return f"{stats['peak_bytes_in_use'] / GIB:.2f}"


def copy_gbs(x, *, repeats, inner):
  """Measured bandwidth of x + 1 (one read and one write of x), GB/s."""
  ms = time_ms(compile_fn(jax.jit(lambda a: a + 1), x), x, repeats=repeats, inner=inner)
  return 2 * x.size * x.dtype.itemsize / (ms * 1e-3) / 1e9


# --- readout only ----------------------------------------------------------------------


def readout_inputs(shape: ReadoutShape, dtype):
  keys = jax.random.split(jax.random.key(0), 5)
  q = jax.random.normal(keys[0], (1, shape.N, shape.Hq, shape.dh), dtype)
  mem = jax.random.normal(keys[1], (1, shape.N, shape.R, shape.D), dtype)
  w_k = (jax.random.normal(keys[2], (shape.D, shape.Hkv, shape.dh)) / math.sqrt(shape.D))
  w_v = (jax.random.normal(keys[3], (shape.D, shape.Hkv, shape.dh)) / math.sqrt(shape.D))
  g_o = jax.random.normal(keys[4], q.shape, dtype)
  return (q, mem, w_k.astype(dtype), w_v.astype(dtype)), g_o


def readout_fns(form, b0):
  forward = jax.jit(lambda *a: form(*a, sink_logit=b0, return_lse=True))

  def loss(args, g_o):
    o = form(*args, sink_logit=b0)
    return jnp.sum(o.astype(jnp.float32) * g_o.astype(jnp.float32))

  both = jax.jit(lambda args, g_o: jax.value_and_grad(loss)(args, g_o))
  return forward, both


def bench_readout(shape, forms, *, dtype, repeats, inner, record=None):
  """Prints one table; appends its rows to `record` (a list) when given."""
  record = [] if record is None else record
  args, g_o = readout_inputs(shape, dtype)
  mem = args[1]
  floor_bytes = mem.size * mem.dtype.itemsize
  bandwidth = copy_gbs(mem, repeats=repeats, inner=inner)
  floor_ms = floor_bytes / (bandwidth * 1e9) * 1e3
  print(f"\n### readout {shape.name}: N={shape.N} R={shape.R} Hq={shape.Hq} Hkv={shape.Hkv}"
        f" D={shape.D} dh={shape.dh} {jnp.dtype(dtype).name}")
  print(f"floor: one read of x̂ = {floor_bytes / 1e6:.1f} MB; copy bandwidth {bandwidth:.0f} GB/s"
        f" -> {floor_ms:.3f} ms")
  print("| form | fwd ms | fwd+bwd ms | floor GB/s (fwd) | fwd/floor | compiled GiB | device GiB |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  b0 = sink_logit(shape.R, 0.5)
  for name, form in forms:
    try:
      forward, both = readout_fns(form, b0)
      forward, both = compile_fn(forward, *args), compile_fn(both, args, g_o)
      fwd = time_ms(forward, *args, repeats=repeats, inner=inner)
      fwd_bwd = time_ms(both, args, g_o, repeats=repeats, inner=inner)
      peak = compiled_peak_gib(both)
    except Exception as e:  # one failing form must not hide the others
      error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
      print(f"| {name} | error: {error} |")
      record.append(dict(table=f"readout {shape.name}", form=name, error=error))
      continue
    print(f"| {name} | {fwd:.3f} | {fwd_bwd:.3f} | {floor_bytes / (fwd * 1e-3) / 1e9:.0f} |"
          f" {fwd / floor_ms:.2f} | {peak:.2f} | {device_peak_gib()} |")
    record.append(dict(table=f"readout {shape.name}", form=name, shape=dataclasses.asdict(shape),
                       fwd_ms=fwd, fwd_bwd_ms=fwd_bwd, floor_ms=floor_ms,
                       copy_gbs=bandwidth, compiled_gib=peak, device_gib=device_peak_gib()))


# --- the whole layer ---------------------------------------------------------------


def bench_layer(spec, readouts, *, repeats, inner, record=None):
  """Prints one table; appends its rows to `record` (a list) when given."""
  record = [] if record is None else record
  base, B, T = spec["config"], spec["batch"], spec["time"]
  c = base
  print(f"\n### LngramV2 layer: d={c.d_model} r{c.routes}/m{c.bits}/KV{c.kv_heads}/"
        f"mem{c.mem_dim} orders={c.orders} B={B} T={T} {jnp.dtype(c.dtype).name},"
        f" surrogate={c.surrogate}")
  print("| readout | fwd ms | fwd+bwd ms | compiled GiB | device GiB |")
  print("| --- | --- | --- | --- | --- |")
  kh, kg = jax.random.split(jax.random.key(1))
  h = jax.random.normal(kh, (B, T, c.d_model), c.dtype)
  g = jax.random.normal(kg, (B, T, c.d_model), c.dtype)
  for name in readouts:
    # "<readout>+<surrogate impl>": the layer traced with that backward (DESIGN.md §2.7).
    readout, _, impl = name.partition("+")
    try:
      fwd, fwd_bwd, peak = _time_layer(base.replace(readout=readout), h, g, repeats=repeats,
                                       inner=inner, surrogate_impl=impl or "auto")
    except Exception as e:
      error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
      print(f"| {name} | error: {error} |")
      record.append(dict(table="layer", readout=name, error=error))
      continue
    print(f"| {name} | {fwd:.3f} | {fwd_bwd:.3f} | {peak:.2f} | {device_peak_gib()} |")
    record.append(dict(table="layer", readout=name, d_model=c.d_model, routes=c.routes,
                       batch=B, time=T, dtype=jnp.dtype(c.dtype).name, fwd_ms=fwd,
                       fwd_bwd_ms=fwd_bwd, compiled_gib=peak, device_gib=device_peak_gib()))


def _time_layer(config, h, g, *, repeats, inner, surrogate_impl="auto"):
  """(fwd ms, fwd+bwd ms, compiled GiB) of one LngramV2 layer of `config`."""
  model = LngramV2(config, rngs=nnx.Rngs(0), surrogate_impl=surrogate_impl)
  k_o, k_c = jax.random.split(jax.random.key(2))  # make the zero-init output live
  model.w_o[...] = 0.02 * jax.random.normal(k_o, model.w_o.shape, model.w_o.dtype)
  model.conv_kernel[...] = 0.1 * jax.random.normal(
      k_c, model.conv_kernel.shape, model.conv_kernel.dtype)
  graphdef, params = nnx.split(model)

  def loss(params, h, g, graphdef=graphdef):
    y = nnx.merge(graphdef, params)(h)
    return jnp.sum(y.astype(jnp.float32) * g.astype(jnp.float32))

  forward = compile_fn(
      jax.jit(lambda params, h, graphdef=graphdef: nnx.merge(graphdef, params)(h)),
      params, h)
  both = compile_fn(jax.jit(jax.value_and_grad(loss)), params, h, g)
  fwd = time_ms(forward, params, h, repeats=repeats, inner=inner)
  fwd_bwd = time_ms(both, params, h, g, repeats=repeats, inner=inner)
  peak = compiled_peak_gib(both)
  return fwd, fwd_bwd, peak


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", default="all",
                      choices=["all", "tiny", "layer", *READOUT_SHAPES])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--inner", type=int, default=10)
  parser.add_argument("--forms", default="literal,absorbed,pallas,pallas_fused,pallas_token_block",
                      help="comma-separated subset of literal,absorbed,pallas,pallas_fused,"
                           "pallas_token_block (pallas_fused: layer rows only;"
                           " pallas_token_block: readout rows at R <= 64 only)")
  parser.add_argument("--sweep", action="store_true",
                      help="also time the Pallas readout with the block sizes in SWEEP")
  parser.add_argument("--json", default=None, metavar="PATH",
                      help="also write the rows here (rewritten after each table, so a run"
                           " cut short keeps the tables it finished)")
  args = parser.parse_args(argv)
  unknown = set(args.forms.split(",")) - {"literal", "absorbed", "pallas", "pallas_fused",
                                          "pallas_token_block"}
  if unknown:
    parser.error(f"--forms: unknown {sorted(unknown)}")
  return args


def main(argv=None):
  args = parse_args(argv)
  wanted = args.forms.split(",")

  platform = jax.devices()[0].platform
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind} ({platform})")
  rows = []

  def save():
    if args.json:
      with open(args.json, "w") as f:
        json.dump(dict(jax_version=jax.__version__, platform=platform,
                       device_kind=jax.devices()[0].device_kind, shape=args.shape,
                       repeats=repeats, inner=inner, rows=rows), f, indent=2)

  if platform == "cpu":
    print("NOTE: on CPU the Pallas kernels run in interpret mode; their times measure the"
          " interpreter and mean nothing. Use this only as a smoke run.")
  tiny = args.shape == "tiny"
  repeats, inner = (1, 1) if tiny else (args.repeats, args.inner)

  forms = [(f"xla {n}" if n != "pallas" else n, f) for n, f in (
      ("literal", literal_readout), ("absorbed", absorbed_readout), ("pallas", pallas_readout))
      if n in wanted]
  if args.sweep and "pallas" in wanted:
    forms += [(f"pallas r{b.block_r}/{b.bwd_r} w{b.num_warps}",
               functools.partial(pallas_readout, block_sizes=b)) for b in SWEEP]
  if args.shape in ("all", "layer", "tiny"):
    layer_readouts = [r for r in ("pallas_fused", "pallas", "absorbed", "literal")
                      if r in wanted]
    if "pallas_fused" in wanted:  # its backward with the one-kernel table + surrogate pass
      layer_readouts.insert(1, "pallas_fused+triton")
    bench_layer(TINY_LAYER if tiny else LAYER, layer_readouts, repeats=repeats, inner=inner,
                record=rows)
    save()
  shapes = ([TINY_READOUT] if tiny else list(READOUT_SHAPES.values()) if args.shape == "all"
            else [READOUT_SHAPES[args.shape]] if args.shape in READOUT_SHAPES else [])
  for shape in shapes:
    bench_readout(shape, forms + token_block_forms(shape, wanted, args.sweep),
                  dtype=jnp.bfloat16, repeats=repeats, inner=inner, record=rows)
    save()
  print("\n" + "\n".join(targets.kernel_lines(rows)))   # verdicts from the rows above


def token_block_forms(shape, wanted, sweep):
  """The token-block Pallas rows of one readout table (none above TOKEN_BLOCK_MAX_R)."""
  if "pallas_token_block" not in wanted or shape.R > TOKEN_BLOCK_MAX_R:
    return []
  blocks = [("pallas token_block",
             BlockSizes.get_default("triton", shape.D, layout="token_block"))]
  if sweep:
    blocks += [(f"pallas token_block n{b.block_n} r{b.block_r}/{b.bwd_r} w{b.num_warps}", b)
               for b in TOKEN_BLOCK_SWEEP]
  return [(name, functools.partial(pallas_readout, block_sizes=b)) for name, b in blocks]


if __name__ == "__main__":
  main()
