"""The plan of one run on one mesh: numbers per device, where each comes from, and the text.

    result = plan_run(config, block, accelerator="h100", mfu=0.4, devices=...)
    print(format_plan(result))

Sources, one tag per number in the text:
  [shapes]   the abstract model and optimiser state under the trainer's shardings
             (exact: what each device will hold)
  [formula]  experiments/plan/accounting.py (parameters exact; FLOPs first-principles)
  [estimate] `experiments.tasks.checks.memory_plan`'s activation estimate
  [XLA]      the compiled step's `memory_analysis()` / `cost_analysis()` (per device)
  [HLO]      collectives summed from the compiled HLO (experiments/plan/collectives.py)
  [jaxpr]    matmul FLOPs of the traced step (experiments/plan/jaxpr_flops.py): global,
             independent of how a backend lowers them
  [model]    the projection on the named accelerator (experiments/plan/accelerators.py)
The step is compiled for XLA:CPU host devices standing in for the accelerators: the
partitioning, the collectives and the buffer sizes are those of the same program,
but a GPU/TPU compiler fuses differently, so temporaries and peak are indicative.
"""

from __future__ import annotations

import math
import time

from experiments.plan import accelerators
from experiments.plan.abstract import abstract_run, bytes_per_device, compile_step
from experiments.plan.accounting import param_count, train_flops
from experiments.plan.collectives import OPS, collective_bytes
from experiments.plan.jaxpr_flops import jaxpr_flops
from experiments.tasks import checks
from experiments.trainer import placement as mesh_lib


def refuse_mesh(config, block: dict) -> dict[str, int]:
  """The mesh's sizes, or a one-line ValueError naming what does not divide (before any
  device is set up: the checks run on a `jax.sharding.AbstractMesh`)."""
  from jax.sharding import AbstractMesh

  from experiments.plan.abstract import model_config
  bad = {a: s for a, s in block.items() if isinstance(s, bool) or not isinstance(s, int)
         or s < 1}
  if bad:
    raise ValueError(f"--mesh: plan needs explicit sizes >= 1, got {bad} (-1 means 'the "
                     "devices left', which depends on the machine).")
  sizes = {a: 1 for a in mesh_lib.AXES} | dict(block)
  mesh_lib.mesh_sizes(sizes, math.prod(sizes.values()))   # unknown axes refused here
  if "qwen3vl" in config:
    from experiments.plan.qwen3vl import check_qwen3vl_mesh
    check_qwen3vl_mesh(config, sizes)
    return sizes
  mesh = AbstractMesh(tuple(sizes[a] for a in mesh_lib.AXES), tuple(mesh_lib.AXES))
  model = model_config(config)
  checks.check_fits(mesh, batch_size=int(config.data.batch_size),
                    seq_len=int(config.data.seq_len), memory=model.memory)
  experts = sizes.get("expert", 1)
  moe = getattr(model, "moe", None)
  if experts > 1 and moe is not None and moe.n_experts % experts:
    raise ValueError(f"model.moe.n_experts={moe.n_experts} must be a multiple of "
                     f"mesh.expert={experts} (each device holds whole experts).")
  return sizes


