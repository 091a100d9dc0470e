"""The plan of one run on one mesh: numbers per device, where each comes from, and the text.

    result = plan_run(config, block, accelerator="h100", mfu=0.4, devices=...)
    print(format_plan(result))

Sources, one tag per number in the text:
  [shapes]   the abstract model and optimiser state under the trainer's shardings
             (exact: what each device will hold)
  [formula]  experiments/plan/accounting.py (parameters exact; FLOPs first-principles)
  [estimate] `experiments.jobs.checks.memory_plan`'s activation estimate
  [XLA]      the compiled step's `memory_analysis()` / `cost_analysis()` (per device)
  [HLO]      collectives summed from the compiled HLO (experiments/plan/collectives.py)
  [jaxpr]    matmul FLOPs of the traced step (experiments/plan/jaxpr_flops.py): global,
             independent of how a backend lowers them
  [model]    the projection on the named accelerator (experiments/plan/accelerators.py)
The step is compiled by the target's own compiler (compile.py: XLA:GPU for a GPU target,
XLA:TPU for a TPU topology), or without a target for XLA:CPU host devices, whose
partitioning and collectives are the same program's but whose memory is never a verdict
(`verdict`: then the named chip's own compiler for as many devices, or the estimate).
"""

from __future__ import annotations

import math
import time

from experiments.models.lora import lora_param_count
from experiments.plan import accelerators, gpu, tpu
from experiments.plan.abstract import bytes_per_device
from experiments.plan.collectives import OPS, collective_bytes
from experiments.plan.compile import (  # noqa: F401  (no_compilation_cache: a public name here)
  compile_for_target,
  compiler_of,
  no_compilation_cache,
  own_chip_compile,
  target_chip_and_devices,
  usable_memory,
)
from experiments.plan.jaxpr_flops import jaxpr_flops
from experiments.plan.jobs import planner
from experiments.trainer import placement as mesh_lib


def refuse_mesh(config, block: dict) -> dict[str, int]:
  """The mesh's sizes, or a one-line ValueError naming what does not divide (before any
  device is set up: the checks run on a `jax.sharding.AbstractMesh`)."""
  bad = {a: s for a, s in block.items() if isinstance(s, bool) or not isinstance(s, int)
         or s < 1}
  if bad:
    raise ValueError(f"--mesh: plan needs explicit sizes >= 1, got {bad} (-1 means 'the "
                     "devices left', which depends on the machine).")
  sizes = {a: 1 for a in mesh_lib.AXES} | dict(block)
  mesh_lib.mesh_sizes(sizes, math.prod(sizes.values()))   # unknown axes refused here
  planner(config).check_mesh(config, sizes)
  return sizes


