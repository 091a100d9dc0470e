"""Compiling a run's step for its target: XLA:CPU host devices, a TPU topology or GPUs.

    planner(config)                             the plan hooks of the config's job
    compile_for_target(run, compiler="XLA:GPU")   memory, cost, program of the step
    target_chip_and_devices("h800:8")           the accelerator row and compile-only devices
    own_chip_compile(config, sizes, "h800")     the step by the named chip's own compiler
    no_compilation_cache()                      compiles that must skip the persistent cache

The targets' devices come from experiments/plan/gpu.py (XLA:GPU, jax's CUDA plugin) and
experiments/plan/tpu.py (libtpu); report.py puts the numbers together (DESIGN.md §10.1).
Compiling for XLA:CPU with LLVM optimisation off (`FAST_COMPILE`) keeps the HLO, its cost
and memory analysis and every collective the same; only machine code differs.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time

from experiments.jobs.abstract import bytes_per_device
from experiments.jobs.registry import JOBS, job, job_name
from experiments.plan import accelerators, buffers, gpu, tpu
from experiments.trainer import placement as mesh_lib

FAST_COMPILE = {"xla_backend_optimization_level": 0}


def planner(config):
  """The plan hooks of the config's job (its `planner()`: check_mesh, abstract_run,
  counts), or a one-line refusal for a job that is not planned."""
  hooks = job(job_name(config)).planner()
  if hooks is None:
    planned = [name for name in JOBS if job(name).planner() is not None]
    raise ValueError(f"plan: the {job_name(config)} job's configs are not planned (the jobs "
                     f"planned: {', '.join(planned)}).")
  return hooks


def compiler_of(target: str | None) -> str:
  """"XLA:GPU" for a GPU target, "XLA:TPU" for a TPU topology, "XLA:CPU" without one."""
  if not target:
    return "XLA:CPU"
  return "XLA:GPU" if gpu.is_gpu_target(target) else "XLA:TPU"


def target_chip_and_devices(target: str) -> tuple:
  """(the accelerator row, the compile-only devices) of a GPU target or TPU topology;
  one-line errors for a bad name or a missing compiler."""
  if gpu.is_gpu_target(target):
    name, _, _ = gpu.parse_target(target)
    return accelerators.accelerator(name), gpu.target_devices(target)
  generation, _ = tpu.parse_topology(target)
  return accelerators.accelerator(tpu.ACCELERATOR[generation]), tpu.topology_devices(target)


def usable_memory(target: str | None, devices) -> float | None:
  """Bytes one device of the target may use: a TPU's as its compiler counts it, a GPU's
  as JAX's allocator leaves it (experiments/plan/gpu.py); None without a target."""
  if not target:
    return None
  if gpu.is_gpu_target(target):
    return gpu.usable_bytes(gpu.parse_target(target)[0])
  return tpu.usable_hbm(devices)


def compile_for_target(run, *, compiler: str = "XLA:CPU", devices=None,
                       explain_memory: bool = False) -> dict:
  """The run's step compiled for its mesh's devices by `compiler` (XLA:CPU, XLA:TPU or
  XLA:GPU): {"compiled", "jaxpr", "memory" (argument, output, alias, temp, peak bytes
  per device), "cost", "oom", "error"}. A TPU compile refused for memory gives
  compiled None and the compiler's figures in `oom` (temp: what it needed, usable:
  what a device has). XLA:GPU gives no cost analysis (cost is then {}). `devices`: the
  target's (a GPU's Pallas lowering reads the chip from the first). `explain_memory`:
  also "buffers", the largest buffers live at the memory peak (buffers.py; None where
  the compiler writes no buffer assignment)."""
  traced = run.step.trace(run.state, run.rest, run.batch)
  notes: set[str] = set()
  with tempfile.TemporaryDirectory(prefix="lngram-plan-buffers-") as dump:
    options = buffers.dump_options(dump, compiler) if explain_memory else {}
    try:
      compiled = _compile(traced, compiler, devices, options, notes)
    except Exception as e:
      return _refused(e, run, traced, compiler, notes)
    peak = buffers.peak_buffers(dump) if explain_memory else None
  m = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  memory = {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
            "alias": m.alias_size_in_bytes, "temp": m.temp_size_in_bytes,
            "peak": (m.argument_size_in_bytes + m.output_size_in_bytes
                     - m.alias_size_in_bytes + m.temp_size_in_bytes)}
  return {"compiled": compiled, "jaxpr": traced.jaxpr, "memory": memory, "cost": cost or {},
          "oom": None, "error": None, "notes": sorted(notes), "buffers": peak}


