"""Planning Stage II's rollout (`plan --program=rollout`): sampling as its own compiled program.

    run, mc, geo = rollout_abstract_run(config, mesh)   the program and its abstract inputs
    r = plan_rollout(config, block, target="v5p:2x2x2")  compiled, measured, modelled
    print(format_rollout(r, name))

The program is the sampler's (experiments/vlm/qwen3vl/generate.py `rollout`): the prefill
of prompts_per_step · group_size rows of [image + PROMPT_TEXT assumed text tokens] and the
fixed-shape decode loop (`lax.while_loop`, the KV cache and PVM's visual cache in its
carry) to `grpo.max_new_tokens` new tokens, sampled at the config's temperature with
log-probabilities (GRPO's π_old), one end token. The parameters are the training plan's
(experiments/jobs/qwen3vl/planning.py `abstract_params`: the trainer's placement,
fsdp-sharded);
the prompt rows, the cache and the new tokens are split over the batch axes (data ×
fsdp × expert). It is compiled by the target's compiler like the step
(experiments/plan/compile.py), and judged by its per-device peak in the same way.

Time model (not a measurement): the prefill at the program's matmul FLOPs [jaxpr] (the
prefill and one decode step's) ÷ devices at peak × MFU; each decode step memory-bound:
the device's shard of the weights it uses (the decoder and the PVM branches: everything
but the input embedding table unless tied; not the vision tower), plus what the step
all-gathers [HLO] (the rest of the weights where the compiler gathers them, else
activations), plus the device's share of the caches (every slot is read every step:
attention is over the whole fixed-size cache, masked), at the chip's HBM bandwidth, and
the decode loop's collectives per step [HLO] at the link rate; every row assumed to run
to max_new_tokens (an end token only shortens it).
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from experiments.jobs.abstract import AbstractRun, bytes_per_device
from experiments.plan import accelerators
from experiments.plan.collectives import OPS, collective_bytes
from experiments.plan.compile import compile_for_target, compiler_of
from experiments.plan.jaxpr_flops import jaxpr_flops
from experiments.trainer import placement as mesh_lib

PROGRAMS = ("step", "rollout")


def check_rollout_config(config) -> None:
  """A one-line refusal unless the config is a Qwen3-VL Stage II (GRPO) config."""
  from experiments.jobs.registry import job_name
  if job_name(config) != "qwen3vl" or config.qwen3vl.stage.name != "grpo":
    raise ValueError("--program=rollout plans Stage II's sampling: give a Qwen3-VL GRPO "
                     "config (experiments/configs/qwen3vl_pvm_grpo.py).")


def rollout_geometry(config, mc) -> dict:
  """The rollout's rows, prompt length, new tokens and cache slots (one image a row)."""
  from experiments.jobs.qwen3vl.planning import PROMPT_TEXT, geometry
  geo = geometry(config, mc)
  prompt = geo["visual_per_row"] + 2 + PROMPT_TEXT
  return {**geo, "prompt_len": prompt, "cache_len": prompt + geo["new_tokens"],
          "temperature": float(config.qwen3vl.grpo.temperature)}


def cache_constraint(mesh, layer_spans):
  """Pins a DecodeCache's rows to the batch axes: a stacked span's K/V ([L, B, ...]) on
  its second axis, every other leaf on its first."""
  def pin(x, stacked: bool):
    spec = P(None, mesh_lib.BATCH_AXES) if stacked else P(mesh_lib.BATCH_AXES)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  def constrain(cache):
    layers = tuple(jax.tree.map(lambda x, s=stop - start > 1: pin(x, s), layer)
                   for layer, (start, stop) in zip(cache.layers, layer_spans, strict=True))
    return cache.replace(layers=layers, index_B=pin(cache.index_B, False),
                         position_B=pin(cache.position_B, False),
                         key_ok_BxS=pin(cache.key_ok_BxS, False))
  return constrain


