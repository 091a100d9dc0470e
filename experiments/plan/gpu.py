"""Compiling a run's step for NVIDIA GPUs on a machine that has none.

    compiler_available()           jax's CUDA plugin is installed (`pip install -e '.[gpu-compile]'`)
    parse_target("h800:8x8")       ("h800", hosts 8, GPUs per host 8); one-line errors
    target_devices("h800:8")       the compile-only devices of that target, for a Mesh
    usable_bytes("h800")           what one GPU may use: JAX's allocator's share of its memory
    quiet_cuda_startup()           keeps the plugin's start-up lines off stderr without a GPU

jax's CUDA plugin carries XLA:GPU. Given the text of a `GpuTargetConfigProto` (the
chip's compute capability, SMs, shared memory, memory size and bandwidth), `jax.
experimental.topologies.get_topology_desc(platform="cuda", target_config=SPEC,
topology="SLICESxHOSTSxGPUS")` returns devices that exist only for compilation, with
no GPU and none of NVIDIA's libraries present: a `Mesh` over them and `jit(...).lower
(...).compile()` run the GPU compiler itself, Pallas Triton kernels included (their
blocks are checked against the chip's shared memory). Memory analysis and the
program are XLA:GPU's; `cost_analysis()` is empty and autotuning (which needs a
device) is skipped, so GEMM tilings are XLA's defaults.

Targets are `<gpu>:<GPUs>` (one host: `h800:8`) or `<gpu>:<hosts>x<GPUs per host>`
(`h800:8x8`, 64 GPUs). The chips' specs ship in `gpu_specs/` (public figures; the
H800 is the H100 SXM5's chip and memory, its slower NVLink is the step-time model's
business, experiments/plan/accelerators.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import sys
from pathlib import Path

from experiments.plan.tpu import without_stderr

SPECS = Path(__file__).parent / "gpu_specs"
# The accelerator row (experiments/plan/accelerators.py) of each GPU name.
GPUS = ("h100", "h200", "h800", "a100")
GPUS_PER_HOST = 8          # the node the names stand for (DGX / HGX: 8 GPUs on NVLink)
_NAME = re.compile(r"^(?P<gpu>[a-z]\d+):(?:(?P<hosts>\d+)x)?(?P<gpus>\d+)$")
# JAX's GPU allocator preallocates this share of each GPU's memory at start-up, and a
# program may use no more (jax's GPU memory allocation documentation).
MEM_FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"
DEFAULT_MEM_FRACTION = 0.75
EXTRA = "pip install -e '.[gpu-compile]'"


def compiler_available() -> bool:
  """jax's CUDA 12 plugin (XLA:GPU) is importable; NVIDIA's libraries are not needed."""
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except (ImportError, ValueError):
    return False


def is_gpu_target(name: str | None) -> bool:
  """Whether `--target` names a GPU (`h800:8`), as opposed to a TPU topology."""
  return bool(name) and str(name).strip().lower().split(":", 1)[0] in GPUS


def parse_target(name: str) -> tuple[str, int, int]:
  """(gpu, hosts, GPUs per host) of `h800:8` or `h800:8x8`; a one-line error otherwise."""
  m = _NAME.match(str(name).strip().lower())
  if m is None or m.group("gpu") not in GPUS:
    raise ValueError(f"--target={name!r} is not a GPU target: give <gpu>:<GPUs> or "
                     f"<gpu>:<hosts>x<GPUs per host> with a GPU of {', '.join(GPUS)}, e.g. "
                     "h800:8, h100:1, h800:8x8.")
  hosts = int(m.group("hosts") or 1)
  gpus = int(m.group("gpus"))
  if hosts < 1 or gpus < 1:
    raise ValueError(f"--target={name!r}: hosts and GPUs must be at least 1.")
  if gpus > GPUS_PER_HOST:
    raise ValueError(f"--target={name!r}: a host holds at most {GPUS_PER_HOST} GPUs; give "
                     f"hosts x GPUs, e.g. {m.group('gpu')}:{-(-gpus // GPUS_PER_HOST)}x"
                     f"{GPUS_PER_HOST}.")
  return m.group("gpu"), hosts, gpus


def target_of(gpu: str, devices: int) -> str | None:
  """The target name of `devices` GPUs of `gpu` on as few hosts as hold them (`h100:4`,
  `h100:2x8`), or None when they do not fill whole hosts."""
  if devices <= GPUS_PER_HOST:
    return f"{gpu}:{devices}"
  if devices % GPUS_PER_HOST:
    return None
  return f"{gpu}:{devices // GPUS_PER_HOST}x{GPUS_PER_HOST}"


def target_config(gpu: str) -> str:
  """The text of the shipped `GpuTargetConfigProto` of `gpu`."""
  path = SPECS / f"{gpu}.txtpb"
  if not path.is_file():
    raise ValueError(f"no GPU spec for {gpu!r} (known: {', '.join(GPUS)}).")
  return path.read_text()


def spec_field(gpu: str, field: str) -> float:
  """One number of the shipped spec (`device_memory_size`, `shared_memory_per_block_optin`)."""
  m = re.search(rf"^\s*{field}:\s*([\d.]+)\s*$", target_config(gpu), re.M)
  if m is None:
    raise ValueError(f"the {gpu} spec has no {field}.")
  return float(m.group(1))


def memory_fraction() -> float:
  """XLA_PYTHON_CLIENT_MEM_FRACTION (0.75 when unset), as JAX's allocator reads it."""
  text = os.environ.get(MEM_FRACTION_VARIABLE)
  if text is None or not text.strip():
    return DEFAULT_MEM_FRACTION
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not 0 < value <= 1:
    raise ValueError(f"{MEM_FRACTION_VARIABLE}={text!r} must be a number in (0, 1] (the "
                     "share of each GPU's memory JAX's allocator takes).")
  return value


