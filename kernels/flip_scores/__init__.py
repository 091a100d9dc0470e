"""Scores of a row and its one-bit neighbours against a cotangent, with the row's
scatter-add, as one Pallas kernel (the one-bit surrogate's backward, DESIGN.md §2.7).

Files: `reference.py` (the XLA twin: the one definition of the contract),
`triton_gpu.py` (GPU; interpret mode on CPU). The Pallas module loads on first
use, so importing the reference does not import Pallas.
"""

import importlib

from kernels.flip_scores.reference import acc_dtype, flip_scores_reference


def __getattr__(name):
  if name == "triton_gpu":
    return importlib.import_module("kernels.flip_scores.triton_gpu")
  raise AttributeError(f"module 'kernels.flip_scores' has no attribute {name!r}")


__all__ = ["acc_dtype", "flip_scores_reference", "triton_gpu"]
