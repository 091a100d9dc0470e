"""Sharding benchmark: bytes the collectives move per token, and step-time ratios.

    python -m experiments.tools.bench.sharding                 # both tables
    python -m experiments.tools.bench.sharding --no-timing     # bytes only (compiles, runs nothing)

Bytes are read from the compiled HLO, not estimated: the layer (generic and
route-parallel forms, r64/m4/KV8, d_m 128 so D = 256, Hq 16, d 2048) is
lowered for a mesh of 8 table shards and every all-reduce / all-gather /
collective-permute / reduce-scatter / all-to-all in `compiled.as_text()` is
summed, counting the buffer each device contributes. A forward moves only
per-token data; a training step also all-reduces parameter gradients once per
step, so fwd+bwd is compiled at two token counts and split into a per-token
slope and a per-step constant. Collectives inside loops would be counted once
(the layer has none).

Step times run on host devices (8 by default, set below unless XLA_FLAGS asks
otherwise): they all share this machine's cores, so the ratios show the cost
of the extra collectives and replicated work, not a speed-up.
"""

from __future__ import annotations

import os

_DEVICES_FLAG = "--xla_force_host_platform_device_count"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
  # Read when the CPU backend starts, i.e. at the first device query below.
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICES_FLAG}=8".strip()

import argparse  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from lngram_jax.config import LngramConfig  # noqa: E402
from lngram_jax.layer import LngramV2  # noqa: E402
from lngram_jax.sharding.layer import ShardedLngramV2, shard_layer  # noqa: E402
from lngram_jax.sharding.mesh import (  # noqa: E402
    ShardingConfig,
    layer_param_shardings,
    make_mesh,
    token_spec,
)

PAPER_R64 = LngramConfig(d_model=2048, routes=64, bits=4, orders=(2, 3), mem_dim=128,
                         q_heads=16, kv_heads=8, head_dim=128)
SMALL = LngramConfig(d_model=256, routes=32, bits=3, orders=(2, 3), mem_dim=64, q_heads=8,
                     kv_heads=2, head_dim=32)

_OPS = ("all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all")
_INSTR = re.compile(r"=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<op>" + "|".join(_OPS) + r")\(")
_ARRAY = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f16|f32|f64)\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


_MESH_GROUPS = re.compile(  # `mesh[...]`, maybe `, device_ids=(...)`, then `{axes}`
    r"replica_groups=mesh\[(?P<sizes>[^\]]*)\][^{]*\{(?P<axes>[^}]*)\}")
_SINGLETONS = re.compile(r"replica_groups=(\{\{\d+\}(,\{\d+\})*\}|\[\d+,1\])")


def normalise_hlo(hlo_text: str) -> str:
  """HLO text with every collective on one plain line that `collective_bytes` reads.

  Three things the line parser alone would miscount: tuple shapes of more than five
  elements carry `/*index=5*/` comments (their `=` cuts the shape, so only the
  elements after the last comment are counted: of the one gradient all-reduce
  XLA combines a data-parallel step into, a few scalars);
  replica groups written `mesh['axis_0'=2,...], device_ids=(...) {'axis_0'}` (read
  as group size 1, so an all-gather would count its whole result); and
  collectives over singleton groups (a mesh axis of size 1, e.g. Lngram's psum
  over `table` on a data-only mesh), which move nothing. Here the comments are
  dropped, mesh groups rewritten as `[n,g]<=[N]`, singleton-group lines left out.
  """
  out = []
  for line in hlo_text.splitlines():
    line = re.sub(r"/\*index=\d+\*/", "", line)
    if m := _MESH_GROUPS.search(line):
      sizes = {a: int(n) for a, n in re.findall(r"'([^']+)'=(\d+)", m.group("sizes"))}
      group = int(np.prod([sizes[a] for a in re.findall(r"'([^']+)'", m.group("axes"))]))
      total = int(np.prod(list(sizes.values())))
      line = (f"{line[:m.start()]}replica_groups=[{total // group},{group}]<=[{total}]"
              f"{line[m.end():]}")
    if _SINGLETONS.search(line):
      continue
    out.append(line)
  return "\n".join(out)


def _group_size(line: str) -> int:
  if m := re.search(r"replica_groups=\{\{([0-9,]*)\}", line):
    return len(m.group(1).split(","))
  if m := re.search(r"replica_groups=\[\d+,(\d+)\]", line):
    return int(m.group(1))
  return 1


def collective_bytes(hlo_text: str) -> dict[str, int]:
  """Bytes each device contributes to every collective kind in an HLO module."""
  totals = dict.fromkeys(_OPS, 0)
  for line in normalise_hlo(hlo_text).splitlines():
    m = _INSTR.search(line)
    if m is None:
      continue
    result = sum(_BYTES[dt] * int(np.prod([int(d) for d in dims.split(",") if d]))
                 for dt, dims in _ARRAY.findall(m.group("shape")))
    op = m.group("op")
    if op == "all-gather":  # the result holds every device's piece
      result //= _group_size(line)
    elif op == "reduce-scatter":  # the result is one device's piece of the sum
      result *= _group_size(line)
    totals[op] += result
  return totals