def plan_run(config, block: dict, *, accelerator: str = "h100", mfu: float = 0.4,
             devices=None) -> dict:
  """Every number of the plan (module docstring); `devices`: the CPU devices to
  compile for (at least the mesh's size; default this process's)."""
  import jax
  chip = accelerators.accelerator(accelerator)
  accelerators.projected_step_s(chip, flops=0.0, collective_bytes=0.0, devices=1, mfu=mfu)
  sizes = refuse_mesh(config, block)
  n = math.prod(sizes.values())
  devices = list(jax.devices("cpu") if devices is None else devices)
  if len(devices) < n:
    raise ValueError(f"plan: the mesh needs {n} devices, this process has {len(devices)} "
                     "CPU devices (run it through `lngram-exp plan`, which provides them).")
  mesh = mesh_lib.make_train_mesh(sizes, devices=devices[:n])
  t0 = time.perf_counter()
  vl = None
  if "qwen3vl" in config:
    from experiments.plan import qwen3vl
    run, mc, geo = qwen3vl.qwen3vl_abstract_run(config, mesh)
  else:
    run = abstract_run(config, mesh)
  compiled, jaxpr = compile_step(run)
  seconds = time.perf_counter() - t0
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  moved = collective_bytes(compiled.as_text())
  token_shards = math.prod(sizes[a] for a in ("data", "fsdp", "seq"))
  B, T = int(config.data.batch_size), int(config.data.seq_len)
  if "qwen3vl" in config:
    counts = qwen3vl.qwen3vl_param_count(mc)
    parts = qwen3vl.qwen3vl_train_flops(mc, geo)
    B, T = geo["rows"], geo["seq_len"]
    estimate = {"activations": qwen3vl.activations_estimate(mc, geo, token_shards)}
    vl = {**geo, "flops_parts": parts, "layers": mc.text.n_layers,
          "pvm_layers": tuple(mc.text.ffn_branch_layers), "vision_depth": mc.vision.depth}
  else:
    estimate = checks.memory_plan(config, n, token_shards=token_shards)
    counts = param_count(run.model)
  flops = float(cost.get("flops", 0.0))
  # XLA's cost analysis counts a while body once: with grad_accum = k the first micro-batch
  # runs outside the scan and k - 1 inside it, so the count holds two; scale to k (the
  # optimiser update, counted once, is then over-scaled: a fraction of a per cent).
  accum = int(config.train.get("grad_accum", 1))
  if accum > 1:
    flops *= accum / 2
  formula = vl["flops_parts"]["total"] if vl else train_flops(run.model, batch=B, seq_len=T)
  sent = sum(moved[op] for op in OPS)
  # XLA:CPU lowers jax.lax.ragged_dot (the MoE's grouped dispatch) as a dense product of
  # every slot with every local expert, masked: its FLOPs and temporaries overstate what a
  # GPU/TPU (a grouped matmul) runs, so the step time then rests on the jaxpr's matmuls.
  moe = getattr(run.model, "moe", None)
  dense_ragged = bool(getattr(run.model, "moe_layers", ()) and moe is not None
                      and getattr(moe, "dispatch", "grouped") == "grouped")
  matmul = jaxpr_flops(jaxpr)   # global, backend-independent (experiments/plan/jaxpr_flops.py)
  timed_flops = matmul / n if dense_ragged else flops
  peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes
          - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
  params = run.state["params"]
  return {
      "block": sizes, "devices": n, "batch": B, "seq_len": T, "tokens": run.tokens,
      "steps": int(config.train.steps), "compile_s": seconds,
      "accelerator": chip, "mfu": mfu,
      "params": {"count": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
                 "formula": counts, "bytes": bytes_per_device(params)},
      "optimizer_bytes": bytes_per_device(run.state["opt_state"]),
      "activations_estimate": estimate["activations"],
      "xla": {"argument": memory.argument_size_in_bytes, "output": memory.output_size_in_bytes,
              "alias": memory.alias_size_in_bytes, "temp": memory.temp_size_in_bytes,
              "peak": peak, "flops": flops,
              "bytes_accessed": float(cost.get("bytes accessed", 0.0))},
      "flops_formula": formula, "flops_jaxpr": matmul, "collectives": moved,
      "collective_bytes": sent,
      "dense_ragged": dense_ragged, "grad_accum": accum, "qwen3vl": vl,
      "projection": accelerators.projected_step_s(chip, flops=timed_flops,
                                                  collective_bytes=sent, devices=n, mfu=mfu),
  }


def _b(n: float) -> str:
  return checks.format_bytes(n)


def _si(n: float) -> str:
  for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(n) >= size:
      return f"{n / size:.3g} {unit}"
  return f"{n:.3g} "


