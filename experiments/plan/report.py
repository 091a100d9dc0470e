"""The plan of one run on one mesh: numbers per device, where each comes from, and the text.

    result = plan_run(config, block, accelerator="h100", mfu=0.4, devices=...)
    print(format_plan(result))            (experiments/plan/text.py)

Sources, one tag per number in the text:
  [shapes]   the abstract model and optimiser state under the trainer's shardings
             (exact: what each device will hold)
  [formula]  the job's planner `counts` (experiments/models/counts.py for the LM:
             parameters exact; FLOPs first-principles)
  [estimate] the job's planner's activation estimate (the LM's:
             `experiments.jobs.checks.memory_plan`)
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

from experiments.jobs.abstract import bytes_per_device
from experiments.models.lora import lora_param_count
from experiments.plan import accelerators, gpu, tpu
from experiments.plan.collectives import OPS, collective_bytes
from experiments.plan.compile import (  # noqa: F401  (no_compilation_cache: a public name here)
  compile_for_target,
  compiler_of,
  no_compilation_cache,
  own_chip_compile,
  planner,
  target_chip_and_devices,
  usable_memory,
)
from experiments.plan.jaxpr_flops import jaxpr_flops
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
  memory, cost, compiled = step["memory"], step["cost"], step["compiled"]
  moved = collective_bytes(compiled.as_text()) if compiled is not None else _no_collectives()
  token_shards = math.prod(sizes[a] for a in ("data", "fsdp", "expert", "seq"))
  counted = job.counts(config, run, mc, geo, n, token_shards)
  B, T, estimate = counted["batch"], counted["seq_len"], counted["estimate"]
  accum = int(config.train.get("grad_accum", 1))
  flops = step_flops(step, compiler, accum)
  sent = sum(moved[op] for op in OPS)
  hosts = hosts_of(target)
  result = {
      "block": sizes, "devices": n, "batch": B, "seq_len": T, "tokens": run.tokens,
      "steps": int(config.train.steps), "compile_s": seconds,
      "accelerator": chip, "mfu": mfu, "target": target,
      "compiler": compiler,
      "params": _param_fields(run.state["params"], counted["counts"]),
      "optimizer_bytes": bytes_per_device(run.state["opt_state"]),
      "activations_estimate": estimate["activations"],
      "estimate_peak": estimate["params"] + estimate["optimizer"] + estimate["activations"],
      "xla": {**memory, "flops": flops["xla"],
              "bytes_accessed": float(cost.get("bytes accessed", 0.0))},
      "hbm_usable": usable_memory(target, devices),
      "flops_formula": counted["formula"], "flops_jaxpr": flops["jaxpr"],
      "flops_jaxpr_seen": flops["seen"],
      "collectives": moved,
      "collective_bytes": sent, "remat": remat_policy(run.model),
      "dense_ragged": dense_ragged(run.model, target), "grad_accum": accum,
      "qwen3vl": counted["vl"],
      "loss_chunks": loss_chunks(run.model, B, T),
      "hosts": hosts,
      # The step time rests on the program's matmuls (the jaxpr): XLA's cost analysis
      # counts a loop body once (the chunked cross entropy's chunks, the TPU compiler's
      # windowed collective matmuls), leaves out Pallas kernels (splash, the sink
      # readout) and, on XLA:CPU, computes ragged_dot densely.
      "projection": accelerators.projected_step_s(chip, flops=flops["jaxpr"] / n,
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


def step_flops(step: dict, compiler: str, accum: int) -> dict:
  """The compiled step's FLOPs: {"xla": its cost analysis's, per device, scaled to
  `accum` micro-batches; "jaxpr": the program's matmuls, global and backend-independent
  (experiments/plan/jaxpr_flops.py); "seen": those matmuls as a TPU/GPU compiler's cost
  analysis sees them}."""
  flops = float(step["cost"].get("flops", 0.0))
  # XLA's cost analysis counts a while body once: with grad_accum = k the first micro-batch
  # runs outside the scan and k - 1 inside it, so the count holds two; scale to k (the
  # optimiser update, counted once, is then over-scaled: a fraction of a per cent).
  if accum > 1:
    flops *= accum / 2
  jaxpr = step["jaxpr"]
  # The same matmuls without any Pallas kernel's work, each loop body once, the
  # micro-batches scaled as XLA's count is: why XLA's FLOPs differ from the formula's
  # ("why not 1" in the report).
  kernels = compiler == "XLA:CPU"
  seen = {"no_kernels": jaxpr_flops(jaxpr, kernels=kernels),
          "as_compiler": jaxpr_flops(jaxpr, kernels=kernels, loops=False)
          * (accum / 2 if accum > 1 else 1)}
  return {"xla": flops, "jaxpr": jaxpr_flops(jaxpr), "seen": seen}


def dense_ragged(model, target: str | None) -> bool:
  """Whether XLA:CPU computes the MoE's grouped dispatch densely: it lowers
  jax.lax.ragged_dot as a dense product of every slot with every local expert, masked,
  so its FLOPs and temporaries overstate what a GPU/TPU (a grouped matmul) runs and the
  step time rests on the jaxpr's matmuls."""
  moe = getattr(model, "moe", None)
  return bool(not target and getattr(model, "moe_layers", ()) and moe is not None
              and getattr(moe, "dispatch", "grouped") == "grouped")


def _param_fields(params, counts: dict) -> dict:
  """The parameters' count from shapes, the LoRA factors', the formula's counts, the
  bytes per device and the routed experts' bytes."""
  import jax
  return {"count": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
          "lora": lora_param_count(params), "formula": counts,
          "bytes": bytes_per_device(params), "experts": routed_expert_bytes(params)}


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


def gpu_name(chip) -> str | None:
  """The GPU name (h100, ...) of an accelerator row, or None for a TPU."""
  return next((k for k in gpu.GPUS if accelerators.ACCELERATORS[k] == chip), None)


def estimate_capacity(chip, target: str | None = None) -> float:
  """Memory one device may use when no compiler says: a GPU's allocator share of its
  memory (experiments/plan/gpu.py), a TPU device's HBM."""
  name = gpu_name(chip)
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


def hosts_of(target: str | None) -> int | None:
  """The hosts a GPU target names (`h800:8x8`: 8); None for a TPU or no target."""
  return gpu.parse_target(target)[1] if target and gpu.is_gpu_target(target) else None
