"""The paper recipes compiled for their TPU chips on this machine: do they fit? (BENCHMARKS.md)

    python -m experiments.tools.bench.tpu_plans --out=experiments/results/records/tpu_plans
    python -m experiments.tools.bench.tpu_plans --out=... --only=pvm8b_sft_v5p8,moe06b_v2_v5p4
    python -m experiments.tools.bench.tpu_plans --out=... --table      the table, from the records
    python -m experiments.tools.bench.tpu_plans --out=... --buffers [--only=...]   what fills
                                                            each peak, from the records

Each recipe is `lngram-exp plan --target=...` (experiments/plan/report.py `plan_run`)
of a config at its own batch and sequence, compiled by the TPU compiler (libtpu,
`pip install -e '.[tpu]'`) for the topology named; nothing is allocated. One JSON
record per recipe (`<out>/<name>.json`: the per-chip peak and its parts, the
usable HBM as the compiler counts it, FITS, collectives, compile seconds, the
projected step time, the largest buffers live at the peak as `plan --explain_memory`
names them, the date, jax and libtpu versions) is written as soon as its
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
# Table 13's Keye30B on Qwen3-VL-30B-A3B's decoder (hf_lngram.py:keye30b), on 64 chips or
# GPUs: one row of 32,768 tokens per expert x fsdp group, Lngram's routes over table.
KEYE30B, KEYE30B_MESH = f"{CONFIGS}/hf_lngram.py:keye30b", "expert=8,fsdp=4,table=2"


def keye30b_depth(layers: int) -> tuple[tuple[str, str], ...]:
  """Overrides planning `layers` of the 48 (all MoE; Lngram in the 2nd and the last), for
  the per-layer growth of the peak that BENCHMARKS.md extrapolates to 48."""
  return (("model.n_layers", str(layers)), ("model.memory_layers", f"(1,{layers - 1})"),
          ("model.moe_layers", str(tuple(range(layers))).replace(" ", "")))


def keye30b_recipes(suffix: str, target: str, unit: str, full: bool) -> tuple[Recipe, ...]:
  """The Keye30B plans at 4 and 8 layers and (`full`) at all 48, for one target. The
  48-layer TPU compile needs more host memory than the planning machine had (BENCHMARKS.md)."""
  what = "Table 13 Keye30B: Qwen3-VL-30B-A3B's decoder + Lngram (R 256), 32 rows x 32,768"
  depths = tuple(Recipe(f"keye30b_l{n}_{suffix}", KEYE30B, KEYE30B_MESH, target,
                        keye30b_depth(n), purpose=f"{what}, {n} of its 48 layers")
                 for n in (4, 8))
  if not full:
    return depths
  return (*depths, Recipe(f"keye30b_{suffix}", KEYE30B, KEYE30B_MESH, target,
                          purpose=f"{what}, all 48 layers, 64 {unit}s"))


@dataclasses.dataclass(frozen=True)
class Recipe:
  name: str
  config: str
  mesh: str
  target: str
  overrides: tuple[tuple[str, str], ...] = ()
  purpose: str = ""
  program: str = "step"   # or "rollout": Stage II's sampling (plan --program=rollout)


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
    Recipe("pvm8b_rollout_v5p8", f"{CONFIGS}/qwen3vl_pvm_grpo.py", "fsdp=8", "v5p:2x2x2",
           purpose="PVM Stage II's rollout: prefill + decode loop, 64 rows to 16,384 new "
           "tokens (rows × cache slots; step s = the rollout's modelled time)",
           program="rollout"),
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
    *keye30b_recipes("v5p64", "v5p:4x4x4", "chip", full=False),
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
  program = [] if recipe.program == "step" else [f"--program={recipe.program}"]
  return " ".join(["lngram-exp plan", f"--config={recipe.config}", f"--mesh={recipe.mesh}",
                   f"--target={recipe.target}", *program,
                   *(f"--config.{k}={v}" for k, v in recipe.overrides)])


def record_of(recipe: Recipe, r: dict) -> dict:
  """The JSON record of one plan (module docstring)."""
  if recipe.program == "rollout":
    return rollout_record_of(recipe, r)
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


def rollout_record_of(recipe: Recipe, r: dict) -> dict:
  """The JSON record of a rollout plan (experiments/plan/rollout.py): the step's fields
  where they have a meaning (batch: rows, seq_len: cache slots a row, tokens: the new
  ones, collectives: the prefill's + max_new_tokens decode steps', step_s: the rollout's
  modelled time) and the rollout's own under "rollout"."""
  v, g = r["verdict"], r["geometry"]
  N = g["new_tokens"]
  moved = {op: r["collectives_prefill"][op] + N * r["collectives_step"][op]
           for op in r["collectives_step"]}
  return {
      "name": recipe.name, "purpose": recipe.purpose, "command": command_of(recipe),
      "program": recipe.program, "config": recipe.config, "mesh": recipe.mesh,
      "target": recipe.target, "overrides": dict(recipe.overrides),
      "chip": r["accelerator"].name, "devices": r["devices"], "batch": g["rows"],
      "seq_len": g["cache_len"], "tokens": g["rows"] * N, "peak_bytes": v["peak"],
      "usable_bytes": v["capacity"], "fits": v["fits"], "lower_bound": v["lower_bound"],
      "memory": {k: r["xla"][k] for k in ("argument", "output", "alias", "temp")},
      "oom": r["oom"], "compile_s": round(r["compile_s"], 1), "collectives": moved,
      "flops_jaxpr": r["flops_jaxpr"], "params": r["params"]["count"],
      "step_s": r["rollout_s"], "mfu": r["mfu"], "compiler": r["compiler"],
      "compiler_notes": r.get("compiler_notes", []), "kernel_calls": _kernel_calls(r),
      "rollout": {"prompt_len": g["prompt_len"], "new_tokens": N, "cache": g["cache"],
                  "cache_per_device": r["cache_device"], "weights": g["weights"],
                  "weights_per_device": g["weights_device"],
                  "decode_step": r["decode_step"], "decode_s": r["decode_s"],
                  "prefill": r["prefill"], "collectives_prefill": r["collectives_prefill"],
                  "collectives_step": r["collectives_step"],
                  "unknown_trips": r["unknown_trips"]},
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
  if recipe.program == "rollout":
    from experiments.plan.rollout import plan_rollout
    r = plan_rollout(config, parse_mesh(recipe.mesh), target=recipe.target,
                     explain_memory=True)
  else:
    r = plan_run(config, parse_mesh(recipe.mesh), target=recipe.target, explain_memory=True)
  return {**record_of(recipe, r), "peak_buffers": peak_buffers_of(r)}


def peak_buffers_of(r: dict) -> dict | None:
  """The plan's largest buffers live at the memory peak (experiments/plan/buffers.py),
  source files relative to the repository; None where the compiler wrote no listing."""
  from experiments.plan.text import _short_path
  peak = r.get("buffers")
  if peak is None:
    return None
  return {"live_bytes": peak["live_bytes"],
          "buffers": [{"bytes": b["bytes"], "shape": b["shape"], "op": b["op"] or b["name"],
                       "source": _short_path(b["source"])} for b in peak["buffers"]]}


def _op_tail(op: str) -> str:
  """A JAX operation name without the step's wrappers (jit, loops, calls): what it did."""
  parts = [p for p in op.split("/") if p and not p.startswith("jit(step")
           and p not in ("while", "body", "closed_call", "cond")]
  return "/".join(parts) or op


def buffer_listing(records: list[dict], recipes=RECIPES, top: int = 5) -> str:
  """Per record with a listing: its peak, what is live there, and the `top` largest
  buffers with the line that made them (BENCHMARKS.md "What fills the peak")."""
  order = {r.name: i for i, r in enumerate(recipes)}
  lines = []
  for rec in sorted(records, key=lambda rec: order.get(rec["name"], len(order))):
    peak = rec.get("peak_buffers")
    if not peak:
      continue
    lines.append(f"- **{rec['name']}** (peak {_gib(rec['peak_bytes'])} GiB, temporaries "
                 f"{_gib(rec['memory']['temp'])}): {_gib(peak['live_bytes'])} GiB live at "
                 f"the peak; the largest:")
    for b in peak["buffers"][:top]:
      op = _op_tail(b["op"])
      lines.append(f"  - {b['bytes'] / 2**20:,.1f} MiB `{b['shape']}` {op} "
                   f"(`{b['source'] or 'no source line'}`)")
  return "\n".join(lines)


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
           "step s (MFU 0.4) | compiled |",
           "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
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
        f"{rec['step_s']:.2f} | {rec.get('date', '')} |")
  return "\n".join(lines)


def parse_args(argv=None, recipes=RECIPES, doc: str = __doc__) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=doc.splitlines()[0])
  p.add_argument("--out", required=True, help="folder of the JSON records")
  p.add_argument("--only", default="", help="comma-separated recipe names (default all)")
  p.add_argument("--table", action="store_true", help="print the table of the records")
  p.add_argument("--force", action="store_true", help="recompile recipes already recorded")
  p.add_argument("--buffers", action="store_true",
                 help="print the largest buffers at each recorded peak, from the records")
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
  if args.table or args.buffers:
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    if args.buffers and args.only:   # the listing of the recipes named
      records = [r for r in records if r["name"] in args.only.split(",")]
    print(table(records, recipes, compiler, unit) if args.table
          else buffer_listing(records, recipes))
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