def compile_for_gpu(traced, devices, options: dict | None = None, notes: set | None = None):
  """A traced program compiled by XLA:GPU for a GPU target's `devices`: lowered with the
  first as jax's default device (gpu.lowering_device), compiled outside the persistent
  cache (gpu.compile_deviceless); what XLA:GPU says about compiling without a device
  goes to `notes`. The plan, the Table 12 tool and the kernels' GPU tests compile so."""
  notes = set() if notes is None else notes
  with gpu.lowering_device(devices):
    lowered = traced.lower()
  with no_compilation_cache(), gpu.compiler_messages(notes):
    return gpu.compile_deviceless(lowered, notes, options)


def _compile(traced, compiler: str, devices, options: dict, notes: set):
  if compiler == "XLA:GPU":
    return compile_for_gpu(traced, devices, options, notes)
  lowered = traced.lower()
  if compiler == "XLA:TPU":
    with no_compilation_cache():
      return lowered.compile(options or None)
  return lowered.compile({**FAST_COMPILE, **options})


def _refused(e: Exception, run, traced, compiler: str, notes: set) -> dict:
  """A TPU compile refused for memory, as compile_for_target's result; anything else
  raised."""
  oom = tpu.out_of_memory(e) if compiler == "XLA:TPU" else None
  if oom is None:
    raise e
  arguments = bytes_per_device(run.state) + bytes_per_device(run.batch)
  memory = {"argument": arguments, "output": 0, "alias": 0, "temp": oom["temp"] or 0,
            "peak": arguments + (oom["temp"] or 0)}
  return {"compiled": None, "jaxpr": traced.jaxpr, "memory": memory, "cost": {},
          "oom": oom, "error": oom["message"], "notes": sorted(notes), "buffers": None}


@contextlib.contextmanager
def no_compilation_cache():
  """A TPU topology's (or GPU target's) executable is stored by a persistent compilation
  cache but cannot be loaded back without those devices: such compiles skip the cache. jax decides once per
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


def own_chip_compile(config, sizes: dict, accelerator: str) -> dict | None:
  """The same step compiled by the named chip's own compiler for as many devices: a
  GPU's XLA:GPU (on as few 8-GPU hosts as hold them; needs the GPU compiler) or a TPU
  topology of its generation (needs libtpu); None when that compiler is absent or no
  target has that device count: {"target", "compiler", "memory", "oom", "usable",
  "compile_s"}."""
  n = math.prod(sizes.values())
  target = own_chip_target(accelerator, n)
  if target is None:
    return None
  _, devices = target_chip_and_devices(target)
  mesh = mesh_lib.make_train_mesh(sizes, devices=devices)
  t0 = time.perf_counter()
  compiler = compiler_of(target)
  step = compile_for_target(planner(config).abstract_run(config, mesh)[0], compiler=compiler,
                            devices=devices)
  return {"target": target, "compiler": compiler, "memory": step["memory"],
          "oom": step["oom"], "usable": usable_memory(target, devices),
          "compile_s": time.perf_counter() - t0}


def own_chip_target(accelerator: str, devices: int) -> str | None:
  """The target of `devices` of the named chip its own compiler builds here, or None
  (the compiler is not installed, or no target has that count)."""
  key = str(accelerator).lower().replace("-", "_")
  if key in gpu.GPUS:
    return gpu.target_of(key, devices) if gpu.compiler_available() else None
  generation = next((g for g, row in tpu.ACCELERATOR.items() if row == key), None)
  if generation is None or not tpu.libtpu_available():
    return None
  return tpu.proxy_topology(generation, devices)
