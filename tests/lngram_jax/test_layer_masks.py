"""Masks select, never multiply: the Lngram v2 layer and its sharded form.

A padding position may hold anything (NaN, inf): the outputs of valid tokens,
and every gradient, are those of a zero there. A `valid` mask is bool, or
numbers that are all 0 or 1; a mask of 2s used to scale Y by 2.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lngram_jax import LngramConfig, LngramV2
from lngram_jax.sharding import ShardingConfig, sharded_layer_apply

CFG = LngramConfig(d_model=16, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=4,
                   kv_heads=2, head_dim=4)
B, T = 2, 10


def _live(cfg=CFG, seed=0):
  model = LngramV2(cfg, rngs=nnx.Rngs(seed))
  ko, kc = jax.random.split(jax.random.key(seed + 100))
  model.w_o[...] = 0.3 * jax.random.normal(ko, model.w_o.shape)
  model.conv_kernel[...] = 0.5 * jax.random.normal(kc, model.conv_kernel.shape)
  return model


def _masked_inputs(fill, length=T):
  """h with `fill` at the padding of rows of 6 and `length` real tokens, and the mask."""
  h = jax.random.normal(jax.random.key(1), (B, length, CFG.d_model))
  valid = jnp.arange(length)[None] < jnp.array([6, length])[:, None]
  return jnp.where(valid[:, :, None], h, fill), valid


@pytest.mark.parametrize("readout", ["literal", "streaming", "absorbed"])
@pytest.mark.parametrize("fill", [np.nan, np.inf], ids=["nan", "inf"])
def test_nan_at_padding_changes_no_valid_output_and_no_gradient(readout, fill):
  model = _live(CFG.replace(readout=readout))
  h_bad, valid = _masked_inputs(fill)
  h_zero, _ = _masked_inputs(0.0)
  w = jax.random.normal(jax.random.key(2), h_bad.shape)

  def loss_and_grads(h):
    def loss(model, h):
      return jnp.sum(model(h, valid=valid) * w)
    return nnx.value_and_grad(loss, argnums=(0, 1))(model, h)

  y_bad, y_zero = model(h_bad, valid=valid), model(h_zero, valid=valid)
  assert not bool(jnp.isnan(y_bad).any())
  np.testing.assert_array_equal(y_bad, y_zero)
  np.testing.assert_array_equal(y_bad[~valid], 0.0)
  (l_bad, (g_bad, gh_bad)), (l_zero, (g_zero, gh_zero)) = (loss_and_grads(h_bad),
                                                          loss_and_grads(h_zero))
  assert float(l_bad) == float(l_zero)
  chex.assert_tree_all_finite(g_bad)
  chex.assert_trees_all_equal((g_bad, gh_bad), (g_zero, gh_zero))


def test_nan_in_another_segment_does_not_reach_through_the_conv():
  """A valid NaN token of segment 0 must not enter segment 1's conv taps."""
  model = _live()
  h, _ = _masked_inputs(0.0)
  seg = jnp.broadcast_to((jnp.arange(T) >= 4).astype(jnp.int32), (B, T))
  y = model(h.at[:, 2].set(jnp.nan), segment_ids=seg)
  y_ref = model(h, segment_ids=seg)
  np.testing.assert_array_equal(y[:, 4:], y_ref[:, 4:])


def test_int_valid_of_zeros_and_ones_equals_bool_and_twos_are_refused():
  model = _live()
  h, valid = _masked_inputs(0.0)
  np.testing.assert_array_equal(model(h, valid=valid.astype(jnp.int32)), model(h, valid=valid))
  np.testing.assert_array_equal(model(h, valid=valid.astype(jnp.float32)),
                                model(h, valid=valid))
  with pytest.raises(ValueError, match=r"valid must be bool or hold only 0 and 1; .*\[2\]"):
    model(h, valid=2 * valid.astype(jnp.int32))
  with pytest.raises(ValueError, match=r"valid must be bool or hold only 0 and 1"):
    model(h, valid=jnp.full((B, T), 0.5))


def test_traced_int_valid_selects_and_never_scales():
  """Inside jit the values are unknown: the mask is cast (nonzero = valid), so
  a 2 selects exactly like a 1 instead of doubling Y."""
  model = _live()
  h, valid = _masked_inputs(0.0)
  y2 = nnx.jit(lambda m, h, v: m(h, valid=v))(model, h, 2 * valid.astype(jnp.int32))
  np.testing.assert_allclose(y2, model(h, valid=valid), rtol=1e-6, atol=1e-6)


def test_sharded_layer_ignores_nan_at_padding():
  """Route-parallel and context-parallel (the halo conv reads a neighbour's
  padding): NaN there reaches no valid token."""
  devices = np.array(jax.devices()[:4])
  if devices.size < 4:
    pytest.skip("needs 4 devices (tests/conftest.py exposes 8 host devices)")
  mesh = jax.sharding.Mesh(devices.reshape(2, 2), ("seq", "table"))
  model = _live()
  h_bad, valid = _masked_inputs(np.nan, length=20)   # padding from 6 on: in both seq shards
  h_zero, _ = _masked_inputs(0.0, length=20)
  # Under jit, as in training: an eager shard_map runs (and compiles) op by op.
  apply = jax.jit(lambda h: sharded_layer_apply(model, h, mesh=mesh, sharding=ShardingConfig(),
                                                valid=valid))
  y_bad, y_zero = apply(h_bad), apply(h_zero)
  assert not bool(jnp.isnan(y_bad).any())
  np.testing.assert_allclose(y_bad, y_zero, rtol=0, atol=0)
