"""The plan as text (`lngram-exp plan`'s output): one line per number, per device, with
its source tag (report.py lists the tags).

    print(format_plan(plan_run(config, block, ...), name))
"""

from __future__ import annotations

from experiments.plan import accelerators, gpu, tpu
from experiments.plan.collectives import OPS
from experiments.plan.report import gpu_name


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
  name = gpu_name(chip)
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
  n, name = r["devices"], gpu_name(r["accelerator"])
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