def usable_bytes(gpu: str) -> float:
  """Bytes one GPU's programs may use: the allocator's fraction of the memory CUDA
  reports (the spec's `device_memory_size`)."""
  return memory_fraction() * spec_field(gpu, "device_memory_size")


def _missing_compiler() -> ValueError:
  return ValueError(f"--target for GPUs needs the GPU compiler (jax's CUDA plugin): {EXTRA} "
                    "(it compiles for GPUs on this machine; no GPU or CUDA library is used).")


def target_devices(name: str) -> list:
  """The compile-only devices of the GPU target `name` (module docstring)."""
  gpu, hosts, gpus = parse_target(name)
  if not compiler_available():
    raise _missing_compiler()
  quiet_cuda_startup()
  from jax.experimental import topologies
  try:
    with without_stderr():
      topology = topologies.get_topology_desc(
          platform="cuda", target_config=target_config(gpu), topology=f"1x{hosts}x{gpus}")
  except Exception as e:   # the plugin refuses the spec or the shape (JaxRuntimeError)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"--target={name!r}: the GPU compiler refuses this target ({first}).") from e
  devices = list(topology.devices)
  if len(devices) != hosts * gpus:
    raise ValueError(f"--target={name!r}: the GPU compiler built {len(devices)} devices, "
                     f"expected {hosts * gpus}.")
  return devices


def nvidia_driver_present() -> bool:
  return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


_QUIETED = False


def quiet_cuda_startup() -> None:
  """With jax's CUDA plugin installed on a machine without an NVIDIA driver (to compile
  for GPUs elsewhere), every process would print "Could not find cuda drivers" lines
  at `import jax` and at its first backend, and, unless the platforms exclude CUDA, a
  multi-line plugin configuration traceback ("Unable to load CUDA"), before falling
  back to the CPU. Here: the plugin's CUDA version check is skipped (there is no CUDA
  to check; the plugin then registers, so that GPU targets compile), and jax's import
  and plugin discovery run with stderr pointed away. Where a driver is present, or the
  plugin is absent, nothing changes. Call it before anything imports jax."""
  global _QUIETED
  if _QUIETED or not compiler_available() or nvidia_driver_present():
    return
  _QUIETED = True
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  with without_stderr():
    import jax  # noqa: F401  (the plugin's libraries load here)
    try:   # private, so guarded: discovery then happens later, not quietly
      from jax._src import xla_bridge
      xla_bridge._discover_and_register_pjrt_plugins()
    except (ImportError, AttributeError):
      pass


# What XLA:GPU writes to stderr because no device is present, as a plan's note.
_DEVICELESS_MESSAGES = {
    "Missing deviceless CUB scratch size data": (
        "XLA:GPU cannot size CUB's sort without a device, so this program's sorts take "
        "XLA's fallback sort (slower at run time than on a GPU-compiled program)"),
}
_FOLLOW_UPS = ("To avoid this, compile with a GPU present",)


@contextlib.contextmanager
def compiler_messages(notes: set):
  """stderr (file descriptor 2) captured while XLA:GPU compiles: its known messages
  about compiling without a device become `notes` (the plan prints them once); any
  other line is written back to stderr at the end."""
  import tempfile
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode(errors="replace")
      rest = []
      for line in text.splitlines():
        known = [note for key, note in _DEVICELESS_MESSAGES.items() if key in line]
        notes.update(known)
        if not known and not any(f in line for f in _FOLLOW_UPS):
          rest.append(line)
      if rest:
        sys.stderr.write("\n".join(rest) + "\n")
        sys.stderr.flush()


# XLA:GPU tiles a Triton GEMM fusion by autotuning on a device; without one it takes a
# default tiling, which for some fused dots (Qwen3-VL's vision MLP inside the rematerialised
# backward) it cannot find, and the compile stops with this internal error.
_NO_GEMM_TILING = "Couldn't find output tile sizes"
CUBLAS_GEMMS = {"xla_gpu_enable_triton_gemm": False}


def compile_deviceless(lowered, notes: set, options: dict | None = None):
  """`lowered.compile(options)` for a GPU target; where XLA:GPU finds no default tiling
  for a Triton GEMM fusion, the program is compiled again with its GEMMs on cuBLAS (one
  of the two an autotuned compile chooses between), said in `notes`."""
  try:
    return lowered.compile(options or None)
  except Exception as e:   # JaxRuntimeError: INTERNAL
    if _NO_GEMM_TILING not in str(e):
      raise
  notes.add("XLA:GPU found no default tiling for a Triton GEMM fusion (autotuning needs a "
            "device), so this program's GEMMs are compiled for cuBLAS "
            "(xla_gpu_enable_triton_gemm=false), which an autotuned compile may also choose")
  return lowered.compile({**(options or {}), **CUBLAS_GEMMS})


@contextlib.contextmanager
def lowering_device(devices):
  """The first of the target's devices as jax's default device while a program is lowered:
  jax 0.11's Pallas Triton lowering reads the chip (its compute capability) from the
  default device or an abstract mesh's, which on a CPU host would be the CPU. Nothing is
  placed on it (lowering allocates nothing); jax 0.10 reads the chip elsewhere."""
  import jax
  if not devices:
    yield
    return
  with jax.default_device(devices[0]):
    yield
