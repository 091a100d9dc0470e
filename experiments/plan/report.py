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
The step is compiled for XLA:CPU host devices standing in for the accelerators: the
partitioning, the collectives and the buffer sizes are those of the same program,
but a GPU/TPU compiler fuses differently, so temporaries and peak are indicative.
"""

from __future__ import annotations

import contextlib
import math
import time

from experiments.plan import accelerators, tpu
from experiments.plan.abstract import FAST_COMPILE, bytes_per_device
from experiments.plan.collectives import OPS, collective_bytes
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
             devices=None, target: str | None = None, proxy: bool = False) -> dict:
  """Every number of the plan (module docstring).

  devices: the CPU devices to compile for (at least the mesh's size; default this
    process's), when there is no `target`.
  target: a TPU topology (`v5p:2x2x2`): the step is compiled by the TPU compiler for its
    devices, whose count the mesh must have, and the chip is that generation's.
  proxy: without a target, also compile the step for a TPU topology of the same device
    count as a stand-in for the named chip (experiments/plan/tpu.py; needs libtpu), so
    that the fit verdict never rests on XLA:CPU's memory (`verdict`)."""
  import jax
  chip = accelerators.accelerator(accelerator)
  accelerators.projected_step_s(chip, flops=0.0, collective_bytes=0.0, devices=1, mfu=mfu)
  sizes = refuse_mesh(config, block)
  n = math.prod(sizes.values())
  if target:
    generation, _ = tpu.parse_topology(target)
    chip = accelerators.accelerator(tpu.ACCELERATOR[generation])
    devices = tpu.topology_devices(target)
    if len(devices) != n:
      raise ValueError(f"--mesh has {n} device{'s' if n > 1 else ''} "
                       f"({_mesh_text(sizes)}); --target={target} has {len(devices)}: give "
                       f"axis sizes whose product is {len(devices)}.")
  else:
    devices = list(jax.devices("cpu") if devices is None else devices)
    if len(devices) < n:
      raise ValueError(f"plan: the mesh needs {n} devices, this process has {len(devices)} "
                       "CPU devices (run it through `lngram-exp plan`, which provides them).")
  mesh = mesh_lib.make_train_mesh(sizes, devices=devices[:n])
  t0 = time.perf_counter()
  job = planner(config)
  run, mc, geo = job.abstract_run(config, mesh)
  step = compile_for_target(run, on_tpu=bool(target))
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
  # The step time rests on the program's matmuls (the jaxpr): XLA's cost analysis counts
  # a loop body once (the chunked cross entropy's chunks, the TPU compiler's windowed
  # collective matmuls), leaves out Pallas kernels (splash, the sink readout) and, on
  # XLA:CPU, computes ragged_dot densely.
  timed_flops = matmul / n
  params = run.state["params"]
  result = {
      "block": sizes, "devices": n, "batch": B, "seq_len": T, "tokens": run.tokens,
      "steps": int(config.train.steps), "compile_s": seconds,
      "accelerator": chip, "mfu": mfu, "target": target,
      "compiler": "XLA:TPU" if target else "XLA:CPU",
      "params": {"count": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
                 "formula": counts, "bytes": bytes_per_device(params),
                 "experts": routed_expert_bytes(params)},
      "optimizer_bytes": bytes_per_device(run.state["opt_state"]),
      "activations_estimate": estimate["activations"],
      "estimate_peak": estimate["params"] + estimate["optimizer"] + estimate["activations"],
      "xla": {**memory, "flops": flops, "bytes_accessed": float(cost.get("bytes accessed", 0.0))},
      "hbm_usable": tpu.usable_hbm(devices) if target else None,
      "flops_formula": formula, "flops_jaxpr": matmul, "collectives": moved,
      "collective_bytes": sent, "remat": remat_policy(run.model),
      "dense_ragged": dense_ragged, "grad_accum": accum, "qwen3vl": vl,
      "loss_chunks": loss_chunks(run.model, B, T),
      "projection": accelerators.projected_step_s(chip, flops=timed_flops,
                                                  collective_bytes=sent, devices=n, mfu=mfu),
      "hlo": compiled.as_text() if compiled is not None else step["error"],
      "oom": step["oom"],
  }
  result["proxy"] = (proxy_compile(config, sizes, chip) if proxy and not target else None)
  result["verdict"] = verdict(result)
  return result


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


def compile_for_target(run, *, on_tpu: bool) -> dict:
  """The run's step compiled for its mesh's devices: {"compiled", "jaxpr", "memory"
  (argument, output, alias, temp, peak bytes per device), "cost", "oom", "error"}. A
  TPU compile refused for memory gives compiled None and the compiler's figures in
  `oom` (temp: what it needed, usable: what a device has)."""
  traced = run.step.trace(run.state, run.rest, run.batch)
  lowered = traced.lower()
  try:
    if on_tpu:
      with no_compilation_cache():
        compiled = lowered.compile()
    else:
      compiled = lowered.compile(FAST_COMPILE)
  except Exception as e:
    oom = tpu.out_of_memory(e) if on_tpu else None
    if oom is None:
      raise
    arguments = bytes_per_device(run.state) + bytes_per_device(run.batch)
    memory = {"argument": arguments, "output": 0, "alias": 0, "temp": oom["temp"] or 0,
              "peak": arguments + (oom["temp"] or 0)}
    return {"compiled": None, "jaxpr": traced.jaxpr, "memory": memory, "cost": {},
            "oom": oom, "error": oom["message"]}
  m = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  memory = {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
            "alias": m.alias_size_in_bytes, "temp": m.temp_size_in_bytes,
            "peak": (m.argument_size_in_bytes + m.output_size_in_bytes
                     - m.alias_size_in_bytes + m.temp_size_in_bytes)}
  return {"compiled": compiled, "jaxpr": traced.jaxpr, "memory": memory, "cost": cost or {},
          "oom": None, "error": None}


@contextlib.contextmanager
def no_compilation_cache():
  """A TPU topology's executable is stored by a persistent compilation cache but cannot
  be loaded back without TPU devices: such compiles skip the cache. jax decides once per
  process whether the cache is used (at the first compile), so switching the flag alone
  changes nothing after a compile: the cache's state is reset on the way in and out."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", before)
    compilation_cache.reset_cache()


def remat_policy(model) -> str:
  """What the backward keeps of the decoder blocks (LMConfig.remat)."""
  if getattr(model, "remat", False):
    return ("every decoder block rematerialised (jax.checkpoint, nothing saveable): the "
            "backward keeps each block's input and recomputes the rest")
  return "off: the backward keeps every block's intermediates"


GPU_PROXY_GENERATION = "v5p"   # the TPU whose compiler stands in for a GPU's (most HBM)


def proxy_compile(config, sizes: dict, chip) -> dict | None:
  """The same step compiled for a TPU topology of the same device count, standing in for
  `chip` (a GPU: v5p; a TPU: its own generation), or None when libtpu is absent or no
  topology has that count: {"topology", "memory", "oom", "usable", "compile_s"}."""
  n = math.prod(sizes.values())
  generation = next((g for g, row in tpu.ACCELERATOR.items()
                     if accelerators.accelerator(row) == chip), GPU_PROXY_GENERATION)
  topology = tpu.proxy_topology(generation, n)
  if topology is None or not tpu.libtpu_available():
    return None
  devices = tpu.topology_devices(topology)
  mesh = mesh_lib.make_train_mesh(sizes, devices=devices)
  t0 = time.perf_counter()
  step = compile_for_target(planner(config).abstract_run(config, mesh)[0], on_tpu=True)
  return {"topology": topology, "memory": step["memory"], "oom": step["oom"],
          "usable": tpu.usable_hbm(devices), "compile_s": time.perf_counter() - t0,
          "same_chip": generation != GPU_PROXY_GENERATION or chip.name.startswith("TPU")}


def verdict(r: dict) -> dict:
  """FITS or DOES NOT FIT, and from what: {"fits", "peak", "capacity", "source",
  "lower_bound"}. Never XLA:CPU's memory: a TPU target's own compile; else a TPU proxy's
  compile of the same step; else the analytic estimate (parameters + optimizer state +
  activations, experiments/jobs/checks.memory_plan)."""
  chip = r["accelerator"]
  per_device = chip.hbm_bytes / (tpu.devices_per_chip(r["target"].split(":")[0])
                                 if r["target"] else 1)
  if r["target"]:
    usable = r["hbm_usable"] or per_device
    peak = r["xla"]["peak"]
    return {"fits": peak <= usable and r["oom"] is None, "peak": peak, "capacity": usable,
            "source": f"XLA:TPU {r['target']}", "lower_bound": r["oom"] is not None}
  proxy = r.get("proxy")
  if proxy is not None:
    peak = proxy["memory"]["peak"]
    if proxy["oom"] is None or peak > per_device:   # an OOM's figure is a lower bound
      capacity = min(per_device, proxy["usable"]) if proxy["same_chip"] else per_device
      return {"fits": peak <= capacity and proxy["oom"] is None, "peak": peak,
              "capacity": capacity, "lower_bound": proxy["oom"] is not None,
              "source": f"XLA:TPU proxy {proxy['topology']}"}
  peak = r["estimate_peak"]
  return {"fits": peak <= per_device, "peak": peak, "capacity": per_device,
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


def format_plan(r: dict, name: str = "") -> str:
  """The plan as text: one line per number, per device, with its source tag."""
  chip, proj, xla, n = r["accelerator"], r["projection"], r["xla"], r["devices"]
  mesh = " × ".join(f"{a}={s}" for a, s in r["block"].items() if s > 1) or "one device"
  tag = f"[{r['compiler']}]"
  per_token = xla["flops"] * n / r["tokens"]
  counts = r["params"]["formula"]
  where = (f"the TPU compiler for {r['target']} ({n} × {chip.name})" if r["target"]
           else f"XLA:CPU for {n} host device{'s' if n > 1 else ''}")
  lines = [
      f"plan of {name or 'the config'} on {mesh} ({n} device{'s' if n > 1 else ''}); "
      f"batch {r['batch']} × {r['seq_len']} = {r['tokens']:,} tokens per step, "
      f"{r['steps']:,} steps",
      f"compiled by {where} in {r['compile_s']:.0f} s (nothing allocated); per device unless "
      "stated:",
      f"parameters        {r['params']['count']:>15,} in all [shapes] = "
      f"{counts['total']:,} [formula]; {_b(r['params']['bytes'])} per device [shapes]",
      *_expert_lines(r),
      f"optimizer state   {_b(r['optimizer_bytes'])} (AdamW moments) [shapes]",
      f"activations       {_b(r['activations_estimate'])} at this batch [estimate]; "
      f"{_b(xla['temp'])} of step temporaries (activations, gradients, workspace) {tag}",
      f"remat             {r['remat']}",
      *_memory_lines(r),
  ]
  if r["oom"] is None:
    lines += [
        f"FLOPs per step    {_si(xla['flops'])}FLOP per device, {_si(xla['flops'] * n)}FLOP "
        f"in all {tag}; {_si(r['flops_formula'])}FLOP [formula]; {r['compiler']} in all ÷ "
        f"formula {xla['flops'] * n / r['flops_formula']:.3f} (above 1: elementwise work, or "
        "work replicated across the mesh)"]
  lines += [
      f"matmul FLOPs      {_si(r['flops_jaxpr'])}FLOP per step in all [jaxpr] (÷ formula "
      f"{r['flops_jaxpr'] / r['flops_formula']:.3f}: the formula's matmuls, read from the "
      "program)",
      f"FLOPs per token   {_si(per_token)}FLOP {tag}; {_si(r['flops_jaxpr'] / r['tokens'])}"
      "FLOP of matmuls [jaxpr]",
      "collectives       " + ", ".join(f"{op} {_b(r['collectives'][op])}" for op in OPS)
      + f" per {'chip' if r['target'] else 'device'}; {_b(r['collective_bytes'])} per step "
      f"[HLO of {r['compiler']}]",
      f"step time         {_t(proj['step_s'])} on {n} × {chip.name} at MFU "
      f"{r['mfu']:.2f} [model]: compute {_t(proj['compute_s'])} (peak "
      f"{chip.peak_flops / 1e12:.0f} TFLOP/s bf16) + collectives {_t(proj['comm_s'])} at "
      f"{accelerators.collective_bw(chip, n) / 1e9:.0f} GB/s, not overlapped",
      f"throughput        {r['tokens'] / proj['step_s']:,.0f} tokens/s; {r['steps']:,} "
      f"steps in {_t(r['steps'] * proj['step_s'])} [model]",
  ]
  if r.get("qwen3vl"):
    _qwen3vl_lines(lines, r)
  if r["grad_accum"] > 1:
    lines.append(f"note: grad_accum={r['grad_accum']}: XLA counts the micro-batch scan's "
                 f"body once; FLOPs {tag} are scaled by {r['grad_accum']}/2")
  lines.append(f"note: the step time uses the [jaxpr] matmul FLOPs ÷ devices; {tag} counts "
               f"a loop body once (the cross entropy's {r['loss_chunks']} chunk(s) count as "
               "one) and no Pallas kernel's work")
  if r["dense_ragged"]:
    lines.append("note: XLA:CPU computes the MoE's ragged_dot densely (every slot with every "
                 "local expert), so [XLA:CPU] FLOPs and temporaries overstate the MoE layers")
  if r["target"] and r["block"].get("expert", 1) > 1 and r["params"]["experts"][1]:
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


def _memory_lines(r: dict) -> list[str]:
  """The peak line (the verdict's figure, in GiB, FITS or DOES NOT FIT, and its source)
  and, without a TPU target, XLA:CPU's own peak, shown but never judged."""
  xla, v, chip = r["xla"], r["verdict"], r["accelerator"]
  unit = "chip" if r["target"] and not r["target"].startswith("v4") else "device"
  word = "FITS" if v["fits"] else "DOES NOT FIT"
  at_least = "at least " if v["lower_bound"] else ""
  if r["target"]:
    how = (f"(arguments {_b(xla['argument'])} + outputs {_b(xla['output'])} - donated "
           f"{_b(xla['alias'])} + temporaries {_b(xla['temp'])})")
    if r["oom"] is not None:
      how = f"(the compiler stopped: {r['oom']['message']})"
    return [f"peak memory       {at_least}{_gib(v['peak'])} per {unit} [{v['source']}] {how}; "
            f"{word} in the {_gib(v['capacity'])} a {chip.name} {unit} may use"]
  source = {"estimate": "[estimate: parameters + optimizer state + activations]"}.get(
      v["source"], f"[{v['source']}, the TPU compiler standing in for {chip.name}]")
  lines = [f"peak memory       {at_least}{_gib(v['peak'])} per device {source}; {word} in "
           f"{chip.name}'s {_gib(v['capacity'])}"]
  lines.append(f"XLA:CPU peak      {_b(xla['peak'])} (arguments {_b(xla['argument'])} + outputs "
               f"{_b(xla['output'])} - donated {_b(xla['alias'])} + temporaries) [XLA:CPU]: "
               "XLA:CPU's own schedule, not a verdict (plan --target=<TPU topology> compiles "
               "for the chips)")
  if r.get("proxy") is None and v["source"] == "estimate":
    why = (f"no TPU topology has {r['devices']} device{'s' if r['devices'] > 1 else ''} "
           "(4, 8, 16, ...)" if tpu.libtpu_available()
           else "the TPU compiler is not installed (pip install -e '.[tpu]')")
    lines.append(f"note: no TPU compile stands in for the chip here: {why}; the verdict is "
                 "the estimate's")
  return lines


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
                 f"(prefill + {g['new_tokens']:,} cached decode steps) not planned")
