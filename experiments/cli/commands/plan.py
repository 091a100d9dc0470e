"""`lngram-exp plan`: check the mesh, provide the host devices, plan, print.

    lngram-exp plan --config=experiments/configs/hf_lngram.py:keye2b --mesh=fsdp=64
                    [--accelerator=h100 --mfu=0.4 | --target=h800:8x8 | --target=v5p:4x4x4]
                    [--dump_hlo=F] [--explain_memory] [--program=step|rollout]

Per-device memory, FLOPs, collective bytes and step time of a config on a mesh,
compiled from shapes before any run (the library: experiments/plan, DESIGN.md §10.1).
`--program=rollout` (a Qwen3-VL GRPO config) plans Stage II's sampling instead of the
train step: the prefill and the decode loop as one program, its peak memory and a
memory-bound decode time (experiments/plan/rollout.py).

With `--target=<TPU topology>` the step is compiled by the TPU compiler for that
topology's devices (experiments/plan/tpu.py; `pip install -e '.[tpu]'`), with
`--target=<gpu>:<GPUs>` or `<gpu>:<hosts>x<GPUs>` (h100, h200, h800, a100) by XLA:GPU
for those GPUs (experiments/plan/gpu.py; `pip install -e '.[gpu-compile]'`); neither
needs host devices. Otherwise it
compiles for as many XLA:CPU devices as the mesh has, on any machine:
XLA makes N host devices when the CPU backend starts with
`XLA_FLAGS=--xla_force_host_platform_device_count=N`. When jax has not started a
backend yet in this process (a plain `lngram-exp plan`) the flag and
`jax_platforms=cpu` are set here, in process; otherwise (a backend already
started with fewer CPU devices) the command reruns itself in a subprocess with
that environment. Compiling on CPU also keeps an accelerator machine's memory
untouched, and once more by the named chip's own compiler for as many devices
(XLA:GPU for a GPU, with the GPU compiler; a topology of its generation for a TPU,
with libtpu), whose memory is the fit verdict's. The mesh is checked
against the config before either, so a mesh that does not divide the shapes is
refused in a second.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

COMMANDS = {"plan": "per-device memory, FLOPs, collective bytes and step time of a config on "
                    "a mesh, compiled from shapes before any run"}
FLAGS_OF = {"plan": {"config", "mesh", "accelerator", "mfu", "target", "dump_hlo",
                     "explain_memory", "program"}}
REQUIRED_OF = {"plan": ("config",)}
# (absl kind, name, default, lower bound, help); --config, --mesh: experiments/cli/flags.py.
FLAGS = [
    ("string", "accelerator", "h100", None, "plan: h100, h200, h800, a100, tpu_v4, tpu_v5e, "
     "tpu_v5p or tpu_v6e (the step time's peak FLOP/s and links); --target sets it."),
    ("string", "target", None, None, "plan: compile for these chips with their own "
     "compiler: GPUs as <gpu>:<GPUs> or <gpu>:<hosts>x<GPUs per host> (h100, h200, h800, "
     "a100; e.g. h800:8, h800:8x8; needs pip install -e '.[gpu-compile]'), TPUs as a "
     "topology (e.g. v5e:2x2, v6e:2x4, v5p:2x2x2; needs pip install -e '.[tpu]'); the "
     "mesh must have its device count."),
    ("string", "dump_hlo", None, None, "plan: write the compiled program's text to this "
     "file."),
    ("float", "mfu", 0.4, None, "plan: the share of peak FLOP/s the step time assumes."),
    ("bool", "explain_memory", False, None, "plan: list the largest buffers live at the "
     "memory peak (shape, size, the operation and source line that made each), read from "
     "the compiler's buffer assignment."),
    ("string", "program", "step", None, "plan: step (the train step) or rollout (a Qwen3-VL "
     "GRPO config's sampling: prefill + the decode loop to max_new_tokens)."),
]
DEVICES_FLAG = "--xla_force_host_platform_device_count"
# The most host devices XLA:CPU compiles one program for (jaxlib 0.10.2: 2048 works; with
# more, "Multiprocess computations aren't implemented on the CPU backend").
MAX_CPU_DEVICES = 2048
_CHILD = "LNGRAM_PLAN_SUBPROCESS"   # set in the rerun, so that it never reruns itself


def _with_devices(flags: str, n: int) -> str:
  flags = re.sub(rf"{DEVICES_FLAG}=\d+", "", flags or "")
  return f"{flags} {DEVICES_FLAG}={n}".strip()


def provide_cpu_devices(n: int) -> bool:
  """True when this process can compile for `n` CPU devices (set up here if jax has
  not started a backend yet); False when only a subprocess can."""
  import jax
  try:   # private, so guarded: unknown means "started" and leads to the subprocess
    from jax._src import xla_bridge
    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    started = True
  if not started:
    os.environ["XLA_FLAGS"] = _with_devices(os.environ.get("XLA_FLAGS", ""), n)
    jax.config.update("jax_platforms", "cpu")
  try:
    return len(jax.devices("cpu")) >= n
  except RuntimeError:   # the CPU platform was left out of jax_platforms
    return False


def run(command: str, f, argv: list[str]) -> int:
  del command
  from experiments.jobs.checks import check_experiment_config
  check_experiment_config(f.config)
  name = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "")
  return plan_command(f.config, f.mesh, accelerator=f.accelerator, mfu=f.mfu, target=f.target,
                      dump_hlo=f.dump_hlo, accelerator_given=f["accelerator"].present,
                      name=name, argv=argv, explain_memory=f.explain_memory,
                      program=f.program)


def plan_command(config, mesh: str | None, *, accelerator: str = "h100", mfu: float = 0.4,
                 target: str | None = None, dump_hlo: str | None = None,
                 accelerator_given: bool = False, name: str = "",
                 argv: list[str] | None = None, explain_memory: bool = False,
                 program: str = "step") -> int:
  """Prints the plan of `config` on `mesh` (`data=8`, `fsdp=8,seq=8`; none: one device);
  `target`: a TPU topology to compile for; `dump_hlo`: a file for the compiled program's
  text; `argv`: the command line, rerun in a subprocess when this process lacks devices;
  `program`: "step" (the train step) or "rollout" (experiments/plan/rollout.py)."""
  import math
  from pathlib import Path

  from experiments.plan import accelerators, gpu, tpu
  from experiments.plan.report import plan_run, refuse_mesh
  from experiments.plan.rollout import PROGRAMS, check_rollout_config, format_rollout, plan_rollout
  from experiments.plan.text import format_plan
  from experiments.trainer.placement import parse_mesh
  if program not in PROGRAMS:
    raise ValueError(f"--program={program!r} is not one of {', '.join(PROGRAMS)}.")
  if program == "rollout":
    check_rollout_config(config)
  block = parse_mesh(mesh or "")
  accelerators.accelerator(accelerator)   # a bad name or MFU: refused before any work
  accelerators.projected_step_s(accelerators.accelerator(accelerator), flops=0.0,
                                collective_bytes=0.0, devices=1, mfu=mfu)
  if target:
    if gpu.is_gpu_target(target):
      gpu.parse_target(target)
      gpu.memory_fraction()   # a bad XLA_PYTHON_CLIENT_MEM_FRACTION: one line, now
    else:
      tpu.parse_topology(target)
    if accelerator_given:
      raise ValueError(f"--accelerator={accelerator} with --target={target}: the target "
                       "names the chip; leave out --accelerator.")
  if dump_hlo:
    out = Path(dump_hlo).expanduser()
    if out.is_dir() or not out.parent.is_dir():
      raise ValueError(f"--dump_hlo={dump_hlo}: give a file in an existing folder.")
  sizes = refuse_mesh(config, block)
  n = math.prod(sizes.values())
  if target and gpu.is_gpu_target(target):
    gpu.target_devices(target)   # the GPU compiler missing: one line naming the extra
  elif target:
    tpu.topology_devices(target)   # libtpu missing or the topology refused: one line
  elif n > MAX_CPU_DEVICES:
    raise ValueError(f"--mesh has {n:,} devices; XLA:CPU compiles for at most "
                     f"{MAX_CPU_DEVICES:,} host devices: plan a smaller mesh, or compile for "
                     "the chips with --target=<GPU or TPU target> (e.g. h800:8x8, v5p:4x4x4).")
  elif not provide_cpu_devices(n):
    if os.environ.get(_CHILD) or argv is None:
      raise ValueError(f"plan: could not get {n} XLA:CPU devices in this process (set "
                       f"XLA_FLAGS={DEVICES_FLAG}={n} before jax starts).")
    env = dict(os.environ, XLA_FLAGS=_with_devices(os.environ.get("XLA_FLAGS", ""), n),
               JAX_PLATFORMS="cpu", **{_CHILD: "1"})
    print(f"note: rerunning in a subprocess with {DEVICES_FLAG}={n}", file=sys.stderr)
    sys.stdout.flush()
    return subprocess.run([sys.executable, "-m", "experiments", *argv[1:]], env=env,
                          check=False).returncode
  if program == "rollout":
    result = plan_rollout(config, sizes, accelerator=accelerator, mfu=mfu, target=target,
                          explain_memory=explain_memory)
    print(format_rollout(result, name))
  else:
    result = plan_run(config, sizes, accelerator=accelerator, mfu=mfu, target=target,
                      proxy=not target, explain_memory=explain_memory)
    print(format_plan(result, name))
  if dump_hlo:
    Path(dump_hlo).expanduser().write_text(result["hlo"])
    print(f"wrote the compiled program ({result['compiler']}) to {dump_hlo}")
  return 0
