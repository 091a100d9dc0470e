"""Orbax checkpoints of training runs, and `restore` for notebooks."""

from experiments.checkpoint.manager import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointError,
    tree_digest,
)
from experiments.checkpoint.restore import restore

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "CorruptCheckpointError",
    "restore",
    "tree_digest",
]