def plan_run(config, block: dict, *, accelerator: str = "h100", mfu: float = 0.4,
             devices=None, target: str | None = None, proxy: bool = False,
             explain_memory: bool = False) -> dict:
  """Every number of the plan (module docstring).

  devices: the CPU devices to compile for (at least the mesh's size; default this
    process's), when there is no `target`.
  target: a TPU topology (`v5p:2x2x2`) or GPU target (`h800:8`, `h800:8x8`): the step
    is compiled by that chip's compiler for its devices, whose count the mesh must
    have, and the chip is the target's.
  proxy: without a target, also compile the step for the named chip's own compiler
    (a GPU: XLA:GPU for as many of them, experiments/plan/gpu.py; a TPU: a topology of
    its generation, experiments/plan/tpu.py), so that the fit verdict never rests on
    XLA:CPU's memory (`verdict`).
  explain_memory: also list the largest buffers live at the compiled step's memory peak
    (experiments/plan/buffers.py), in "buffers"."""
  import jax
  sizes, chip, devices, mesh = plan_mesh(config, block, accelerator=accelerator, mfu=mfu,
                                         target=target, devices=devices)
  n = math.prod(sizes.values())
  compiler = compiler_of(target)
  t0 = time.perf_counter()
  job = planner(config)
  run, mc, geo = job.abstract_run(config, mesh)
  step = compile_for_target(run, compiler=compiler, devices=devices,
                            explain_memory=explain_memory)
  seconds = time.perf_counter() - t0
  memory, cost, compiled, jaxpr = step["memory"], step["cost"], step["compiled"], step["jaxpr"]
  moved = collective_bytes(compiled.as_text()) if compiled is not None else _no_collectives()
  token_shards = math.prod(sizes[a] for a in ("data", "fsdp", "expert", "seq"))
  counted = job.counts(config, run, mc, geo, n, token_shards)
  B, T, vl, estimate = counted["batch"], counted["seq_len"], counted["vl"], counted["estimate"]
  counts = counted["counts"]
  flops = float(cost.get("flops", 0.0))
  # XLA's cost analysis counts a while body once: with grad_accum = k the first micro-batch
  # runs outside the scan and k - 1 inside it, so the count holds two; scale to k (the
  # optimiser update, counted once, is then over-scaled: a fraction of a per cent).
  accum = int(config.train.get("grad_accum", 1))
  if accum > 1:
    flops *= accum / 2
  formula = counted["formula"]
  sent = sum(moved[op] for op in OPS)
  # XLA:CPU lowers jax.lax.ragged_dot (the MoE's grouped dispatch) as a dense product of
  # every slot with every local expert, masked: its FLOPs and temporaries overstate what a
  # GPU/TPU (a grouped matmul) runs, so the step time then rests on the jaxpr's matmuls.
  moe = getattr(run.model, "moe", None)
  dense_ragged = bool(not target and getattr(run.model, "moe_layers", ()) and moe is not None
                      and getattr(moe, "dispatch", "grouped") == "grouped")
  matmul = jaxpr_flops(jaxpr)   # global, backend-independent (experiments/plan/jaxpr_flops.py)
  # The same matmuls as a TPU/GPU compiler's cost analysis sees them (no Pallas kernel's
  # work, each loop body once, the micro-batches scaled as its count is): why XLA's FLOPs
  # differ from the formula's ("why not 1" in the report).
  kernels = compiler == "XLA:CPU"
  seen = {"no_kernels": jaxpr_flops(jaxpr, kernels=kernels),
          "as_compiler": jaxpr_flops(jaxpr, kernels=kernels, loops=False)
          * (accum / 2 if accum > 1 else 1)}
  # The step time rests on the program's matmuls (the jaxpr): XLA's cost analysis counts
  # a loop body once (the chunked cross entropy's chunks, the TPU compiler's windowed
  # collective matmuls), leaves out Pallas kernels (splash, the sink readout) and, on
  # XLA:CPU, computes ragged_dot densely.
  timed_flops = matmul / n
  params = run.state["params"]
  hosts = hosts_of(target)
  result = {
      "block": sizes, "devices": n, "batch": B, "seq_len": T, "tokens": run.tokens,
      "steps": int(config.train.steps), "compile_s": seconds,
      "accelerator": chip, "mfu": mfu, "target": target,
      "compiler": compiler,
      "params": {"count": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
                 "lora": lora_param_count(params),
                 "formula": counts, "bytes": bytes_per_device(params),
                 "experts": routed_expert_bytes(params)},
      "optimizer_bytes": bytes_per_device(run.state["opt_state"]),
      "activations_estimate": estimate["activations"],
      "estimate_peak": estimate["params"] + estimate["optimizer"] + estimate["activations"],
      "xla": {**memory, "flops": flops, "bytes_accessed": float(cost.get("bytes accessed", 0.0))},
      "hbm_usable": usable_memory(target, devices),
      "flops_formula": formula, "flops_jaxpr": matmul, "flops_jaxpr_seen": seen,
      "collectives": moved,
      "collective_bytes": sent, "remat": remat_policy(run.model),
      "dense_ragged": dense_ragged, "grad_accum": accum, "qwen3vl": vl,
      "loss_chunks": loss_chunks(run.model, B, T),
      "hosts": hosts,
      "projection": accelerators.projected_step_s(chip, flops=timed_flops,
                                                  collective_bytes=sent, devices=n, mfu=mfu,
                                                  hosts=hosts),
      "hlo": compiled.as_text() if compiled is not None else step["error"],
      "oom": step["oom"], "compiler_notes": step["notes"],
      "buffers": step["buffers"], "explain_memory": explain_memory,
  }
  result["proxy"] = (own_chip_compile(config, sizes, accelerator) if proxy and not target
                     else None)
  result["verdict"] = verdict(result)
  return result


