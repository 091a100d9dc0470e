"""The shipped GPU spec of a chip beside the chip's own target config (run it on the GPU).

    python -m experiments.tools.bench.gpu_spec_check --json spec_check.json      # on a GPU
    python -m experiments.tools.bench.gpu_spec_check --target=h800:1             # on a CPU

`lngram-exp plan --target=h100:8` compiles for the spec in experiments/plan/gpu_specs/
(public figures). On a GPU, XLA:GPU builds its target config from the device itself;
this tool compiles one small program with `--xla_dump_to`, reads the
`*.gpu_target_config.pbtxt` XLA writes beside it, and prints each numeric field of the
device's config next to the shipped spec of the same chip (matched by device kind), so
that a field the plan gets wrong is seen. On a CPU (or with `--target`) it compiles for
the shipped spec itself: a check of the tool, every field equal.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

FIELD = re.compile(r"^\s*(?P<name>[a-z0-9_]+):\s*(?P<value>[\d.]+)\s*$", re.M)
CAPABILITY = re.compile(r"cuda_compute_capability\s*\{(?P<body>[^}]*)\}")
# The fields of gpu_device_info that set memory, tiles and the step-time model's inputs.
FIELDS = ("capability_major", "capability_minor", "core_count", "shared_memory_per_block_optin",
          "shared_memory_per_core", "device_memory_size", "memory_bandwidth", "l2_cache_size",
          "clock_rate_ghz", "fpus_per_core", "registers_per_core_limit")


def fields(text: str) -> dict[str, float]:
  """The numeric fields of a GpuTargetConfigProto's text (the first of each name), the
  compute capability as capability_major / _minor (a field left out is 0 in proto3)."""
  out: dict[str, float] = {}
  capability = CAPABILITY.search(text)
  body = capability.group("body") if capability else ""
  for part in ("major", "minor"):
    m = re.search(rf"{part}:\s*(\d+)", body)
    out[f"capability_{part}"] = float(m.group(1)) if m else 0.0
  for m in FIELD.finditer(CAPABILITY.sub("", text)):
    out.setdefault(m.group("name"), float(m.group("value")))
  return out


def chip_of(device_kind: str) -> str | None:
  """The shipped spec's name for a device kind ("NVIDIA H100 80GB HBM3" -> h100)."""
  from experiments.plan import gpu
  kind = device_kind.lower()
  return next((g for g in gpu.GPUS if g in kind), None)


def device_config(target: str | None, dump_dir: Path) -> tuple[str, str]:
  """(device kind, the target config XLA:GPU compiled a small program for)."""
  import jax
  import jax.numpy as jnp
  if target:
    from experiments.plan import gpu
    device = gpu.target_devices(target)[0]
  else:
    device = jax.devices("gpu")[0]
  x = jax.ShapeDtypeStruct((256, 256), jnp.float32,
                           sharding=jax.sharding.SingleDeviceSharding(device))
  from experiments.plan.compile import compile_for_gpu
  compile_for_gpu(jax.jit(lambda a: a @ a).trace(x), [device])
  dumped = sorted(dump_dir.glob("*gpu_target_config.pbtxt"))
  if not dumped:
    raise SystemExit(f"XLA wrote no target config under {dump_dir}")
  return device.device_kind, dumped[-1].read_text()


def compare(device_kind: str, config_text: str) -> dict:
  from experiments.plan import gpu
  chip = chip_of(device_kind)
  shipped = fields(gpu.target_config(chip)) if chip else {}
  device = fields(config_text)
  rows = [{"field": f, "device": device.get(f), "shipped": shipped.get(f),
           "ratio": (shipped[f] / device[f]) if device.get(f) and shipped.get(f) else None}
          for f in FIELDS]
  return {"device_kind": device_kind, "chip": chip, "rows": rows,
          "usable_bytes_shipped": (gpu.memory_fraction() * shipped["device_memory_size"]
                                   if "device_memory_size" in shipped else None)}


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default=None, help="compile for this shipped spec (h800:1); "
                 "default: the GPU of this machine")
  p.add_argument("--json", default=None, help="write the comparison here")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  dump_dir = Path(tempfile.mkdtemp(prefix="gpu-spec-"))
  flags = os.environ.get("XLA_FLAGS", "")
  os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump_dir}".strip()
  if args.target:
    from experiments.plan.gpu import quiet_cuda_startup
    quiet_cuda_startup()
    import jax
    jax.config.update("jax_platforms", "cpu")
  kind, text = device_config(args.target, dump_dir)
  result = compare(kind, text)
  print(f"{kind} (shipped spec: {result['chip'] or 'none'})")
  print(f"{'field':<32} {'device':>18} {'shipped':>18} {'shipped/device':>15}")
  for row in result["rows"]:
    ratio = "" if row["ratio"] is None else f"{row['ratio']:.4f}"
    device = "-" if row["device"] is None else f"{row['device']:g}"
    shipped = "-" if row["shipped"] is None else f"{row['shipped']:g}"
    print(f"{row['field']:<32} {device:>18} {shipped:>18} {ratio:>15}")
  if args.json:
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
