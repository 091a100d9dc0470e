"""Multi-host start-up with `jax.distributed`, before any device is touched.

Every process calls `initialize(...)` (or, in a training run, `start_distributed`)
before touching any device; afterwards `jax.devices()` lists the devices of ALL
processes, a mesh built from it spans the hosts, and the same jitted program runs
in every process (SPMD). On SLURM, Open MPI or TPU pods `jax.distributed.initialize()`
finds its arguments itself; elsewhere pass them, or set

  JAX_COORDINATOR_ADDRESS=host0:1234  JAX_NUM_PROCESSES=2  JAX_PROCESS_ID=0|1

(the first is read by JAX itself, the other two by `initialize` below).

A training run spans several processes when the command line names the
coordinator, the process count or this process's index, or when
JAX_COORDINATOR_ADDRESS is set (JAX_NUM_PROCESSES / JAX_PROCESS_ID then fill the
other two). Every process runs the same command; process 0 holds the workdir lock
and writes metrics (experiments/trainer/loop.py), every process saves its own
shards. A process lost midway ends every other one within `--lost_process_timeout`
seconds, in one line that names it (experiments/trainer/lost_process.py). The
multi-process check of the sharded layer is
`python -m experiments.tools.bench.multihost`.
"""

from __future__ import annotations

import os

import jax

from experiments.trainer.lost_process import runtime_timeouts


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, cpu_collectives: str = "gloo",
               timeout_s: int = 300, lost_timeout_s: float | None = None) -> None:
  """`jax.distributed.initialize` with CPU collectives turned on.

  Arguments left None come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID, or from JAX's cluster detection when those are unset too.
  CPU devices only talk to other processes through a collectives library
  ("gloo" ships with jaxlib); GPUs and TPUs ignore the setting. `lost_timeout_s`:
  JAX's heartbeat and shutdown timeouts are set beyond it, so that the run's own
  watch reports a lost process first (experiments/trainer/lost_process.py).
  """
  if num_processes is None and "JAX_NUM_PROCESSES" in os.environ:
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
  if process_id is None and "JAX_PROCESS_ID" in os.environ:
    process_id = int(os.environ["JAX_PROCESS_ID"])
  jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  extra = {} if lost_timeout_s is None else runtime_timeouts(lost_timeout_s)
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             initialization_timeout=timeout_s, **extra)


def wants_distributed(coordinator_address: str | None = None,
                      num_processes: int | None = None,
                      process_id: int | None = None) -> bool:
  """Whether these arguments or the environment ask for several processes."""
  given = (coordinator_address, num_processes, process_id)
  return any(v is not None for v in given) or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def start_distributed(coordinator_address: str | None = None,
                      num_processes: int | None = None,
                      process_id: int | None = None, *,
                      lost_timeout_s: float | None = None) -> bool:
  """Starts `jax.distributed` if the run spans several processes; returns whether it did.

  Arguments left None come from the environment (`initialize`, which also turns on
  CPU collectives).
  """
  if not wants_distributed(coordinator_address, num_processes, process_id):
    return False
  initialize(coordinator_address, num_processes, process_id, lost_timeout_s=lost_timeout_s)
  return True
