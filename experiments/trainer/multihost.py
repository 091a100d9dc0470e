"""Multi-host start-up of a training run: `jax.distributed`, before any device is touched.

A run spans several processes when the command line names the coordinator,
the process count or this process's index, or when JAX_COORDINATOR_ADDRESS is
set (JAX_NUM_PROCESSES / JAX_PROCESS_ID then fill the other two). Every process
runs the same command; process 0 holds the workdir lock and writes metrics
(experiments/trainer/loop.py), every process saves its own shards.
"""

from __future__ import annotations

import os


def wants_distributed(coordinator_address: str | None = None,
                      num_processes: int | None = None,
                      process_id: int | None = None) -> bool:
  """Whether these arguments or the environment ask for several processes."""
  given = (coordinator_address, num_processes, process_id)
  return any(v is not None for v in given) or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def start_distributed(coordinator_address: str | None = None,
                      num_processes: int | None = None,
                      process_id: int | None = None) -> bool:
  """Starts `jax.distributed` if the run spans several processes; returns whether it did.

  Arguments left None come from the environment (`lngram_jax.sharding.multihost.
  initialize`, which also turns on CPU collectives).
  """
  if not wants_distributed(coordinator_address, num_processes, process_id):
    return False
  from lngram_jax.sharding.multihost import initialize
  initialize(coordinator_address, num_processes, process_id)
  return True
