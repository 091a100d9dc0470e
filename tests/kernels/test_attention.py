"""Causal attention within segments: the flash kernels against the XLA reference.

Every kernel runs in interpret mode on CPU (values and gradients of q, k and v at
real tokens: padding queries are the caller's to ignore, `kernels/attention/
reference.py`), lowers for its real target (a `tpu_custom_call` for splash, a
Triton call for the GPU kernel, forward and backward), and `implementation=None`
picks per lowering platform: the reference on CPU, splash in a TPU program. On a
4-device CPU mesh each device runs the kernel on its rows (shard_map).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lowering import KERNEL_CALL, lower_text

from experiments.models.attention import attend, causal_mask
from kernels.attention import (
  attention_reference,
  causal_attention,
  flash_gpu,
  segments_with_padding,
  splash_tpu,
)

B, T, HQ, HKV, DH = 2, 256, 4, 2, 64


def _inputs(T=T, dh=DH, seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(B, T, HQ, dh)), dtype)
  k = jnp.asarray(rng.normal(size=(B, T, HKV, dh)), dtype)
  v = jnp.asarray(rng.normal(size=(B, T, HKV, dh)), dtype)
  seg = np.zeros((B, T), np.int32)
  seg[0, T // 3:] = 1                      # two packed documents in row 0
  valid = np.ones((B, T), bool)
  valid[1, :T // 8] = False                # left padding in row 1
  valid[0, -5:] = False                    # right padding in row 0
  return q, k, v, jnp.asarray(seg), jnp.asarray(valid)


def _loss(fn, w, valid, q, k, v):
  o = fn(q, k, v)
  return jnp.sum(jnp.where(valid[:, :, None, None], o * w, 0))


def _check(kernel, tol, T=T, dh=DH):
  """`kernel(q, k, v, segments_with_padding(...))` against the reference at real tokens."""
  q, k, v, seg, valid = _inputs(T, dh)
  combined = segments_with_padding((B, T), seg, valid)
  fn = lambda q, k, v: kernel(q, k, v, combined)  # noqa: E731
  ref = lambda q, k, v: attention_reference(q, k, v, seg, valid)  # noqa: E731
  w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  got, want = jax.jit(fn)(q, k, v), ref(q, k, v)
  real = np.asarray(valid)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=tol, atol=tol)
  grads = jax.jit(jax.grad(functools.partial(_loss, fn, w, valid), argnums=(0, 1, 2)))
  ref_grads = jax.grad(functools.partial(_loss, ref, w, valid), argnums=(0, 1, 2))
  chex.assert_trees_all_close(grads(q, k, v), ref_grads(q, k, v), rtol=tol, atol=tol)


def test_reference_is_the_models_masked_attention():
  """The reference is `attend` under the model's mask (causal & same segment & key
  valid) at every position, padding queries included."""
  q, k, v, seg, valid = _inputs(T=64)
  want = attend(q, k, v, causal_mask((B, 64), segment_ids=seg, valid=valid))
  np.testing.assert_allclose(attention_reference(q, k, v, seg, valid), want, rtol=1e-6,
                             atol=1e-6)


@pytest.mark.slow
def test_splash_in_interpret_mode_equals_the_reference():
  _check(functools.partial(splash_tpu.splash_attention, block=128, interpret=True), 2e-5)


@pytest.mark.slow
def test_padded_lengths_equal_the_reference():
  """T = 200 and 100 are padded to the kernels' blocks (256, 128) in a segment of
  their own; the real positions are the reference's."""
  for impl, T, dh in (("splash", 200, DH), ("triton", 100, 32)):
    q, k, v, seg, valid = _inputs(T, dh)
    got = jax.jit(functools.partial(causal_attention, implementation=impl, interpret=True))(
        q, k, v, seg, valid)
    want = attention_reference(q, k, v, seg, valid)
    real = np.asarray(valid)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=2e-5,
                               atol=2e-5)


