"""The blocked sink-softmax readout (the absorbed Lngram readout's core) in Pallas.

Files: `reference.py` (XLA twin), `triton_gpu.py` (GPU), `mosaic_tpu.py`
(TPU), `common.py` (block sizes, checks), `api.py` (dispatch, custom_vjp,
the layer-facing `pallas_readout`); `fused_triton.py` and `fused.py`: the
variant that also gathers and normalises the table rows inside the kernel
(`fused_readout`, GPU only, with its unfused twin `fused_readout_reference`).
"""

from kernels.sink_readout.api import (
    default_implementation,
    pallas_attention,
    pallas_readout,
    sink_readout,
)
from kernels.sink_readout.common import BlockSizes
from kernels.sink_readout.fused import fused_readout, fused_readout_reference
from kernels.sink_readout.reference import sink_readout_reference

__all__ = [
    "BlockSizes",
    "default_implementation",
    "fused_readout",
    "fused_readout_reference",
    "pallas_attention",
    "pallas_readout",
    "sink_readout",
    "sink_readout_reference",
]
