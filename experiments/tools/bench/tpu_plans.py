"""The paper recipes compiled for their TPU chips on this machine: do they fit? (BENCHMARKS.md)

    python -m experiments.tools.bench.tpu_plans --out=experiments/results/records/tpu_plans
    python -m experiments.tools.bench.tpu_plans --out=... --only=pvm8b_sft_v5p8,moe06b_v2_v5p4
    python -m experiments.tools.bench.tpu_plans --out=... --table      the table, from the records

Each recipe is `lngram-exp plan --target=...` (experiments/plan/report.py `plan_run`)
of a config at its own batch and sequence, compiled by the TPU compiler (libtpu,
`pip install -e '.[tpu]'`) for the topology named; nothing is allocated. One JSON
record per recipe (`<out>/<name>.json`: the per-chip peak and its parts, the
usable HBM as the compiler counts it, FITS, collectives, compile seconds, the
projected step time, the date, jax and libtpu versions) is written as soon as its
compile ends, so a run cut short keeps what it measured; `--table` renders the
records as the markdown table BENCHMARKS.md holds (never typed by hand).
A recipe whose record exists is skipped unless `--force`. Each recipe compiles in a
process of its own (an 8B step's compile holds ~12 GB of host memory, given back when
the process ends).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = "experiments/configs"
MOE06B_VOCAB = (("model.vocab_size", "32768"),)   # the recipe's tokenizer (moe06b_common)
KEYE2B_LONG = (("model.remat", "True"), ("model.max_len", "32768"),
               ("data.batch_size", "8"))


@dataclasses.dataclass(frozen=True)
class Recipe:
  name: str
  config: str
  mesh: str
  target: str
  overrides: tuple[tuple[str, str], ...] = ()
  purpose: str = ""


RECIPES = (
    Recipe("pvm8b_sft_v5p8", f"{CONFIGS}/qwen3vl_pvm_sft.py", "fsdp=8", "v5p:2x2x2",
           purpose="PVM Stage I, Qwen3-VL-8B, 64 rows x 4,096, no accumulation"),
    Recipe("pvm8b_sft_v6e8", f"{CONFIGS}/qwen3vl_pvm_sft.py", "fsdp=8", "v6e:2x4",
           purpose="the same on 32 GB chips"),
    Recipe("pvm8b_grpo_v5p8", f"{CONFIGS}/qwen3vl_pvm_grpo.py", "fsdp=8", "v5p:2x2x2",
           purpose="PVM Stage II (GRPO step), 8 prompts x group 8, 16,384-token completions"),
    Recipe("pvm8b_grpo_accum8_v5p8", f"{CONFIGS}/qwen3vl_pvm_grpo.py", "fsdp=8", "v5p:2x2x2",
           (("train.grad_accum", "8"),),
           purpose="the same step in 8 micro-batches of 8 rows (one row per chip at a time)"),
    Recipe("moe06b_v2_v5p4", f"{CONFIGS}/moe06b_lngram_v2.py", "data=4", "v5p:2x2x1",
           MOE06B_VOCAB, purpose="Table 4 MoE 0.6B + Lngram v2, 32 rows x 4,096"),
    Recipe("moe06b_v1_v5p4", f"{CONFIGS}/moe06b_lngram_v1.py", "data=4", "v5p:2x2x1",
           MOE06B_VOCAB, purpose="Table 4 MoE 0.6B + Lngram v1, 32 rows x 4,096"),
    Recipe("moe06b_v2_data8_v5p8", f"{CONFIGS}/moe06b_lngram_v2.py", "data=8", "v5p:2x2x2",
           MOE06B_VOCAB, purpose="Table 4 MoE 0.6B + Lngram v2 on 8 chips, every chip "
           "every expert"),
    Recipe("moe06b_v2_expert8_v5p8", f"{CONFIGS}/moe06b_lngram_v2.py", "expert=8",
           "v5p:2x2x2", MOE06B_VOCAB, purpose="the same, one expert per chip: tokens to "
           "their experts by all-to-all (dropless)"),
    Recipe("keye2b_8k_v5p8", f"{CONFIGS}/hf_lngram.py:keye2b", "fsdp=8", "v5p:2x2x2",
           (*KEYE2B_LONG, ("data.seq_len", "8192")),
           purpose="App. B Keye2B (Qwen3-1.7B widths) + Lngram, 8 rows x 8,192"),
    Recipe("keye2b_32k_v5p8", f"{CONFIGS}/hf_lngram.py:keye2b", "fsdp=8", "v5p:2x2x2",
           (*KEYE2B_LONG, ("data.seq_len", "32768")),
           purpose="the same at the paper's 32,768 tokens"),
    Recipe("keye2b_r256_table_v5p8", f"{CONFIGS}/hf_lngram.py:keye2b", "fsdp=2,table=4",
           "v5p:2x2x2",
           (*KEYE2B_LONG, ("data.seq_len", "8192"), ("model.memory.routes", "256"),
            ("model.memory.mem_dim", "256"), ("model.memory.readout", "streaming")),
           purpose="Table 13's Keye30B memory (R 256, width 256, streaming) split over table"),
)


def _versions() -> dict:
  from importlib import metadata

  import jax
  out = {"jax": jax.__version__, "python": platform.python_version()}
  for package in ("libtpu", "jax-cuda12-plugin"):
    try:
      out[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
      out[package] = None
  return out


def command_of(recipe: Recipe) -> str:
  return " ".join(["lngram-exp plan", f"--config={recipe.config}", f"--mesh={recipe.mesh}",
                   f"--target={recipe.target}",
                   *(f"--config.{k}={v}" for k, v in recipe.overrides)])


def record_of(recipe: Recipe, r: dict) -> dict:
  """The JSON record of one plan (module docstring)."""
  v = r["verdict"]
  return {
      "name": recipe.name, "purpose": recipe.purpose, "command": command_of(recipe),
      "config": recipe.config, "mesh": recipe.mesh, "target": recipe.target,
      "overrides": dict(recipe.overrides), "chip": r["accelerator"].name,
      "devices": r["devices"], "batch": r["batch"], "seq_len": r["seq_len"],
      "tokens": r["tokens"], "peak_bytes": v["peak"], "usable_bytes": v["capacity"],
      "fits": v["fits"], "lower_bound": v["lower_bound"],
      "memory": {k: r["xla"][k] for k in ("argument", "output", "alias", "temp")},
      "oom": r["oom"], "compile_s": round(r["compile_s"], 1),
      "collectives": {k: v for k, v in r["collectives"].items()},
      "flops_jaxpr": r["flops_jaxpr"], "params": r["params"]["count"],
      "step_s": r["projection"]["step_s"], "mfu": r["mfu"], "remat": r["remat"],
      "compiler": r["compiler"], "compiler_notes": r.get("compiler_notes", []),
      "kernel_calls": _kernel_calls(r),
      "date": datetime.date.today().isoformat(), "host": f"{os.cpu_count()} CPU cores",
      "versions": _versions(),
  }


def _kernel_calls(r: dict) -> int:
  """Pallas kernel calls in the compiled program (Mosaic on TPU, Triton on GPU)."""
  hlo = r["hlo"] if isinstance(r["hlo"], str) else ""
  return hlo.count("tpu_custom_call") + hlo.count("__gpu$xla.gpu.triton")


def run_recipe(recipe: Recipe) -> dict:
  from experiments.cli.overrides import config_from_command_line
  from experiments.plan.report import plan_run
  from experiments.trainer.placement import parse_mesh
  config = config_from_command_line(recipe.config, recipe.overrides)
  r = plan_run(config, parse_mesh(recipe.mesh), target=recipe.target)
  return record_of(recipe, r)


def _gib(n: float) -> str:
  return f"{n / 2**30:.1f}"


def table(records: list[dict], recipes=RECIPES, compiler: str = "XLA:TPU",
          unit: str = "chip") -> str:
  """The markdown table of the records, in `recipes` order. A GPU table (unit "GPU")
  shows every kind of collective; the TPU table its all-to-all (as it always has)."""
  order = {r.name: i for i, r in enumerate(recipes)}
  records = sorted(records, key=lambda rec: order.get(rec["name"], len(order)))
  every = unit == "GPU"
  moved = (f"collectives GiB/{unit}: all-reduce / all-gather / reduce-scatter / all-to-all "
           "/ permute" if every else f"all-to-all MiB/{unit}")
  lines = [f"| recipe | target, mesh | rows × tokens | peak GiB/{unit} [{compiler}] | usable "
           f"GiB | fits | arguments + temporaries GiB | {moved} | compile s | "
           "step s (MFU 0.4) |",
           "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
  for rec in records:
    m, c = rec["memory"], rec["collectives"]
    at_least = "≥ " if rec["lower_bound"] else ""
    kinds = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    sent = (" / ".join(_gib(c.get(k, 0.0)) for k in kinds) if every
            else f"{c.get('all-to-all', 0.0) / 2**20:,.1f}")
    lines.append(
        f"| {rec['name']}: {rec['purpose']} | {rec['target']}, {rec['mesh']} | "
        f"{rec['batch']} × {rec['seq_len']:,} | {at_least}{_gib(rec['peak_bytes'])} | "
        f"{_gib(rec['usable_bytes'])} | {'FITS' if rec['fits'] else 'DOES NOT FIT'} | "
        f"{_gib(m['argument'])} + {_gib(m['temp'])} | {sent} | {rec['compile_s']:.0f} | "
        f"{rec['step_s']:.2f} |")
  return "\n".join(lines)


def parse_args(argv=None, recipes=RECIPES, doc: str = __doc__) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=doc.splitlines()[0])
  p.add_argument("--out", required=True, help="folder of the JSON records")
  p.add_argument("--only", default="", help="comma-separated recipe names (default all)")
  p.add_argument("--table", action="store_true", help="print the table of the records")
  p.add_argument("--force", action="store_true", help="recompile recipes already recorded")
  args = p.parse_args(argv)
  names = [n for n in args.only.split(",") if n]
  unknown = sorted(set(names) - {r.name for r in recipes})
  if unknown:
    p.error(f"unknown recipes {unknown}; known: {[r.name for r in recipes]}")
  return args


def main(argv=None, recipes=RECIPES, module: str = "experiments.tools.bench.tpu_plans",
         doc: str = __doc__, compiler: str = "XLA:TPU", unit: str = "chip") -> int:
  """The command line of this tool and of gpu_plans (its recipes, module and labels)."""
  args = parse_args(argv, recipes, doc)
  out = Path(args.out)
  if args.table:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    print(table(records, recipes, compiler, unit))
    return 0
  out.mkdir(parents=True, exist_ok=True)
  names = [n for n in args.only.split(",") if n] or [r.name for r in recipes]
  pending = []
  for recipe in (r for r in recipes if r.name in names):
    path = out / f"{recipe.name}.json"
    if path.exists() and not args.force:
      print(f"{recipe.name}: recorded ({path}); --force recompiles", flush=True)
    else:
      pending.append(recipe)
  if len(pending) > 1:   # one process each
    failed = 0
    for recipe in pending:
      failed += subprocess.run([sys.executable, "-m", module,
                                f"--out={out}", f"--only={recipe.name}", "--force"],
                               check=False).returncode != 0
    return 1 if failed else 0
  for recipe in pending:
    t0 = time.perf_counter()
    record = run_recipe(recipe)
    (out / f"{recipe.name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{recipe.name}: peak {_gib(record['peak_bytes'])} GiB per {unit} of "
          f"{_gib(record['usable_bytes'])}, {'FITS' if record['fits'] else 'DOES NOT FIT'} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