@pytest.mark.slow
def test_gpu_flash_in_interpret_mode_equals_the_reference():
  _check(functools.partial(flash_gpu.flash_attention, interpret=True), 2e-5, T=64, dh=32)


def test_splash_and_gpu_flash_lower_forward_and_backward():
  q, k, v, seg, valid = _inputs(T=512, dh=128, dtype=jnp.bfloat16)
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k, v, seg, valid)]
  for impl, platform in (("splash", "tpu"), ("triton", "cuda")):
    fn = functools.partial(causal_attention, implementation=impl, interpret=False)

    def loss(q, k, v, seg, valid, fn=fn):
      return jnp.sum(fn(q, k, v, seg, valid).astype(jnp.float32))

    forward = lower_text(loss, avals, platform).count(KERNEL_CALL[platform])
    backward = lower_text(jax.grad(loss, argnums=(0, 1, 2)), avals,
                          platform).count(KERNEL_CALL[platform])
    assert forward >= 1 and backward > forward, (impl, forward, backward)


def test_dispatch_follows_the_lowering_platform():
  q, k, v, seg, valid = _inputs(T=256, dh=128, dtype=jnp.bfloat16)
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k, v, seg, valid)]
  assert KERNEL_CALL["tpu"] in lower_text(causal_attention, avals, "tpu")
  assert KERNEL_CALL["cuda"] in lower_text(causal_attention, avals, "cuda")
  assert "custom_call" not in lower_text(causal_attention, avals, "cpu")
  # A length no block divides is padded for the kernel; a head width splash does not
  # take (32: a quarter of the TPU's lanes) keeps the reference on TPU.
  odd = [jax.ShapeDtypeStruct((B, 100, *a.shape[2:]), a.dtype) for a in avals[:3]]
  odd += [jax.ShapeDtypeStruct((B, 100), jnp.int32), jax.ShapeDtypeStruct((B, 100), bool)]
  assert KERNEL_CALL["tpu"] in lower_text(causal_attention, odd, "tpu")
  narrow = [jax.ShapeDtypeStruct((*a.shape[:3], 32), a.dtype) for a in avals[:3]] + avals[3:]
  assert KERNEL_CALL["tpu"] not in lower_text(causal_attention, narrow, "tpu")
  with pytest.raises(ValueError, match="does not take"):
    causal_attention(*[jnp.zeros(a.shape, a.dtype) for a in narrow], implementation="splash")


@pytest.mark.slow
def test_kernel_per_batch_shard_on_a_mesh():
  """Rows split over a 4-device data axis: each device runs splash on its rows."""
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(4, 1), ("data", "fsdp"))
  q, k, v, seg, valid = _inputs(T=128)
  q, k, v = (jnp.concatenate([a, a[::-1]]) for a in (q, k, v))
  seg = jnp.concatenate([seg, seg[::-1]])
  valid = jnp.concatenate([valid, valid[::-1]])
  fn = jax.jit(functools.partial(causal_attention, implementation="splash", mesh=mesh,
                                 interpret=True))
  got, want = fn(q, k, v, seg, valid), attention_reference(q, k, v, seg, valid)
  np.testing.assert_allclose(np.asarray(got)[np.asarray(valid)],
                             np.asarray(want)[np.asarray(valid)], rtol=2e-5, atol=2e-5)


def test_gpu_flash_lengths_are_padded_to_power_of_2_tiles():
  """Triton takes power-of-2 tiles only: below 128 tokens the padded length is one (an
  82-token prompt went to 96 once, which XLA:GPU refused), above it a multiple of 128;
  each is the least such length."""
  for T in range(1, 600):
    n = flash_gpu.padded_length(T)
    tile = min(flash_gpu.BLOCK, n)
    assert n >= T and flash_gpu.supported(n, 64), T
    assert tile & (tile - 1) == 0, (T, n)
    assert not any(flash_gpu.supported(m, 64) for m in range(max(T, 16), n)), (T, n)
