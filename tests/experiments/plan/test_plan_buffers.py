"""`plan --explain_memory`: the largest buffers live at a compiled program's memory peak,
from the compiler's buffer assignment (experiments/plan/buffers.py).

A program with a planted intermediate of known shape (a [2048, 3072] float32 matmul output
that a sort must read whole, so no fusion can avoid it) compiled by XLA:CPU and by XLA:GPU: the
listing names that buffer, its bytes, the JAX operation and this file's line that made it.
The plan of a tiny model lists its peak's buffers, and their live bytes are the compiler's
temporaries.
"""

import inspect

import jax
import jax.numpy as jnp
import pytest

from experiments.configs import load_config
from experiments.plan import buffers, gpu
from experiments.plan.compile import compile_for_gpu
from experiments.plan.report import plan_run
from experiments.plan.text import format_plan

N, K, M = 2048, 64, 3072


def _planted(a_NxK, b_KxM):
  big_NxM = a_NxK @ b_KxM   # the planted buffer: 24 MiB of float32
  return jnp.sum(jnp.sort(big_NxM, axis=0)[0])


PLANTED_LINE = inspect.getsourcelines(_planted)[1] + 1


def _listing(tmp_path, compiler, devices=None):
  sharding = (jax.sharding.SingleDeviceSharding(devices[0]) if devices else None)
  a = jax.ShapeDtypeStruct((N, K), jnp.float32, sharding=sharding)
  b = jax.ShapeDtypeStruct((K, M), jnp.float32, sharding=sharding)
  traced = jax.jit(_planted).trace(a, b)
  options = buffers.dump_options(tmp_path, compiler)
  if compiler == "XLA:GPU":
    compile_for_gpu(traced, devices, options)
  else:
    traced.lower().compile(options)
  return buffers.peak_buffers(tmp_path, top=3)


def _assert_names_the_planted_buffer(peak):
  assert peak is not None and peak["live_bytes"] >= N * M * 4
  planted = [b for b in peak["buffers"] if b["shape"] == f"f32[{N},{M}]"]
  assert planted and planted[0]["bytes"] == N * M * 4, peak["buffers"]
  here = f"test_plan_buffers.py:{PLANTED_LINE}"
  made_here = [b for b in planted if b["source"].endswith(here)]
  assert made_here and "dot_general" in made_here[0]["op"], planted


def test_xla_cpu_names_the_planted_buffer(tmp_path):
  _assert_names_the_planted_buffer(_listing(tmp_path, "XLA:CPU"))


def test_xla_gpu_names_the_planted_buffer(tmp_path):
  if not gpu.compiler_available():
    pytest.skip(f"needs the GPU compiler ({gpu.EXTRA})")
  _assert_names_the_planted_buffer(_listing(tmp_path, "XLA:GPU", gpu.target_devices("h100:1")))


def test_without_a_dump_there_is_no_listing(tmp_path):
  assert buffers.peak_buffers(tmp_path) is None


def test_the_plan_lists_its_peak(tmp_path):
  """A tiny model's GPU plan: ten buffers, largest first, whose live bytes at the peak are
  the compiled step's temporaries (within what outputs share with them)."""
  if not gpu.compiler_available():
    pytest.skip(f"needs the GPU compiler ({gpu.EXTRA})")
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  r = plan_run(config, {"data": 1}, target="h100:1", explain_memory=True)
  peak = r["buffers"]
  sizes = [b["bytes"] for b in peak["buffers"]]
  assert len(sizes) == 10 and sizes == sorted(sizes, reverse=True)
  temp = r["xla"]["temp"]
  assert 0.5 * temp <= peak["live_bytes"] <= temp + r["xla"]["output"], (peak, r["xla"])
  lines = format_plan(r).splitlines()
  at = next(i for i, line in enumerate(lines) if line.startswith("  at the peak"))
  assert "[XLA:GPU buffer assignment]" in lines[at]
  assert all(lines[at + k].lstrip().startswith(f"{k}.") for k in range(1, 11))
  assert any("experiments/" in line for line in lines[at + 1:at + 11])
