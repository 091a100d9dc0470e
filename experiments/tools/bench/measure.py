"""Timing and memory of one compiled program, for the efficiency benchmark (`lm_efficiency`).

`time_program` compiles once, warms up once and times `repeats` calls (with
donated arguments rebuilt before each clock starts); `peak_bytes` is the call's
peak memory: the device's bytes in use before the call (or, without
`memory_stats()`, the live argument bytes) plus what the compiled program
allocates (`memory_analysis()`). `run_with_limit` runs one row in a worker
thread so a hung compile costs that row only.
"""

from __future__ import annotations

import threading
import time

import jax
import numpy as np


def nbytes(tree) -> int:
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def _device_stats():
  try:
    return jax.devices()[0].memory_stats()
  except Exception:   # noqa: BLE001 - some backends raise instead of returning None
    return None


def memory_source() -> str:
  if _device_stats():
    return ("device: memory_stats() bytes_in_use before the call + the compiled program's "
            "temp + output - alias bytes (memory_analysis())")
  return ("compiled: live argument bytes + the compiled program's temp + output - alias "
          "bytes (memory_analysis(); no device memory_stats on this backend)")


def peak_bytes(compiled, args) -> dict:
  """The call's peak: resident bytes + what the program allocates (see the module doc)."""
  stats = _device_stats()
  resident = int(stats["bytes_in_use"]) if stats else nbytes(args)
  try:
    ma = compiled.memory_analysis()
  except Exception:   # noqa: BLE001 - not every backend implements it
    ma = None
  out = {"resident_bytes": resident}
  if ma is not None:
    extra = int(ma.temp_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes)
    out.update(temp_bytes=int(ma.temp_size_in_bytes), output_bytes=int(ma.output_size_in_bytes),
               alias_bytes=int(ma.alias_size_in_bytes),
               peak_bytes=resident + extra)
  else:
    out["peak_bytes"] = None
  return out


def time_program(fn, args, repeats: int, *, donate=(), fresh=None) -> dict:
  """Compile `fn` for `args`, one warm-up call, then `repeats` timed calls (seconds).

  With `donate` (argnums) the program updates those arguments in place, so each
  call needs new ones: the warm-up consumes `args`, every timed call gets
  `fresh()` (made, and finished, before its clock starts).
  """
  t0 = time.perf_counter()
  compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  mem = peak_bytes(compiled, args)
  out = jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    call_args = jax.block_until_ready(fresh()) if fresh else args
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*call_args))
    times.append(time.perf_counter() - t0)
    del call_args
  stats = _device_stats()
  mem["device_peak_gib"] = None if not stats or "peak_bytes_in_use" not in stats else (
      stats["peak_bytes_in_use"] / 2**30)
  gib = None if mem["peak_bytes"] is None else mem["peak_bytes"] / 2**30
  return {"compile_s": compile_s, "times_s": times, "best_ms": 1e3 * min(times),
          "median_ms": 1e3 * float(np.median(times)), "memory_gib": gib, "memory": mem,
          "output": out, "compiled": compiled}


def format_gib(x):
  return "memory n/a" if x is None else f"{x:.3f} GiB"


def run_with_limit(fn, limit_s: float):
  """fn() in a daemon thread: (result, None), or (None, 'timeout' | error text)."""
  box = {}

  def target():
    try:
      box["result"] = fn()
    except Exception as e:   # noqa: BLE001 - a failing row is reported, the others run
      box["error"] = f"{type(e).__name__}: {e}"

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(limit_s)
  if thread.is_alive():
    return None, "timeout"
  return box.get("result"), box.get("error")
