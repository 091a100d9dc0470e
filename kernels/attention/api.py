"""Dispatch for causal attention within segments: a flash kernel per target, the XLA twin.

    o = causal_attention(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, segment_ids_BxT,
                         valid_BxT, mesh=mesh, batch_axes=("data", "fsdp"))

`implementation=None` picks by the platform the program is lowered for
(`jax.lax.platform_dependent`), not by the process that traces it: splash
attention (Mosaic) in a program compiled for TPU, the Pallas Triton flash kernel
for a GPU, the XLA reference elsewhere (CPU) and wherever the shapes do not fit a
kernel. A CPU host compiling for a TPU topology therefore gets the splash kernel.
A length the kernel's blocks do not divide is padded at the end, the padding in a
segment of its own (-2: no real query reads it), and cut off after.
"xla", "splash" and "triton" name one; a named kernel runs compiled on its own
platform and interpreted on any other (`interpret=None`).

A Pallas kernel is one opaque call: XLA cannot split it over devices, and would
gather a batch split over a mesh onto every device. With a `mesh` whose
`batch_axes` hold more than one device, each kernel call therefore runs inside
`jax.shard_map` on its block of rows (heads and time whole); a mesh that splits
time (a `seq` axis) takes the XLA form, which XLA partitions itself.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels.attention import flash_gpu, splash_tpu
from kernels.attention.reference import attention_reference, segments_with_padding

Implementation = Literal["xla", "splash", "triton"]
IMPLEMENTATIONS = ("xla", "splash", "triton")
NATIVE_PLATFORMS = {"splash": ("tpu",), "triton": ("cuda", "rocm")}


_MODULES = {"splash": splash_tpu, "triton": flash_gpu}
PAD_SEGMENT = -2   # the segment of the positions added to reach a kernel's length


def _fits(impl: str, T: int, head_dim: int) -> bool:
  return _MODULES[impl].head_width_supported(head_dim) and T >= 16


def _kernel(impl: str, interpret: bool):
  module = _MODULES[impl]
  run = functools.partial(
      splash_tpu.splash_attention if impl == "splash" else flash_gpu.flash_attention,
      interpret=interpret)

  def padded(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, seg_BxT):
    T = q_BxTxHqxDh.shape[1]
    pad = module.padded_length(T) - T
    if not pad:
      return run(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, seg_BxT)
    at_end = ((0, 0), (0, pad), (0, 0), (0, 0))
    q, k, v = (jnp.pad(a, at_end) for a in (q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh))
    seg = jnp.pad(seg_BxT, ((0, 0), (0, pad)), constant_values=PAD_SEGMENT)
    return run(q, k, v, seg)[:, :T]

  return padded


def _per_shard(fn, mesh, batch_axes: tuple[str, ...]):
  """`fn` run by each device on its block of rows (batch split over `batch_axes`)."""
  if mesh is None:
    return fn
  axes = tuple(a for a in batch_axes if a in mesh.axis_names and mesh.shape[a] > 1)
  if not axes:
    return fn
  rows = P(axes if len(axes) > 1 else axes[0])
  token = P(*rows, None, None, None)
  # check_vma off: the kernels' outputs carry no varying-axis types, and every
  # input and output here varies over the same batch axes.
  return jax.shard_map(fn, mesh=mesh, in_specs=(token, token, token, P(*rows, None)),
                       out_specs=token, check_vma=False)


def causal_attention(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, segment_ids_BxT=None,
                     valid_BxT=None, *, implementation: Implementation | None = None,
                     interpret: bool | None = None, mesh=None,
                     batch_axes: tuple[str, ...] = ("data", "fsdp")):
  """Causal grouped-query attention within segments (`attention_reference`'s contract).

  Args:
    q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh: queries, keys and values (RoPE applied).
    segment_ids_BxT, valid_BxT: packed segments and real tokens (None: one segment,
      all real); the kernels read them as one array (`segments_with_padding`).
    implementation: None (by lowering platform: module docstring), "xla", "splash"
      or "triton".
    interpret: run a Pallas kernel in interpret mode; None = on every platform but
      its own.
    mesh, batch_axes: the training mesh and the axes the batch is split over: each
      device runs the kernel on its rows.
  Returns:
    o_BxTxHqxDh in q's dtype.
  """
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  if k_BxTxHkvxDh.shape != v_BxTxHkvxDh.shape or k_BxTxHkvxDh.shape[:2] != (B, T) or (
      k_BxTxHkvxDh.shape[3] != Dh or Hq % k_BxTxHkvxDh.shape[2]):
    raise ValueError(f"causal_attention: q {q_BxTxHqxDh.shape}, k {k_BxTxHkvxDh.shape} and "
                     f"v {v_BxTxHkvxDh.shape} must be [B, T, Hq, Dh] and [B, T, Hkv, Dh] "
                     "with Hkv dividing Hq.")
  for name, a in (("segment_ids", segment_ids_BxT), ("valid", valid_BxT)):
    if a is not None and tuple(a.shape) != (B, T):
      raise ValueError(f"causal_attention: {name} {tuple(a.shape)} must be [B, T] = {(B, T)}.")
  if implementation is not None and implementation not in IMPLEMENTATIONS:
    raise ValueError(f"causal_attention: implementation={implementation!r} is not one of "
                     f"{IMPLEMENTATIONS}.")
  reference = functools.partial(attention_reference, segment_ids_BxT=segment_ids_BxT,
                                valid_BxT=valid_BxT)
  qkv = (q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh)
  if implementation == "xla":
    return reference(*qkv)
  if mesh is not None and "seq" in mesh.axis_names and mesh.shape["seq"] > 1:
    return reference(*qkv)   # time split over devices: XLA partitions it
  if implementation is not None and not _fits(implementation, T, Dh):
    raise ValueError(f"causal_attention: implementation={implementation!r} does not take "
                     f"T={T}, Dh={Dh}.")
  float64 = q_BxTxHqxDh.dtype == jnp.float64
  seg_BxT = segments_with_padding((B, T), segment_ids_BxT, valid_BxT)

  def branch(impl: str, native: bool):
    if float64 or not _fits(impl, T, Dh):
      return reference
    run_interpreted = (not native) if interpret is None else bool(interpret)
    kernel = _per_shard(_kernel(impl, run_interpreted), mesh, batch_axes)
    return lambda q, k, v: kernel(q, k, v, seg_BxT)

  if implementation is None:
    gpu = branch("triton", True)
    return jax.lax.platform_dependent(*qkv, tpu=branch("splash", True), cuda=gpu, rocm=gpu,
                                      default=reference)
  native = branch(implementation, True)
  per_platform = {p: native for p in NATIVE_PLATFORMS[implementation]}
  return jax.lax.platform_dependent(*qkv, **per_platform,
                                    default=branch(implementation, False))