def plan_mesh(config, block: dict, *, accelerator: str = "h100", mfu: float = 0.4,
              target: str | None = None, devices=None) -> tuple:
  """(sizes, chip, devices, mesh) of a plan (`plan_run`'s arguments): the mesh checked
  against the config, the chip (the target's when given) and the devices compiled for
  (the target's, else this process's CPU devices); one-line errors otherwise."""
  import jax
  chip = accelerators.accelerator(accelerator)
  accelerators.projected_step_s(chip, flops=0.0, collective_bytes=0.0, devices=1, mfu=mfu)
  sizes = refuse_mesh(config, block)
  n = math.prod(sizes.values())
  if target:
    chip, devices = target_chip_and_devices(target)
    if len(devices) != n:
      raise ValueError(f"--mesh has {n} device{'s' if n > 1 else ''} "
                       f"({_mesh_text(sizes)}); --target={target} has {len(devices)}: give "
                       f"axis sizes whose product is {len(devices)}.")
  else:
    devices = list(jax.devices("cpu") if devices is None else devices)
    if len(devices) < n:
      raise ValueError(f"plan: the mesh needs {n} devices, this process has {len(devices)} "
                       "CPU devices (run it through `lngram-exp plan`, which provides them).")
  return sizes, chip, devices, mesh_lib.make_train_mesh(sizes, devices=devices[:n])


def routed_expert_bytes(params) -> tuple[int, int]:
  """(bytes per device, bytes in all) of the MoE layers' routed expert weights
  (`.../mlp/w_gate|w_up|w_down`, [E, ., .]): on an `expert` axis of n each device
  holds 1/n of them (experiments/models/layout.py)."""
  import jax

  from experiments.models.layout import EXPERT_WEIGHTS
  per_device = total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [str(getattr(k, "key", k)) for k in path]
    if len(keys) >= 2 and keys[-2] == "mlp" and keys[-1] in EXPERT_WEIGHTS and leaf.ndim == 3:
      per_device += bytes_per_device([leaf])
      total += leaf.dtype.itemsize * math.prod(leaf.shape)
  return per_device, total