def _inputs(geo: dict, mc, mesh) -> dict:
  """The abstract prompt batch: right-packed ids, pixels, lengths, positions, a key."""
  R, T = geo["rows"], geo["prompt_len"]
  rows = lambda ndim, axis=0: NamedSharding(
      mesh, P(*([None] * axis), mesh_lib.BATCH_AXES, *([None] * (ndim - axis - 1))))
  replicated = NamedSharding(mesh, P())
  i32 = jnp.int32
  key = jax.eval_shape(lambda: jax.random.key(0))
  return {
      "input_ids": jax.ShapeDtypeStruct((R, T), i32, sharding=rows(2)),
      "pixel_values": jax.ShapeDtypeStruct((R * geo["patches_per_row"], mc.vision.patch_dim),
                                           jnp.float32, sharding=rows(2)),
      "lengths": jax.ShapeDtypeStruct((R,), i32, sharding=rows(1)),
      "position_ids": jax.ShapeDtypeStruct((3, R, T), i32, sharding=rows(3, axis=1)),
      "rng": jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated),
      "temperature": jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated),
      "eos": jax.ShapeDtypeStruct((1,), i32, sharding=replicated),
  }


def rollout_abstract_run(config, mesh):
  """(AbstractRun of the rollout program, the model config, the rollout geometry): state
  {"params"} as the training plan places them, the prompt batch, the jitted program; the
  geometry also holds the cache's bytes in all ("cache": `cache_bytes`) and the bytes
  a decode step reads of the weights ("weights_read")."""
  from experiments.jobs.qwen3vl.planning import abstract_params, qwen3vl_model
  from experiments.vlm.qwen3vl.generate import rollout
  from experiments.vlm.qwen3vl.model import _prefill
  check_rollout_config(config)
  mc = qwen3vl_model(config)
  geo = rollout_geometry(config, mc)
  graphdef, params, rest, spans = abstract_params(mc, mesh)
  grid = tuple(tuple(geo["grid"]) for _ in range(geo["rows"]))
  constrain = cache_constraint(mesh, spans)

  def program(state, rest, batch):
    model = nnx.merge(graphdef, state["params"], rest)
    return rollout(model, batch["input_ids"], batch["pixel_values"], batch["lengths"],
                   batch["position_ids"], batch["rng"], batch["temperature"], batch["eos"],
                   grid_thw=grid, n_visual=geo["visual_per_row"],
                   max_new_tokens=geo["new_tokens"], greedy=False, return_logp=True,
                   mesh=mesh, constrain=constrain)

  def prefill_cache(state, rest, batch):
    model = nnx.merge(graphdef, state["params"], rest)
    return _prefill(model, batch["input_ids"], batch["pixel_values"], batch["lengths"],
                    batch["position_ids"], grid_thw=grid, cache_len=geo["cache_len"],
                    n_visual=geo["visual_per_row"])[1]

  state, batch = {"params": params}, _inputs(geo, mc, mesh)
  geo["cache"] = cache_bytes(jax.eval_shape(prefill_cache, state, rest, batch))
  geo["weights"] = _size(decode_weights(params))
  geo["weights_device"] = bytes_per_device(decode_weights(params))
  rows = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
  step = jax.jit(program, out_shardings=(rows, rows, rows, NamedSharding(mesh, P())))
  run = AbstractRun(mc.text, mesh, state, rest, batch, step, geo["rows"] * geo["new_tokens"])
  return run, mc, geo


def _size(tree) -> int:
  return sum(x.dtype.itemsize * math.prod(x.shape) for x in jax.tree.leaves(tree))


def cache_bytes(cache) -> dict[str, int]:
  """Bytes of a (abstract) DecodeCache in all: the decoder's K/V, PVM's visual K/V (with
  its mask), the rest (next slot, position, the slots' mask)."""
  return {"kv": sum(_size((c.k_BxSxHkvxDh, c.v_BxSxHkvxDh)) for c in cache.layers),
          "visual": sum(_size((c.memory_state, c.ffn_branch_state)) for c in cache.layers),
          "other": _size((cache.index_B, cache.position_B, cache.key_ok_BxS))}


