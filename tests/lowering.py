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