def _t(seconds: float) -> str:
  for unit, size in (("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
    if seconds >= size or unit == "µs":
      value = seconds / size
      return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
  return ""


def format_plan(r: dict, name: str = "") -> str:
  """The plan as text: one line per number, per device, with its source tag."""
  chip, proj, xla, n = r["accelerator"], r["projection"], r["xla"], r["devices"]
  mesh = " × ".join(f"{a}={s}" for a, s in r["block"].items() if s > 1) or "one device"
  per_token = xla["flops"] * n / r["tokens"]
  fits = "fits" if xla["peak"] <= chip.hbm_bytes else "DOES NOT FIT"
  counts = r["params"]["formula"]
  lines = [
      f"plan of {name or 'the config'} on {mesh} ({n} device{'s' if n > 1 else ''}); "
      f"batch {r['batch']} × {r['seq_len']} = {r['tokens']:,} tokens per step, "
      f"{r['steps']:,} steps",
      f"compiled for {n} XLA:CPU host device{'s' if n > 1 else ''} in {r['compile_s']:.0f} s "
      "(nothing allocated); per device unless stated:",
      f"  parameters        {r['params']['count']:>15,} in all [shapes] = "
      f"{counts['total']:,} [formula]; {_b(r['params']['bytes'])} per device [shapes]",
      f"  optimizer state   {_b(r['optimizer_bytes'])} (AdamW moments) [shapes]",
      f"  activations       {_b(r['activations_estimate'])} at this batch [estimate]; "
      f"{_b(xla['temp'])} of step temporaries (activations, gradients, workspace) [XLA]",
      f"  peak memory       {_b(xla['peak'])} (arguments {_b(xla['argument'])} + outputs "
      f"{_b(xla['output'])} - donated {_b(xla['alias'])} + temporaries) [XLA]; {fits} in "
      f"{chip.name}'s {_b(chip.hbm_bytes)}",
      f"  FLOPs per step    {_si(xla['flops'])}FLOP per device, {_si(xla['flops'] * n)}FLOP "
      f"in all [XLA]; {_si(r['flops_formula'])}FLOP [formula]; XLA in all ÷ formula "
      f"{xla['flops'] * n / r['flops_formula']:.3f} (above 1: elementwise work, or work "
      "replicated across the mesh)",
      f"  matmul FLOPs      {_si(r['flops_jaxpr'])}FLOP per step in all [jaxpr] (÷ formula "
      f"{r['flops_jaxpr'] / r['flops_formula']:.3f}: the formula's matmuls, read from the "
      "program)",
      f"  FLOPs per token   {_si(per_token)}FLOP [XLA]; {_si(r['flops_jaxpr'] / r['tokens'])}"
      "FLOP of matmuls [jaxpr]",
      "  collectives       " + (", ".join(
          f"{op} {_b(r['collectives'][op])}" for op in OPS if r["collectives"][op])
          or "none") + f"; {_b(r['collective_bytes'])} per step [HLO]",
      f"  step time         {_t(proj['step_s'])} on {n} × {chip.name} at MFU "
      f"{r['mfu']:.2f} [model]: compute {_t(proj['compute_s'])} (peak "
      f"{chip.peak_flops / 1e12:.0f} TFLOP/s bf16) + collectives {_t(proj['comm_s'])} at "
      f"{accelerators.collective_bw(chip, n) / 1e9:.0f} GB/s, not overlapped",
      f"  throughput        {r['tokens'] / proj['step_s']:,.0f} tokens/s; {r['steps']:,} "
      f"steps in {_t(r['steps'] * proj['step_s'])} [model]",
  ]
  if r.get("qwen3vl"):
    _qwen3vl_lines(lines, r)
  if r["grad_accum"] > 1:
    lines.append(f"  note: grad_accum={r['grad_accum']}: XLA counts the micro-batch scan's "
                 f"body once; FLOPs [XLA] are scaled by {r['grad_accum']}/2")
  if r["dense_ragged"]:
    lines.append("  note: XLA:CPU computes the MoE's ragged_dot densely (every slot with every "
                 "local expert), so [XLA] FLOPs and temporaries overstate the MoE layers; the "
                 "step time uses the [jaxpr] FLOPs ÷ devices")
  if r["collectives"].get("unknown_trips"):
    lines.append(f"  note: {r['collectives']['unknown_trips']} loop(s) of unknown trip count "
                 "hold collectives, counted once")
  return "\n".join(lines)


def _qwen3vl_lines(lines: list[str], r: dict) -> None:
  """The Qwen3-VL stage's own lines: parameters by part, what trains, the step's
  geometry, FLOPs by part; inserted after the matching generic lines."""
  g, c, parts = r["qwen3vl"], r["params"]["formula"], r["qwen3vl"]["flops_parts"]
  pvm = "/".join(str(i) for i in g["pvm_layers"]) or "none"

  def after(prefix: str, text: str) -> None:
    lines.insert(next(i for i, line in enumerate(lines) if line.startswith(prefix)) + 1, text)

  after("  parameters",
        f"    by part         text decoder {c['text']:,} ({g['layers']} layers), vision "
        f"tower {c['vision']:,} ({g['vision_depth']} blocks), PVM {c['pvm']:,} (layers "
        f"{pvm}) [formula]; trainable ({g['trainable_name']}): {g['trainable']:,} "
        "[shapes]; AdamW state only for those")
  after("  activations",
        f"    step geometry   {g['rows']} rows × {g['seq_len']:,} tokens; one image per "
        f"row, grid {g['grid'][1]}×{g['grid'][2]} = {g['patches_per_row']} patches -> "
        f"{g['visual_per_row']} visual tokens; {g['rows'] * g['patches_per_row']:,} "
        f"patches per step; PVM reads {g['visual_slots']:,} visual slots per row "
        "(under jit: min(T, the step's visual tokens), masked)")
  after("  FLOPs per step",
        f"    by part         text {_si(parts['text'])}FLOP, vision {_si(parts['vision'])}"
        f"FLOP, PVM {_si(parts['pvm'])}FLOP [formula]: 2 per multiply-add forward, 2 "
        "per gradient the step computes (it differentiates the trained parameters only: "
        "no weight gradient of a frozen part, no gradient below the lowest trained one)")
  if g["stage"] == "grpo":
    lines.append(f"  note: Stage II plans the policy-gradient step over {g['rows']} rows of "
                 f"[image + {g['seq_len'] - g['new_tokens'] - g['visual_per_row']} prompt "
                 f"tokens (assumed) | {g['new_tokens']:,} completion tokens]; generation "
                 f"(prefill + {g['new_tokens']:,} cached decode steps) not planned")
