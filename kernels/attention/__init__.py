"""Causal self-attention with packed segments: an XLA reference and flash kernels.

Files: `reference.py` (the XLA twin: scores and softmax in float32 over the whole
[T, T] square, the one definition of the contract: the decoder's mask), `splash_tpu.py` (TPU: jax's
splash attention kernel, Mosaic), `flash_gpu.py` (GPU: jax's Pallas Triton flash
attention), `api.py` (dispatch by the platform the program is lowered for, and the
split over a mesh's batch axes). The kernels keep O(T) memory per row: scores
exist one block at a time, forward and backward.

The Pallas modules load on first use.
"""

from kernels.attention.reference import attention_reference, segments_with_padding

__all__ = ["attention_reference", "causal_attention", "segments_with_padding"]


def __getattr__(name):
  if name == "causal_attention":
    from kernels.attention.api import causal_attention
    return causal_attention
  raise AttributeError(name)