def decode_weights(params) -> list:
  """The weights a decode step reads: the decoder's and its branches' (`lm/...`), less
  the input embedding table unless the logits use it (tied: only B rows of it are
  gathered otherwise); the vision tower runs in the prefill only."""
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  tied = not any(p.startswith("lm/unembed") for p in flat)
  return [x for p, x in flat.items()
          if p.startswith("lm/") and (tied or not p.startswith("lm/embed/"))]


def plan_rollout(config, block: dict, *, accelerator: str = "h100", mfu: float = 0.4,
                 devices=None, target: str | None = None,
                 explain_memory: bool = False) -> dict:
  """Every number of the rollout's plan (module docstring); arguments as `plan_run`'s."""
  from experiments.plan.report import hosts_of, plan_mesh, usable_memory, verdict
  check_rollout_config(config)
  sizes, chip, devices, mesh = plan_mesh(config, block, accelerator=accelerator, mfu=mfu,
                                         target=target, devices=devices)
  n = math.prod(sizes.values())
  compiler = compiler_of(target)
  t0 = time.perf_counter()
  run, mc, geo = rollout_abstract_run(config, mesh)
  out = compile_for_target(run, compiler=compiler, devices=devices,
                           explain_memory=explain_memory)
  seconds = time.perf_counter() - t0
  hlo = out["compiled"].as_text() if out["compiled"] is not None else ""
  # The decode loop's trip count is data-dependent (it ends when every row has ended):
  # counted 0 times, the program's collectives are the prefill's; once, one step's more.
  prefill_moved = collective_bytes(hlo, unknown_trip_count=0)
  once = collective_bytes(hlo)
  per_step_moved = {op: once[op] - prefill_moved[op] for op in OPS}
  shards = math.prod(sizes[a] for a in mesh_lib.BATCH_AXES)
  cache_device = sum(geo["cache"].values()) / shards
  params_device = bytes_per_device(run.state["params"])
  matmul = jaxpr_flops(out["jaxpr"])
  N = geo["new_tokens"]
  prefill = accelerators.projected_step_s(chip, flops=matmul / n,
                                          collective_bytes=sum(prefill_moved[op] for op in OPS),
                                          devices=n, mfu=mfu)
  # A step reads the device's shard of the weights, what it gathers (the rest of the
  # weights if the compiler gathers them, else activations) and its rows' whole cache.
  step_read = geo["weights_device"] + per_step_moved["all-gather"] + cache_device
  step_hbm = step_read / chip.hbm_bw
  step_comm = sum(per_step_moved.values()) / accelerators.collective_bw(chip, n)
  r = {
      "program": "rollout", "block": sizes, "devices": n, "accelerator": chip, "mfu": mfu,
      "target": target, "compiler": compiler, "compile_s": seconds, "geometry": geo,
      "params": {"count": sum(math.prod(x.shape) for x in jax.tree.leaves(run.state["params"])),
                 "bytes": params_device},
      "cache_device": cache_device, "xla": out["memory"], "oom": out["oom"],
      "hbm_usable": usable_memory(target, devices), "proxy": None,
      "estimate_peak": params_device + geo["weights"] + cache_device,
      "estimate_text": "[estimate: parameters + the decode weights gathered whole + cache]",
      "collectives_prefill": prefill_moved, "collectives_step": per_step_moved,
      "unknown_trips": once["unknown_trips"], "flops_jaxpr": matmul,
      "prefill": prefill, "hosts": hosts_of(target),
      "decode_step": {"bytes": step_read, "hbm_s": step_hbm, "comm_s": step_comm,
                      "step_s": step_hbm + step_comm},
      "hlo": hlo or out["error"], "compiler_notes": out["notes"], "buffers": out["buffers"],
      "explain_memory": explain_memory,
  }
  r["decode_s"] = N * r["decode_step"]["step_s"]
  r["rollout_s"] = prefill["step_s"] + r["decode_s"]
  r["verdict"] = verdict(r)
  return r


