"""Several processes (hosts) with `jax.distributed`.

Start-up: every process calls `initialize(...)` before touching any device;
afterwards `jax.devices()` lists the devices of ALL processes, a mesh built
from it spans the hosts, and the same jitted program runs in every process
(SPMD). On SLURM, Open MPI or TPU pods `jax.distributed.initialize()` finds
its arguments itself; elsewhere pass them, or set

  JAX_COORDINATOR_ADDRESS=host0:1234  JAX_NUM_PROCESSES=2  JAX_PROCESS_ID=0|1

(the first is read by JAX itself, the other two by `initialize` below). The
multi-process check that uses it is `python -m experiments.bench.multihost`.
"""

from __future__ import annotations

import os

import jax


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, cpu_collectives: str = "gloo",
               timeout_s: int = 300) -> None:
  """`jax.distributed.initialize` with CPU collectives turned on.

  Arguments left None come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID, or from JAX's cluster detection when those are unset too.
  CPU devices only talk to other processes through a collectives library
  ("gloo" ships with jaxlib); GPUs and TPUs ignore the setting.
  """
  if num_processes is None and "JAX_NUM_PROCESSES" in os.environ:
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
  if process_id is None and "JAX_PROCESS_ID" in os.environ:
    process_id = int(os.environ["JAX_PROCESS_ID"])
  jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             initialization_timeout=timeout_s)
