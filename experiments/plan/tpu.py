"""Compiling a run's step for real TPU chips on a machine that has none.

    libtpu_available()              the TPU compiler is installed (`pip install -e '.[tpu]'`)
    topology_devices("v5p:2x2x2")   the devices of that topology, for a Mesh; compile only
    chip_of(devices)                the generation's row of accelerators.ACCELERATORS
    proxy_topology("v5p", 8)        a topology of that generation with 8 devices, or None

The TPU compiler ships in `libtpu`. With it, `jax.experimental.topologies.
get_topology_desc(topology_name=..., platform="tpu")` returns devices that exist
only for compilation: a `Mesh` over them and `jit(...).lower(...).compile()` run
the real TPU compiler, so memory analysis, cost analysis and the final HLO are
the target's (MaxText checks fit this way before renting chips). Names are
`<generation>:<chips per axis>`: v5e and v6e 2-D (`v5e:2x2`, `v6e:2x4`), v4 and
v5p 3-D (`v5p:2x2x1`, `v5p:2x2x2`); the smallest is one host's 2x2 chips.
v5e, v5p and v6e have one device per chip; v4 shows each of a chip's two
TensorCores as a device, so the HBM per device is half a chip's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import sys

GENERATIONS = ("v4", "v5e", "v5p", "v6e")
# The accelerator row (experiments/plan/accelerators.py) of each generation.
ACCELERATOR = {"v4": "tpu_v4", "v5e": "tpu_v5e", "v5p": "tpu_v5p", "v6e": "tpu_v6e"}
_NAME = re.compile(r"^(?P<gen>v\d+[a-z]*):(?P<dims>\d+(?:x\d+)+)$")


def libtpu_available() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def _allow_several_processes() -> None:
  """libtpu's lockfile is for processes that own real chips: compiling processes may
  run side by side (tests in two workers, a plan beside another)."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@contextlib.contextmanager
def without_stderr():
  """File descriptor 2 pointed away while libtpu (or jax's CUDA plugin, gpu.py) starts:
  on a host without chips it writes half a dozen lines of warnings about the chips it
  cannot find (to the descriptor, past Python), which would bury a plan's one-line
  errors."""
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, "w") as devnull:
      os.dup2(devnull.fileno(), 2)
      yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def parse_topology(name: str) -> tuple[str, tuple[int, ...]]:
  """(generation, chips per axis) of a topology name; a one-line error otherwise."""
  m = _NAME.match(str(name).strip().lower())
  if m is None or m.group("gen") not in GENERATIONS:
    raise ValueError(f"--target={name!r} is not a TPU topology: give <generation>:<chips "
                     f"per axis> with a generation of {', '.join(GENERATIONS)}, e.g. "
                     "v5e:2x2, v6e:2x4, v5p:2x2x1, v5p:2x2x2 (GPUs: <gpu>:<GPUs> or "
                     "<gpu>:<hosts>x<GPUs per host> with a GPU of h100, h200, h800, a100).")
  dims = tuple(int(d) for d in m.group("dims").split("x"))
  want = 3 if m.group("gen") in ("v4", "v5p") else 2
  if len(dims) != want:
    raise ValueError(f"--target={name!r}: {m.group('gen')} topologies have {want} axes "
                     f"(e.g. {'v5p:2x2x2' if want == 3 else 'v5e:2x4'}).")
  return m.group("gen"), dims


def devices_per_chip(generation: str) -> int:
  return 2 if generation == "v4" else 1


def topology_devices(name: str) -> list:
  """The compile-only devices of the topology `name` (module docstring)."""
  generation, dims = parse_topology(name)
  if not libtpu_available():
    raise ValueError("--target needs the TPU compiler, libtpu: pip install -e '.[tpu]' "
                     "(it compiles for TPU chips on this machine; no TPU is used).")
  _allow_several_processes()
  from jax.experimental import topologies
  try:
    with without_stderr():
      topology = topologies.get_topology_desc(topology_name=name.strip().lower(),
                                              platform="tpu")
  except Exception as e:   # libtpu refuses a shape it does not build (JaxRuntimeError)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"--target={name!r}: the TPU compiler refuses this topology ({first}); "
                     "the smallest is one host's 2x2 chips, e.g. v5e:2x2 or v5p:2x2x1.") from e
  devices = list(topology.devices)
  expected = math.prod(dims) * devices_per_chip(generation)
  if len(devices) != expected:   # a libtpu that counts devices otherwise: say so
    raise ValueError(f"--target={name!r}: libtpu built {len(devices)} devices, expected "
                     f"{expected}.")
  return devices