def format_rollout(r: dict, name: str = "") -> str:
  """The rollout's plan as text, one number a line with its source tag (text.py's)."""
  from experiments.plan.text import _b, _buffer_lines, _compiled_for, _memory_lines, _t, _unit
  g, chip, n = r["geometry"], r["accelerator"], r["devices"]
  mesh = " × ".join(f"{a}={s}" for a, s in r["block"].items() if s > 1) or "one device"
  tag = f"[HLO of {r['compiler']}]"
  c, d, N = g["cache"], r["decode_step"], g["new_tokens"]
  shards = math.prod(r["block"].get(a, 1) for a in mesh_lib.BATCH_AXES)
  moved = lambda m: ", ".join(f"{op} {_b(m[op])}" for op in OPS)
  lines = [
      f"plan of the rollout of {name or 'the config'} on {mesh} ({n} device"
      f"{'s' if n > 1 else ''}): {g['rows']} rows × [{g['prompt_len']:,} prompt tokens "
      f"(image {g['visual_per_row']} + 2 + text, assumed) | {N:,} new tokens], "
      f"{g['cache_len']:,} cache slots a row; prefill + one decode loop (lax.while_loop)",
      f"compiled by {_compiled_for(r)} in {r['compile_s']:.0f} s (nothing allocated); per "
      "device unless stated:",
      f"parameters        {r['params']['count']:,} in all; {_b(r['params']['bytes'])} per "
      "device [shapes] (the training plan's placement)",
      f"decode cache      {_b(r['cache_device'])} per device of {_b(sum(c.values()))} in all "
      f"[shapes]: K/V {_b(c['kv'])}, PVM visual K/V {_b(c['visual'])}, slots and positions "
      f"{_b(c['other'])}; rows over the batch axes ({g['rows']} / {shards} a device)",
      *_memory_lines(r),
      *_buffer_lines(r),
      f"collectives       prefill: {moved(r['collectives_prefill'])}; per decode step: "
      f"{moved(r['collectives_step'])} per {_unit(r)} {tag}",
      f"prefill time      {_t(r['prefill']['step_s'])} [model]: {r['flops_jaxpr'] / 1e12:,.1f} "
      f"TFLOP of matmuls [jaxpr] ÷ {n} at MFU {r['mfu']:.2f} of {chip.peak_flops / 1e12:.0f} "
      f"TFLOP/s ({_t(r['prefill']['compute_s'])}) + collectives {_t(r['prefill']['comm_s'])}",
      f"decode step       {_t(d['step_s'])} [model], memory-bound: reads {_b(d['bytes'])} "
      f"(its weights' shard {_b(g['weights_device'])} of {_b(g['weights'])} [shapes] + "
      f"what it gathers {_b(r['collectives_step']['all-gather'])} {tag} + cache "
      f"{_b(r['cache_device'])}) at "
      f"{chip.hbm_bw / 1e12:.2f} TB/s HBM ({_t(d['hbm_s'])}) + collectives "
      f"{_t(d['comm_s'])} at {accelerators.collective_bw(chip, n, r.get('hosts')) / 1e9:.0f} "
      "GB/s",
      f"rollout time      {_t(r['rollout_s'])} [model]: prefill + {N:,} decode steps "
      f"({_t(r['decode_s'])}), every row to {N:,} tokens; "
      f"{g['rows'] * N / r['rollout_s']:,.0f} new tokens/s on {n} × {chip.name}",
  ]
  if r["unknown_trips"] > 1:
    lines.append(f"note: {r['unknown_trips']} loops of unknown trip count hold collectives "
                 "(the decode loop alone expected): the per-step collectives may mix them")
  lines.append("note: the time model assumes no overlap of memory reads and collectives, "
               "and attention over every cache slot each step (the fixed-shape loop does)")
  return "\n".join(lines)
