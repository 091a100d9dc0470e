"""Checkpoints of training runs (the library's orbax format) and `restore` for notebooks.

The generic part (Checkpointer, digests, errors) lives in `lngram_jax.checkpoint`,
which the sharded layer uses too; a run keeps its steps in `<workdir>/checkpoints`,
the full text of checkpoint failures in `<workdir>/checkpoints.log`, and its
training lock in `<workdir>/.lock` (`WorkdirLock`).
"""

from experiments.checkpoint.lock import WorkdirLock
from experiments.checkpoint.restore import restore, run_checkpointer
from lngram_jax.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointSaveError,
    ConfigMismatchError,
    CorruptCheckpointError,
    MissingStepError,
    WorkdirLockedError,
    tree_digest,
    tree_digests,
)

__all__ = [
    "CheckpointError",
    "CheckpointSaveError",
    "Checkpointer",
    "ConfigMismatchError",
    "CorruptCheckpointError",
    "MissingStepError",
    "WorkdirLock",
    "WorkdirLockedError",
    "restore",
    "run_checkpointer",
    "tree_digest",
    "tree_digests",
]
