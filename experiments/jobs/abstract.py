"""What a job's planner hands `lngram-exp plan` (experiments/plan): a run's step from
shapes alone.

    AbstractRun            the model config, mesh, abstract state and batch, the jitted step
    bytes_per_device(tree) bytes one device holds of an abstract tree

A planner (`planner()` of a job, experiments/jobs/registry.py) builds the state with
`experiments.trainer.state.abstract_train_state`, the trainer's own layout; the plan
compiles `step` on it and reads the bytes per device from the shardings.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass
class AbstractRun:
  """model: the (text) decoder's config; mesh; state {"params", "opt_state", "step"} and
  rest: ShapeDtypeStructs with shardings; batch: the abstract global batch; step: the
  jitted train step; tokens: per step (global)."""

  model: Any
  mesh: Any
  state: dict
  rest: dict
  batch: dict
  step: Any
  tokens: int


def bytes_per_device(tree) -> int:
  """Bytes one device holds of an abstract tree (each leaf's shard under its sharding;
  with uneven shards, the largest)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += jnp.dtype(leaf.dtype).itemsize * math.prod(shape)
  return total
