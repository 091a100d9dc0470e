"""Checkpoints of training runs (the library's orbax format) and `restore` for notebooks.

The generic part (Checkpointer, digests, errors) lives in `lngram_jax.checkpoint`,
which the sharded layer uses too; a run keeps its steps in `<workdir>/checkpoints`.
"""

from experiments.checkpoint.restore import restore, run_checkpointer
from lngram_jax.checkpoint import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointError,
    tree_digest,
    tree_digests,
)

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "restore",
    "run_checkpointer",
    "tree_digest",
    "tree_digests",
]
