"""One MoE layer compiled for TPU chips on this machine: its FLOPs, bytes and all-to-all.

    python -m experiments.tools.bench.moe_dispatch --out=experiments/results/records/moe_dispatch
    python -m experiments.tools.bench.moe_dispatch --out=... --table     the tables, from the records

The layer is the Table 4 recipe's (experiments/configs/moe06b_common.py: d 768,
8 experts, top-2, expert width 1,024, one shared expert of 1,024; bfloat16
activations, float32 weights), forward + backward (the gradient of Σ y·r with
respect to its weights and input), compiled by the TPU compiler (libtpu) for
a topology's devices; nothing runs. Rows:

  one chip (v5p)  the MoE layer (grouped dispatch: megablox in the TPU program)
                  against the dense SwiGLU of equal active parameters (width
                  top_k·H + shared = 3,072), at `--tokens` tokens: XLA:TPU's
                  FLOPs and bytes accessed, and their ratios
  8 chips (v5p)   the MoE layer on mesh data=8 (every chip every expert) and
                  expert=8 (one expert per chip; tokens travel by ragged
                  all-to-all), `--tokens` tokens per chip: per chip, FLOPs,
                  bytes accessed, all-to-all and all-reduce bytes, the routed
                  experts' weight bytes, the compiler's peak memory; and
                  expert=8 with capacity_factor 1.25 (a chip receives at most
                  1.25× its slots, the rest dropped)

FLOPs of a Pallas kernel are its cost estimate (megablox: 2·rows·K·N per
grouped product). On expert=8 a chip's receive buffer holds 8× its slots (the
dropless worst case: every chip's every slot for this chip), and megablox's
estimate counts every buffer row while the kernel visits only the rows that
arrived: that row's FLOPs overstate the work 8× for the grouped products.
One JSON record per row (`<out>/<name>.json`, with the date, the host and the
versions); `--table` renders them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

D, E, K, H, SHARED = 768, 8, 2, 1024, 1
TOPOLOGY_1, TOPOLOGY_8 = "v5p:2x2x1", "v5p:2x2x2"
CAPACITY = 1.25   # the capacity-factor row: each chip receives at most 1.25 × its slots


def _layers(capacity_factor: float = 0.0):
  import jax.numpy as jnp
  from flax import nnx

  from experiments.models.layers import SwiGLU
  from experiments.models.moe import MoEConfig, MoEFFN
  config = MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=H,
                     n_shared_experts=SHARED, shared_ffn_dim=H, capacity_factor=capacity_factor)
  moe = nnx.eval_shape(lambda: MoEFFN(config, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                                      rngs=nnx.Rngs(0)))
  dense = nnx.eval_shape(lambda: SwiGLU(D, K * H + config.shared_width, dtype=jnp.bfloat16,
                                        param_dtype=jnp.float32, init_std=0.02, out_std=0.02,
                                        rngs=nnx.Rngs(0)))
  return moe, dense


def _compile(module, call, devices, mesh_block: dict, tokens_per_chip: int) -> dict:
  """fwd + bwd of `call(module, x)` compiled for `devices`; the compiler's figures."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from experiments.jobs.abstract import bytes_per_device
  from experiments.models.layout import BATCH_AXES, EXPERT_WEIGHTS
  from experiments.plan.collectives import collective_bytes
  from experiments.plan.report import no_compilation_cache
  from experiments.trainer import placement

  mesh = placement.make_train_mesh(mesh_block, devices=devices)
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  specs = placement.param_specs(params, mesh)
  if int(mesh.shape["expert"]) > 1:   # the layer's own weights, as the LM's rules place them
    specs |= {w: P("expert", None, None) for w in EXPERT_WEIGHTS}
  params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                          sharding=NamedSharding(mesh, s)),
                        params, specs)
  rows = len(devices)
  x = jax.ShapeDtypeStruct((rows, tokens_per_chip, D), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P(BATCH_AXES, None, None)))
  on_mesh = mesh if len(devices) > 1 else None

  def step(params, x_BxTxD):
    def objective(params, x_BxTxD):
      model = nnx.merge(graphdef, nnx.State(params), rest)
      y = call(model, x_BxTxD, on_mesh)
      return jnp.sum(y.astype(jnp.float32) * x_BxTxD.astype(jnp.float32))
    return jax.grad(objective, argnums=(0, 1))(params, x_BxTxD)

  with no_compilation_cache():
    compiled = jax.jit(step).trace(params, x).lower().compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  m = compiled.memory_analysis()
  moved = collective_bytes(compiled.as_text())
  return {"flops": float(cost.get("flops", 0.0)),
          "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
          "all_to_all": moved["all-to-all"], "all_reduce": moved["all-reduce"],
          "expert_bytes": bytes_per_device([params[w] for w in EXPERT_WEIGHTS]),
          "param_bytes": bytes_per_device(params),
          "peak": (m.argument_size_in_bytes + m.output_size_in_bytes
                   - m.alias_size_in_bytes + m.temp_size_in_bytes),
          "ragged_all_to_all": compiled.as_text().count("ragged-all-to-all(")}


