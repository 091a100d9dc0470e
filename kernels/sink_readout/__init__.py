"""The blocked sink-softmax readout in Pallas: a standalone op on [BT, Hq, Dr].

Files: `reference.py` (the XLA twin: the one definition of the contract),
`triton_gpu.py` (GPU), `triton_amortised.py` (GPU, a token block per dot:
`BlockSizes(layout="token_block")`), `mosaic_tpu.py` (TPU), `common.py` (block sizes,
checks, mode types), `api.py` (`sink_readout_kernel`: dispatch and custom_vjp); `fused_triton.py`:
the variant that also gathers and normalises rows of tables by row id inside
the kernel (GPU only; twin `reference.fused_reference`).

The Pallas modules load on first use, so that a model importing only the XLA
reference (`lngram_jax.readout`) does not import the Pallas backends.
"""

import importlib

from kernels.sink_readout.common import Backward, BlockSizes, Implementation, Layout
from kernels.sink_readout.reference import (
    fused_reference,
    gather_rows,
    sink_readout_reference,
)

_LAZY = {
    "default_implementation": ("kernels.sink_readout.api", "default_implementation"),
    "sink_readout_kernel": ("kernels.sink_readout.api", "sink_readout_kernel"),
    "fused_triton": ("kernels.sink_readout.fused_triton", None),
    "mosaic_tpu": ("kernels.sink_readout.mosaic_tpu", None),
    "triton_amortised": ("kernels.sink_readout.triton_amortised", None),
    "triton_gpu": ("kernels.sink_readout.triton_gpu", None),
}


def __getattr__(name):
  if name not in _LAZY:
    raise AttributeError(f"module 'kernels.sink_readout' has no attribute {name!r}")
  module_name, attr = _LAZY[name]
  module = importlib.import_module(module_name)
  return module if attr is None else getattr(module, attr)


__all__ = [
    "Backward",
    "BlockSizes",
    "Implementation",
    "Layout",
    "default_implementation",
    "fused_reference",
    "fused_triton",
    "gather_rows",
    "mosaic_tpu",
    "sink_readout_kernel",
    "sink_readout_reference",
    "triton_amortised",
    "triton_gpu",
]
