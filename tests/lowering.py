"""Programs lowered (or compiled) for the real targets on a CPU machine.

    lower_text(fn, avals, "cuda" | "tpu")   the StableHLO a GPU / TPU would compile
    KERNEL_CALL[platform]                   how a Pallas kernel appears in that text
    tpu_devices("v5e:2x2")                  devices of a TPU topology (libtpu), for
                                            `jit(...).lower(...).compile()` with the
                                            real TPU compiler; skips without libtpu

The CUDA lowering reads the target GPU from an abstract mesh at trace time.
"""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

H100 = AbstractMesh((), (), abstract_device=AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", platform="gpu", num_cores=132))
KERNEL_CALL = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}


def lower_text(fn, avals, platform: str) -> str:
  """`fn` jitted, traced at `avals` and lowered for `platform` ("cuda" or "tpu")."""
  if platform == "cuda":
    with use_abstract_mesh(H100):
      return jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  return jax.jit(fn).trace(*avals).lower(lowering_platforms=(platform,)).as_text()


def tpu_devices(topology: str = "v5e:2x2"):
  """The devices of a TPU topology (compile-only), or skip when libtpu is absent."""
  from experiments.plan import tpu
  if not tpu.libtpu_available():
    pytest.skip("needs libtpu (pip install -e '.[tpu]')")
  return tpu.topology_devices(topology)


# The GPUs the kernels are compiled for: sm_90 (H100, H800, H200) and sm_80 (A100).
GPU_TARGETS = {"sm90": "h100:1", "sm80": "a100:1"}


def gpu_compiled_text(fn, avals, target: str = "h100:1") -> str:
  """`fn` jitted and compiled by XLA:GPU for one GPU of `target` (the device-less GPU
  compiler of jax's CUDA plugin, experiments/plan/gpu.py), its program as text: Pallas
  Triton kernels are compiled to the chip there, their blocks checked against its shared
  memory. Skips when the plugin is absent (pip install -e '.[gpu-compile]')."""
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from experiments.plan import gpu
  from experiments.plan.compile import compile_for_gpu
  if not gpu.compiler_available():
    pytest.skip(f"needs the GPU compiler ({gpu.EXTRA})")
  mesh = Mesh(np.array(gpu.target_devices(target)), ("gpu",))
  placed = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, P()))
            for a in avals]
  return compile_for_gpu(jax.jit(fn).trace(*placed), list(mesh.devices.flat)).as_text()