def proxy_topology(generation: str, devices: int) -> str | None:
  """A topology of `generation` with `devices` devices (chips × devices per chip), as
  square as the generation's axes allow, or None when there is none (fewer than one
  host's 2x2 chips, or a count that is not 4 times a power of two)."""
  chips, rest = divmod(devices, devices_per_chip(generation))
  if rest or chips < 4 or chips & (chips - 1):
    return None
  axes = 3 if generation in ("v4", "v5p") else 2
  dims = [1] * axes
  dims[0] = dims[1] = 2
  left = chips // 4
  while left > 1:   # double the smallest axis, the last of equals: v5p:2x2x2, 2x2x4, 2x4x4
    k = max(range(axes), key=lambda j: (-dims[j], j))
    dims[k] *= 2
    left //= 2
  return f"{generation}:{'x'.join(str(d) for d in dims)}"


_AMOUNT = r"\(([\d.]+)\s*([KMGT]?)i?B?\)"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _amount(text: str, label: str) -> float | None:
  """Bytes of `label (12.3G)` in a TPU compiler message (its G is GiB: 16 GiB v5e
  chips report 15.75G usable)."""
  m = re.search(label + r"\s*" + _AMOUNT, text)
  return None if m is None else float(m.group(1)) * _UNITS[m.group(2)]


def out_of_memory(error: BaseException) -> dict | None:
  """{"temp", "usable", "message"} of a TPU compile refused for memory, else None."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
    return None
  first = next((line for line in text.splitlines() if "memory" in line.lower()), text)
  return {"temp": _amount(text, r"HLO temporaries"), "usable": _amount(text, r"available HBM"),
          "message": first.strip()}


_USABLE: dict[str, float] = {}


def usable_hbm(devices) -> float:
  """Bytes of HBM one device of `devices` may use, as the TPU compiler counts it (the
  chip's HBM less what the runtime keeps): read off its refusal of a program far too
  large for any chip, once per device kind."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P
  kind = devices[0].device_kind
  if kind not in _USABLE:
    mesh = Mesh(np.array(devices[:1]), ("x",))
    huge = jax.ShapeDtypeStruct((2**20, 2**20), jnp.float32, sharding=NamedSharding(mesh, P()))
    try:
      jax.jit(lambda a: a * 2).trace(huge).lower().compile()
      raise RuntimeError(f"the TPU compiler accepted a 4 TiB program for {kind}")
    except Exception as e:   # the refusal names the usable HBM
      oom = out_of_memory(e)
      if oom is None or oom["usable"] is None:
        raise
      _USABLE[kind] = oom["usable"]
  return _USABLE[kind]


def quiet_backend_probe() -> None:
  """With libtpu installed on a machine without TPU chips (to plan for chips elsewhere),
  jax's TPU backend probe fails quietly at start-up but libtpu still writes its
  warnings about missing chips to stderr, in every command. Run that probe with
  stderr pointed away; where chips exist, or jax's internals differ, nothing changes."""
  if not libtpu_available():
    return
  try:
    import dataclasses

    from jax._src import hardware_utils, xla_bridge
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
      return
    entry = xla_bridge._backend_factories.get("tpu")
    if entry is None or getattr(entry.factory, "_quiet", False):
      return
    probe = entry.factory

    def quiet(*args, **kwargs):
      with without_stderr():
        return probe(*args, **kwargs)

    quiet._quiet = True
    xla_bridge._backend_factories["tpu"] = dataclasses.replace(entry, factory=quiet)
  except (ImportError, AttributeError, TypeError):
    return