def loss_chunks(model, batch: int, seq_len: int) -> int:
  """Chunks of the cross entropy's scan over time (experiments/models/cross_entropy.py)."""
  from experiments.models.cross_entropy import default_chunk
  return -(-seq_len // default_chunk(batch, seq_len, model.vocab_size))


def _no_collectives() -> dict:
  return {**dict.fromkeys(OPS, 0.0), "unknown_trips": 0}


def _mesh_text(sizes: dict) -> str:
  return ",".join(f"{a}={s}" for a, s in sizes.items() if s > 1) or "one device"


def remat_policy(model) -> str:
  """What the backward keeps of the decoder blocks (LMConfig.remat)."""
  if getattr(model, "remat", False):
    return ("every decoder block rematerialised in order (experiments/models/remat.py): "
            "the backward keeps each block's input and recomputes the rest once the block "
            "above is done")
  return "off: the backward keeps every block's intermediates"


def _gpu_name(chip) -> str | None:
  """The GPU name (h100, ...) of an accelerator row, or None for a TPU."""
  return next((k for k in gpu.GPUS if accelerators.ACCELERATORS[k] == chip), None)


def estimate_capacity(chip, target: str | None = None) -> float:
  """Memory one device may use when no compiler says: a GPU's allocator share of its
  memory (experiments/plan/gpu.py), a TPU device's HBM."""
  name = _gpu_name(chip)
  if name is not None:
    return gpu.usable_bytes(name)
  return chip.hbm_bytes / (tpu.devices_per_chip(target.split(":")[0]) if target else 1)


def verdict(r: dict) -> dict:
  """FITS or DOES NOT FIT, and from what: {"fits", "peak", "capacity", "source",
  "lower_bound"}. Never XLA:CPU's memory: the target's own compile (XLA:TPU or
  XLA:GPU); else the named chip's own compiler for as many devices; else the
  analytic estimate (parameters + optimizer state + activations,
  experiments/jobs/checks.memory_plan)."""
  chip = r["accelerator"]
  if r["target"]:
    is_gpu = gpu.is_gpu_target(r["target"])
    usable = r["hbm_usable"] or estimate_capacity(chip, r["target"])
    peak = r["xla"]["peak"]
    source = (f"XLA:GPU {gpu.parse_target(r['target'])[0]}" if is_gpu
              else f"XLA:TPU {r['target']}")
    return {"fits": peak <= usable and r["oom"] is None, "peak": peak, "capacity": usable,
            "source": source, "lower_bound": r["oom"] is not None}
  capacity = estimate_capacity(chip)
  own = r.get("proxy")
  if own is not None:
    peak = own["memory"]["peak"]
    if own["oom"] is None or peak > capacity:   # an OOM's figure is a lower bound
      return {"fits": peak <= own["usable"] and own["oom"] is None, "peak": peak,
              "capacity": own["usable"], "lower_bound": own["oom"] is not None,
              "source": f"{own['compiler']} {own['target']}"}
  peak = r["estimate_peak"]
  return {"fits": peak <= capacity, "peak": peak, "capacity": capacity,
          "source": "estimate", "lower_bound": False}


def _b(n: float) -> str:
  from experiments.jobs.checks import format_bytes
  return format_bytes(n)


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


def _gib(n: float) -> str:
  return f"{n / 2**30:.1f} GiB"


def _lora_lines(r: dict) -> list[str]:
  """The LoRA factors' count (shapes and formula) when the run trains LoRA."""
  lora = r["params"]["lora"]
  if not lora:
    return []
  formula = r["params"]["formula"].get("lora")
  return [f"  LoRA factors    {lora:>15,} [shapes]"
          + ("" if formula is None else f" = {formula:,} [formula]")
          + "; they train (with any inserted branch), the frozen backbone has no optimizer "
          "state"]


def format_plan(r: dict, name: str = "") -> str:
  """The plan as text: one line per number, per device, with its source tag."""
  chip, proj, xla, n = r["accelerator"], r["projection"], r["xla"], r["devices"]
  mesh = " × ".join(f"{a}={s}" for a, s in r["block"].items() if s > 1) or "one device"
  tag = f"[{r['compiler']}]"
  per_token = xla["flops"] * n / r["tokens"]
  counts = r["params"]["formula"]
  where = _compiled_for(r)
  lines = [
      f"plan of {name or 'the config'} on {mesh} ({n} device{'s' if n > 1 else ''}); "
      f"batch {r['batch']} × {r['seq_len']} = {r['tokens']:,} tokens per step, "
      f"{r['steps']:,} steps",
      f"compiled by {where} in {r['compile_s']:.0f} s (nothing allocated); per device unless "
      "stated:",
      f"parameters        {r['params']['count']:>15,} in all [shapes] = "
      f"{counts['total']:,} [formula]; {_b(r['params']['bytes'])} per device [shapes]",
      *_expert_lines(r),
      *_lora_lines(r),
      f"optimizer state   {_b(r['optimizer_bytes'])} (AdamW moments"
      f"{' of the trained parameters alone' if r['params']['lora'] else ''}) [shapes]",
      f"activations       {_b(r['activations_estimate'])} at this batch [estimate]; "
      f"{_b(xla['temp'])} of step temporaries (activations, gradients, workspace) {tag}",
      f"remat             {r['remat']}",
      *_memory_lines(r),
      *_buffer_lines(r),
  ]
  if r["oom"] is None and not xla["flops"] and r["compiler"] == "XLA:GPU":
    lines += [f"FLOPs per step    no count {tag} (XLA:GPU has no cost analysis); "
              f"{_si(r['flops_formula'])}FLOP [formula]"]
  elif r["oom"] is None:
    lines += [
        f"FLOPs per step    {_si(xla['flops'])}FLOP per device, {_si(xla['flops'] * n)}FLOP "
        f"in all {tag}; {_si(r['flops_formula'])}FLOP [formula]; {r['compiler']} in all ÷ "
        f"formula {xla['flops'] * n / r['flops_formula']:.3f}", *_why_not_one(r)]
  lines += [
      f"matmul FLOPs      {_si(r['flops_jaxpr'])}FLOP per step in all [jaxpr] (÷ formula "
      f"{r['flops_jaxpr'] / r['flops_formula']:.3f}: the formula's matmuls, read from the "
      "program)",
      f"FLOPs per token   {_si(per_token) + 'FLOP ' + tag + '; ' if per_token else ''}"
      f"{_si(r['flops_jaxpr'] / r['tokens'])}FLOP of matmuls [jaxpr]",
      "collectives       " + ", ".join(f"{op} {_b(r['collectives'][op])}" for op in OPS)
      + f" per {_unit(r)}; {_b(r['collective_bytes'])} per step "
      f"[HLO of {r['compiler']}]",
      f"step time         {_t(proj['step_s'])} on {n} × {chip.name} at MFU "
      f"{r['mfu']:.2f} [model]: compute {_t(proj['compute_s'])} (dense bf16 at "
      f"{chip.peak_flops / 1e12:.0f} TFLOP/s) + collectives {_t(proj['comm_s'])} at "
      f"{accelerators.collective_bw(chip, n, r.get('hosts')) / 1e9:.0f} GB/s "
      f"({_link(chip, n, r.get('hosts'))}), "
      "not overlapped",
      f"throughput        {r['tokens'] / proj['step_s']:,.0f} tokens/s; {r['steps']:,} "
      f"steps in {_t(r['steps'] * proj['step_s'])} [model]",
  ]
  if r.get("qwen3vl"):
    _qwen3vl_lines(lines, r)
  if r["grad_accum"] > 1:
    lines.append(f"note: grad_accum={r['grad_accum']}: XLA counts the micro-batch scan's "
                 f"body once; FLOPs {tag} are scaled by {r['grad_accum']}/2")
  if r["compiler"] == "XLA:GPU":
    lines += _gpu_notes(r)
  else:
    lines.append(f"note: the step time uses the [jaxpr] matmul FLOPs ÷ devices; {tag} counts "
                 f"a loop body once (the cross entropy's {r['loss_chunks']} chunk(s) count as "
                 "one) and no Pallas kernel's work")
  if r["dense_ragged"]:
    lines.append("note: XLA:CPU computes the MoE's ragged_dot densely (every slot with every "
                 "local expert), so [XLA:CPU] FLOPs and temporaries overstate the MoE layers")
  if (r["compiler"] == "XLA:TPU" and r["block"].get("expert", 1) > 1
      and r["params"]["experts"][1]):
    lines.append(f"note: on mesh.expert={r['block']['expert']} {tag} FLOPs count every row of "
                 "the MoE's dropless receive buffer (megablox's cost estimate; the kernel "
                 "visits only the rows that arrive), the [jaxpr] count a balanced load's")
  if not r["target"] and r["block"].get("expert", 1) > 1 and r["params"]["experts"][1]:
    lines.append("note: XLA:CPU has no ragged all-to-all: [XLA:CPU]'s all-to-all is the "
                 "dense stand-in (every device sends every other its whole slot buffer); "
                 "TPU and GPU programs move only the routed rows (plan --target)")
  if r["collectives"].get("unknown_trips"):
    lines.append(f"note: {r['collectives']['unknown_trips']} loop(s) of unknown trip count "
                 "hold collectives, counted once")
  return "\n".join(lines)


def _expert_lines(r: dict) -> list[str]:
  """The routed experts' share of the parameters, per device (1/expert of them)."""
  here, total = r["params"]["experts"]
  if not total:
    return []
  n = r["block"].get("expert", 1)
  return [f"  routed experts  {_b(here)} per device of {_b(total)} in all [shapes]: 1/{n} "
          f"of the experts on each device (mesh.expert={n}); their tokens come by all-to-all"
          if n > 1 else f"  routed experts  {_b(here)} per device of {_b(total)} in all "
          "[shapes] (mesh.expert=1: every device holds every expert)"]


def _why_not_one(r: dict) -> list[str]:
  """Why the compiler's FLOPs ÷ the formula's is not 1, from the jaxpr's matmuls counted
  as the formula does, without the Pallas kernels' work, then with each loop body once."""
  seen, formula = r.get("flops_jaxpr_seen"), r["flops_formula"]
  if not seen or not seen["as_compiler"]:
    return []
  compiled = r["xla"]["flops"] * r["devices"]
  kernels = r["compiler"] != "XLA:CPU"
  return [f"  why not 1       the program's matmuls ÷ formula {r['flops_jaxpr'] / formula:.3f} "
          f"[jaxpr]; " + (f"without the Pallas kernels' (no cost analysis counts them) "
                          f"{seen['no_kernels'] / formula:.3f}; " if kernels else "")
          + f"with each loop body once, as {r['compiler']} counts "
          f"{seen['as_compiler'] / formula:.3f}; {r['compiler']}'s count ÷ that {compiled / seen['as_compiler']:.3f} (elementwise "
          "work, work replicated across the mesh, and what the compiler adds or removes)"]


def _buffer_lines(r: dict) -> list[str]:
  """With --explain_memory: the largest buffers live at the memory peak, one a line."""
  if not r.get("explain_memory"):
    return []
  peak = r.get("buffers")
  if peak is None:
    return [f"  at the peak     [{r['compiler']}] wrote no buffer assignment: no listing"]
  lines = [f"  at the peak     {_b(peak['live_bytes'])} of temporaries and outputs live at "
           f"schedule position {peak['time']} [{r['compiler']} buffer assignment]; the "
           f"largest {len(peak['buffers'])}:"]
  for i, b in enumerate(peak["buffers"], 1):
    lines.append(f"    {i:>2}. {_b(b['bytes']):>10}  {b['shape']}  {b['op'] or b['name']}"
                 f"  ({_short_path(b['source']) or 'no source line'})")
  return lines


def _short_path(source: str) -> str:
  """A source line's file relative to the working directory (or after site-packages)."""
  import os
  if not source:
    return ""
  path, _, line = source.rpartition(":")
  if "site-packages/" in path:
    path = path.split("site-packages/", 1)[1]
  elif os.path.isabs(path) and path.startswith(os.getcwd() + os.sep):
    path = os.path.relpath(path)
  return f"{path}:{line}"


def _link(chip, devices: int, hosts: int | None = None) -> str:
  """What the collectives' rate is: the node's links or the network between nodes."""
  if chip.name.startswith("TPU"):
    return "ICI"
  one_node = devices <= chip.node_size if hosts is None else hosts == 1
  return "NVLink" if one_node else "the network between hosts"


def hosts_of(target: str | None) -> int | None:
  """The hosts a GPU target names (`h800:8x8`: 8); None for a TPU or no target."""
  return gpu.parse_target(target)[1] if target and gpu.is_gpu_target(target) else None


def _unit(r: dict) -> str:
  """What one device of the plan is: a GPU, a TPU chip (a v4 core), or a host device."""
  if r["compiler"] == "XLA:GPU":
    return "GPU"
  return "chip" if r["target"] and not r["target"].startswith("v4") else "device"


def _compiled_for(r: dict) -> str:
  chip, n = r["accelerator"], r["devices"]
  if r["compiler"] == "XLA:GPU":
    _, hosts, per_host = gpu.parse_target(r["target"])
    return (f"XLA:GPU for {r['target']} ({n} × {chip.name}"
            f"{f', {hosts} hosts of {per_host}' if hosts > 1 else ''})")
  if r["compiler"] == "XLA:TPU":
    return f"the TPU compiler for {r['target']} ({n} × {chip.name})"
  return f"XLA:CPU for {n} host device{'s' if n > 1 else ''}"


def _usable_text(r: dict, capacity: float) -> str:
  """How much one device may use, and why (a GPU: the allocator's share)."""
  chip = r["accelerator"]
  name = _gpu_name(chip)
  if name is None:
    return f"the {_gib(capacity)} a {chip.name} {_unit(r)} may use"
  return (f"the {_gib(capacity)} one {chip.name} may use ({gpu.MEM_FRACTION_VARIABLE}="
          f"{gpu.memory_fraction():g} of its {_gib(gpu.spec_field(name, 'device_memory_size'))}"
          ": JAX's allocator preallocates that share)")


def _memory_lines(r: dict) -> list[str]:
  """The peak line (the verdict's figure, in GiB, FITS or DOES NOT FIT, and its source)
  and, without a target, XLA:CPU's own peak, shown but never judged."""
  xla, v = r["xla"], r["verdict"]
  word = "FITS" if v["fits"] else "DOES NOT FIT"
  at_least = "at least " if v["lower_bound"] else ""
  if r["target"]:
    how = (f"(arguments {_b(xla['argument'])} + outputs {_b(xla['output'])} - donated "
           f"{_b(xla['alias'])} + temporaries {_b(xla['temp'])})")
    if r["oom"] is not None:
      how = f"(the compiler stopped: {r['oom']['message']})"
    return [f"peak memory       {at_least}{_gib(v['peak'])} per {_unit(r)} [{v['source']}] "
            f"{how}; {word} in {_usable_text(r, v['capacity'])}"]
  source = {"estimate": r.get("estimate_text",
                               "[estimate: parameters + optimizer state + activations]")}.get(
      v["source"], f"[{v['source']}, the chip's own compiler for as many devices]")
  lines = [f"peak memory       {at_least}{_gib(v['peak'])} per device {source}; {word} in "
           f"{_usable_text(r, v['capacity'])}"]
  lines.append(f"XLA:CPU peak      {_b(xla['peak'])} (arguments {_b(xla['argument'])} + outputs "
               f"{_b(xla['output'])} - donated {_b(xla['alias'])} + temporaries) [XLA:CPU]: "
               "XLA:CPU's own schedule, not a verdict (plan --target=<GPU or TPU target> "
               "compiles for the chips)")
  if r.get("proxy") is None and v["source"] == "estimate":
    lines.append(f"note: no compile for {r['accelerator'].name} here: {_why_no_own(r)}; the "
                 "verdict is the estimate's")
  return lines


def _why_no_own(r: dict) -> str:
  n, name = r["devices"], _gpu_name(r["accelerator"])
  if name is not None:
    if not gpu.compiler_available():
      return f"the GPU compiler is not installed ({gpu.EXTRA})"
    return f"{n} GPUs do not fill whole hosts of {gpu.GPUS_PER_HOST}"
  if not tpu.libtpu_available():
    return "the TPU compiler is not installed (pip install -e '.[tpu]')"
  return f"no TPU topology has {n} device{'s' if n > 1 else ''} (4, 8, 16, ...)"


def _gpu_notes(r: dict) -> list[str]:
  """What a GPU program's numbers rest on (experiments/plan/gpu.py)."""
  notes = ["note: the step time uses the [jaxpr] matmul FLOPs ÷ devices (XLA:GPU has no "
           "cost analysis); XLA:GPU compiled without a device, so GEMM tilings are its "
           "defaults (no autotuning): memory and the program are the GPU compiler's"]
  notes += [f"note: {text}" for text in r.get("compiler_notes", ())]
  hlo = r["hlo"] if isinstance(r["hlo"], str) else ""
  kernels = hlo.count(KERNEL_CALL_GPU)
  if kernels:
    notes.append(f"note: {kernels} Pallas Triton kernel call(s) in the program")
  if dense_ragged_dot(hlo):
    notes.append("note: the program holds a jax.lax.ragged_dot, which XLA:GPU computes "
                 "densely (each row against every group's matrix, masked: G times the work "
                 "and the rows' memory); the MoE's grouped matmuls take the Pallas Triton "
                 "kernels (kernels/grouped_matmul) except for float64 or widths their tiles "
                 "do not divide")
  return notes


KERNEL_CALL_GPU = "__gpu$xla.gpu.triton"


def dense_ragged_dot(hlo: str) -> bool:
  """Whether a compiled XLA:GPU program still holds a `ragged_dot` lowered as XLA:GPU
  lowers it in jax 0.10-0.11: a dense product of the rows with every group's matrix,
  named `ragged_dot_general` in its metadata (experiments/plan/gpu.py)."""
  return "ragged_dot_general" in hlo and "gemm_fusion" in hlo


def _qwen3vl_lines(lines: list[str], r: dict) -> None:
  """The Qwen3-VL stage's own lines: parameters by part, what trains, the step's
  geometry, FLOPs by part; inserted after the matching generic lines."""
  g, c, parts = r["qwen3vl"], r["params"]["formula"], r["qwen3vl"]["flops_parts"]
  pvm = "/".join(str(i) for i in g["pvm_layers"]) or "none"

  def after(prefix: str, text: str) -> None:
    at = next((i for i, line in enumerate(lines) if line.startswith(prefix)), len(lines) - 1)
    lines.insert(at + 1, text)

  after("parameters",
        f"  by part         text decoder {c['text']:,} ({g['layers']} layers), vision "
        f"tower {c['vision']:,} ({g['vision_depth']} blocks), PVM {c['pvm']:,} (layers "
        f"{pvm}) [formula]; trainable ({g['trainable_name']}): {g['trainable']:,} "
        "[shapes]; AdamW state only for those")
  after("activations",
        f"  step geometry   {g['rows']} rows × {g['seq_len']:,} tokens; one image per "
        f"row, grid {g['grid'][1]}×{g['grid'][2]} = {g['patches_per_row']} patches -> "
        f"{g['visual_per_row']} visual tokens; {g['rows'] * g['patches_per_row']:,} "
        f"patches per step; PVM reads {g['visual_slots']:,} visual slots per row "
        "(its own image's tokens)")
  after("FLOPs per step",
        f"  by part         text {_si(parts['text'])}FLOP, vision {_si(parts['vision'])}"
        f"FLOP, PVM {_si(parts['pvm'])}FLOP [formula]: 2 per multiply-add forward, 2 "
        "per gradient the step computes (it differentiates the trained parameters only: "
        "no weight gradient of a frozen part, no gradient below the lowest trained one)")
  if g["stage"] == "grpo":
    lines.append(f"note: Stage II plans the policy-gradient step over {g['rows']} rows of "
                 f"[image + {g['seq_len'] - g['new_tokens'] - g['visual_per_row']} prompt "
                 f"tokens (assumed) | {g['new_tokens']:,} completion tokens]; generation "
                 f"(prefill + the decode loop to {g['new_tokens']:,} tokens) is planned by "
                 "plan --program=rollout")