def measure(tokens: int) -> list[dict]:
  from experiments.plan import tpu
  moe, dense = _layers()
  capped, _ = _layers(CAPACITY)
  moe_call = lambda m, x, mesh: m(x, mesh=mesh)[0]   # noqa: E731
  dense_call = lambda m, x, mesh: m(x)               # noqa: E731
  one = tpu.topology_devices(TOPOLOGY_1)[:1]
  eight = tpu.topology_devices(TOPOLOGY_8)
  cases = [("dense_ffn_1chip", dense, dense_call, one, {}, TOPOLOGY_1),
           ("moe_layer_1chip", moe, moe_call, one, {}, TOPOLOGY_1),
           ("moe_layer_data8", moe, moe_call, eight, {"data": 8}, TOPOLOGY_8),
           ("moe_layer_expert8", moe, moe_call, eight, {"expert": 8}, TOPOLOGY_8),
           (f"moe_layer_expert8_capacity{CAPACITY}", capped, moe_call, eight, {"expert": 8},
            TOPOLOGY_8)]
  out = []
  for name, module, call, devices, block, topology in cases:
    r = _compile(module, call, devices, block, tokens)
    out.append({"name": name, "topology": topology, "mesh": block or {"chips": 1},
                "tokens_per_chip": tokens, **r, **_provenance(tokens)})
    print(f"{name}: {r['flops'] / 1e9:.1f} GFLOP, {r['bytes_accessed'] / 2**20:.0f} MiB "
          f"accessed, all-to-all {r['all_to_all'] / 2**20:.1f} MiB per chip", flush=True)
  return out


def _provenance(tokens: int) -> dict:
  from importlib import metadata

  import jax
  try:
    libtpu = metadata.version("libtpu")
  except metadata.PackageNotFoundError:
    libtpu = None
  return {"date": datetime.date.today().isoformat(), "host": f"{os.cpu_count()} CPU cores",
          "command": f"python -m experiments.tools.bench.moe_dispatch --tokens={tokens} --out=...",
          "versions": {"jax": jax.__version__, "libtpu": libtpu,
                       "python": platform.python_version()}}


def table(records: list[dict]) -> str:
  """Two markdown tables: one chip (MoE ÷ dense), and 8 chips (data=8 against expert=8)."""
  by = {r["name"]: r for r in records}
  lines = []
  dense, moe = by.get("dense_ffn_1chip"), by.get("moe_layer_1chip")
  if dense and moe:
    lines += ["| one chip (v5p), fwd + bwd | GFLOP [XLA:TPU] | MiB accessed | ÷ dense FLOPs | "
              "÷ dense bytes |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in (dense, moe):
      lines.append(f"| {r['name']} ({r['tokens_per_chip']:,} tokens) | {r['flops'] / 1e9:.1f} | "
                   f"{r['bytes_accessed'] / 2**20:,.0f} | {r['flops'] / dense['flops']:.2f} | "
                   f"{r['bytes_accessed'] / dense['bytes_accessed']:.2f} |")
  rows = [by[n] for n in ("moe_layer_data8", "moe_layer_expert8",
                           f"moe_layer_expert8_capacity{CAPACITY}") if n in by]
  if rows:
    lines += ["", "| 8 chips (v5p:2x2x2), fwd + bwd, per chip | GFLOP [XLA:TPU] | all-to-all MiB | "
              "all-reduce MiB | routed experts MiB | peak MiB | ragged all-to-alls |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
      lines.append(f"| {r['name']} ({r['tokens_per_chip']:,} tokens per chip) | "
                   f"{r['flops'] / 1e9:.1f} | {r['all_to_all'] / 2**20:.1f} | "
                   f"{r['all_reduce'] / 2**20:.1f} | {r['expert_bytes'] / 2**20:.1f} | "
                   f"{r['peak'] / 2**20:,.0f} | {r['ragged_all_to_all']} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True, help="folder of the JSON records")
  p.add_argument("--tokens", type=int, default=8192, help="tokens per chip")
  p.add_argument("--table", action="store_true", help="print the tables of the records")
  args = p.parse_args(argv)
  out = Path(args.out)
  if args.table:
    print(table([json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]))
    return 0
  out.mkdir(parents=True, exist_ok=True)
  for record in measure(args.tokens):
    (out / f"{record['name']}.json").write_text(json.dumps(record, indent=1) + "\n")
  print(table([json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