def _abstract_args(config, mesh, sharding, batch, steps):
  abstract = nnx.eval_shape(
      lambda: ShardedLngramV2(config, mesh=mesh, sharding=sharding, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  params = nnx.to_pure_dict(state)
  params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        params, layer_param_shardings(params, mesh, sharding))
  h = jax.ShapeDtypeStruct((batch, steps, config.d_model), config.dtype,
                           sharding=NamedSharding(mesh, token_spec(mesh, sharding, None)))
  return graphdef, params, h


def _loss(graphdef):
  def loss(params, h_BxTxD):
    return jnp.sum(nnx.merge(graphdef, params)(h_BxTxD).astype(jnp.float32))
  return loss


def hlo_bytes(config, mesh, sharding, *, batch, steps, train: bool) -> dict[str, int]:
  graphdef, params, h = _abstract_args(config, mesh, sharding, batch, steps)
  fn = jax.grad(_loss(graphdef), argnums=(0, 1)) if train else _loss(graphdef)
  return collective_bytes(jax.jit(fn).lower(params, h).compile().as_text())


def bytes_per_token(config, mesh, sharding, *, batch=2, steps=64) -> dict[str, float]:
  """Forward bytes/token; fwd+bwd bytes/token (slope) and bytes/step (constant)."""
  tokens = batch * steps  # per device: the mesh here has no data or seq axis
  fwd = sum(hlo_bytes(config, mesh, sharding, batch=batch, steps=steps, train=False).values())
  one = sum(hlo_bytes(config, mesh, sharding, batch=batch, steps=steps, train=True).values())
  two = sum(hlo_bytes(config, mesh, sharding, batch=batch, steps=2 * steps,
                      train=True).values())
  slope = (two - one) / tokens
  return {"fwd": fwd / tokens, "train": slope, "train_per_step": one - slope * tokens}


def _time(fn, *args, reps):
  jax.block_until_ready(fn(*args))  # compile + warm up
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def step_times(config=SMALL, *, batch=8, steps=64, reps=5) -> dict[str, float]:
  """Median fwd+bwd seconds: one device vs layouts on the host-device mesh."""
  layer = nnx.jit(lambda: LngramV2(config, rngs=nnx.Rngs(0)))()
  h = jax.random.normal(jax.random.key(1), (batch, steps, config.d_model), config.dtype)

  def grad_fn(layer_):
    graphdef = nnx.graphdef(layer_)
    return jax.jit(jax.grad(_loss(graphdef), argnums=(0, 1)))

  params = nnx.to_pure_dict(nnx.state(layer))
  out = {"unsharded (1 device)": _time(grad_fn(layer), params, h, reps=reps)}
  layouts = {
      "generic, table=8": (dict(table=8), "generic"),
      "route_parallel, table=8": (dict(table=8), "route_parallel"),
      "route_parallel, data=2 x table=4": (dict(data=2, table=4), "route_parallel"),
      "route_parallel, seq=2 x table=4": (dict(seq=2, table=4), "route_parallel"),
  }
  for name, (axes, mode) in layouts.items():
    sharding = ShardingConfig(mode=mode)
    mesh = make_mesh(**axes, sharding=sharding)
    sharded = shard_layer(layer, mesh=mesh, sharding=sharding)
    h_sharded = jax.device_put(h, NamedSharding(mesh, token_spec(mesh, sharding, None)))
    out[name] = _time(grad_fn(sharded), nnx.to_pure_dict(nnx.state(sharded)), h_sharded,
                      reps=reps)
  return out


def _describe(c: LngramConfig) -> str:
  return (f"R={c.routes}, M={c.bits}, orders={c.orders}, d_m={c.mem_dim} (D={c.route_dim}), "
          f"Hq={c.q_heads}, Hkv={c.kv_heads}, dh={c.head_dim}, d={c.d_model}")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--no-timing", action="store_true", help="bytes only")
  parser.add_argument("--reps", type=int, default=5)
  args = parser.parse_args(argv)
  print(f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices")

  print(f"\nCollective bytes per token, per device, 8 table shards: {_describe(PAPER_R64)}")
  print("| form | fwd B/token | fwd+bwd B/token | fwd+bwd B/step (param grads) |")
  print("| --- | --- | --- | --- |")
  mesh = make_mesh(table=8, devices=jax.devices()[:8])
  rows = {mode: bytes_per_token(PAPER_R64, mesh, ShardingConfig(mode=mode))
          for mode in ("generic", "route_parallel")}
  for mode, r in rows.items():
    print(f"| {mode} | {r['fwd']:,.0f} | {r['train']:,.0f} | {r['train_per_step']:,.0f} |")
  g, p = rows["generic"], rows["route_parallel"]
  print(f"| generic / route_parallel | {g['fwd'] / p['fwd']:.2f}x | {g['train'] / p['train']:.2f}x | |")
  print("float32 activations and tables. (XLA:CPU promotes bf16 all-reduces to f32, so a "
        "bf16 layer compiles to the same bytes here.)")

  if args.no_timing:
    return
  print(f"\nfwd+bwd step time, median of {args.reps}, B=8 T=64: {_describe(SMALL)}")
  times = step_times(reps=args.reps)
  base = times["unsharded (1 device)"]
  print("| layout | ms | ratio to 1 device |")
  print("| --- | --- | --- |")
  for name, seconds in times.items():
    print(f"| {name} | {1e3 * seconds:.1f} | {seconds / base:.2f} |")


if __name__ == "__main__":
  main()
