"""Grouped matrix multiplication: rows sorted by group, each group times its own matrix."""

from kernels.grouped_matmul.api import IMPLEMENTATIONS, grouped_matmul
from kernels.grouped_matmul.reference import grouped_matmul_reference

__all__ = ["IMPLEMENTATIONS", "grouped_matmul", "grouped_matmul_reference"]
