"""Lngram v2 decode state: token-by-token decoding equals the parallel forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lngram_jax.config import LngramConfig
from lngram_jax.decode import (
    LngramDecodeState,
    init_decode_state,
    lngram_decode_step,
    prefill_decode_state,
)
from lngram_jax.layer import LngramV2

D = 16
CONFIGS = {
    "default": LngramConfig(d_model=D, routes=3, bits=2, orders=(2, 3), mem_dim=4,
                            q_heads=4, kv_heads=2, head_dim=4),
    "literal_exact_1_2_4_dil2": LngramConfig(
        d_model=D, routes=2, bits=2, orders=(1, 2, 4), mem_dim=4, q_heads=2, kv_heads=1,
        head_dim=8, readout="literal", surrogate="exact", conv_dilation=2, conv_kernel=3),
}


def _layer(config, seed=0):
  """A layer whose zero-initialised pieces are made nonzero, so decode can fail."""
  layer = LngramV2(config, rngs=nnx.Rngs(seed))
  k1, k2 = jax.random.split(jax.random.key(seed + 100))
  layer.w_o[...] = 0.5 * jax.random.normal(k1, layer.w_o.shape)
  layer.conv_kernel[...] = 0.5 * jax.random.normal(k2, layer.conv_kernel.shape)
  return layer


def _inputs(B, T, seed=1):
  return jax.random.normal(jax.random.key(seed), (B, T, D))


_jit_step = nnx.jit(lngram_decode_step)


@nnx.jit
def _parallel(layer, h_BxTxD, segment_ids=None, valid=None):
  return layer(h_BxTxD, segment_ids=segment_ids, valid=valid)


def _step_all(layer, h_BxTxD, state):
  """Decodes every position of h one at a time (one compiled step)."""
  ys = []
  for t in range(h_BxTxD.shape[1]):
    y_Bx1xD, state = _jit_step(layer, h_BxTxD[:, t:t + 1], state)
    ys.append(y_Bx1xD)
  return jnp.concatenate(ys, axis=1), state


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_from_empty_state_equals_parallel(name):
  config = CONFIGS[name]
  layer = _layer(config)
  h_BxTxD = _inputs(2, 11)
  y_ref = _parallel(layer, h_BxTxD)
  assert float(jnp.abs(y_ref).max()) > 1e-2  # the branch is really on
  y_dec, _ = _step_all(layer, h_BxTxD, init_decode_state(config, 2))
  np.testing.assert_allclose(y_dec, y_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_then_decode_equals_parallel_with_padding_and_segments(name):
  """Right-padded, packed prompts of different lengths, then 5 decoded steps."""
  config = CONFIGS[name]
  layer = _layer(config, seed=3)
  T_prompt, n_new = 9, 5
  # Row 0: one segment of 4 tokens, then padding. Row 1: segments 0,0,1,1,1,1,1,2,2
  # (the last prompt token's segment continues).
  lengths = jnp.array([4, 9])
  segment_ids = jnp.array([[0, 0, 0, 0, 0, 0, 0, 0, 0],
                           [0, 0, 1, 1, 1, 1, 1, 2, 2]])
  h_all = _inputs(2, T_prompt + n_new, seed=4)
  y_pre, state = nnx.jit(prefill_decode_state)(layer, h_all[:, :T_prompt], lengths=lengths,
                                      segment_ids=segment_ids)
  valid = jnp.arange(T_prompt)[None] < lengths[:, None]
  y_par = _parallel(layer, h_all[:, :T_prompt], segment_ids, valid)
  np.testing.assert_allclose(y_pre, y_par, rtol=1e-6, atol=1e-6)
  y_dec, _ = _step_all(layer, h_all[:, T_prompt:], state)

  # Reference: each row's prompt followed directly by its new inputs, in the
  # last prompt token's segment, right-padded to one shape (causal, so the
  # padding does not touch the compared positions).
  S = T_prompt + n_new
  h_ref, seg_ref, valid_ref = np.zeros((2, S, D), np.float32), np.zeros((2, S), int), []
  for b in range(2):
    L = int(lengths[b])
    h_ref[b, :L + n_new] = jnp.concatenate([h_all[b, :L], h_all[b, T_prompt:]])
    seg_ref[b, :L] = segment_ids[b, :L]
    seg_ref[b, L:] = segment_ids[b, L - 1]
    valid_ref.append(np.arange(S) < L + n_new)
  y_ref = _parallel(layer, jnp.asarray(h_ref), jnp.asarray(seg_ref), jnp.asarray(valid_ref))
  for b in range(2):
    L = int(lengths[b])
    np.testing.assert_allclose(y_dec[b], y_ref[b, L:L + n_new], rtol=1e-5, atol=1e-5)


def test_decode_state_tracks_history_and_is_a_pytree():
  config = CONFIGS["default"]
  layer = _layer(config)
  state = init_decode_state(config, 2)
  assert state.codes_BxHxR.shape == (2, config.max_order - 1, config.routes)
  assert state.conv_BxSxD.shape == (2, config.conv_context, D)
  assert not bool(state.codes_ok_BxH.any())
  h_BxTxD = _inputs(2, 3)
  _, state = _step_all(layer, h_BxTxD, state)
  assert bool(state.codes_ok_BxH.all())
  # The newest history slot holds the last token's codes.
  from lngram_jax.addressing import codes_from_logits
  codes_BxTxR = codes_from_logits(layer.router_logits(h_BxTxD))
  np.testing.assert_array_equal(state.codes_BxHxR[:, -1], codes_BxTxR[:, -1])
  leaves = jax.tree_util.tree_leaves(state)
  assert len(leaves) == 3
  assert isinstance(jax.tree_util.tree_map(lambda x: x, state), LngramDecodeState)


def test_decode_step_rejects_a_sequence():
  config = CONFIGS["default"]
  layer = _layer(config)
  h_BxTxD = _inputs(1, 4)
  with pytest.raises(ValueError, match=r"\[B, 1, 16\]"):
    lngram_decode_step(layer, h_BxTxD, init_decode_state(config, 1))


def test_decode_gradients_equal_parallel_gradients():
  """Decode runs the same core forward: also its gradients equal the parallel
  layer's, for every parameter and the inputs. Without a router surrogate:
  the decode state keeps earlier positions' codes, not their logits, so the
  surrogate's contributions to earlier positions cannot flow back in decode."""
  config = CONFIGS["default"].replace(surrogate="none")
  layer = _layer(config, seed=5)
  h_BxTxD = _inputs(2, 6, seed=6)
  w_BxTxD = jax.random.normal(jax.random.key(7), h_BxTxD.shape)

  @functools.partial(nnx.jit, static_argnums=2)
  def grads(layer, h_BxTxD, decode):
    def loss(layer, h_BxTxD):
      if not decode:
        return jnp.sum(layer(h_BxTxD) * w_BxTxD)
      state, ys = init_decode_state(config, 2), []
      for t in range(h_BxTxD.shape[1]):
        y_Bx1xD, state = lngram_decode_step(layer, h_BxTxD[:, t:t + 1], state)
        ys.append(y_Bx1xD)
      return jnp.sum(jnp.concatenate(ys, axis=1) * w_BxTxD)
    return nnx.grad(loss, argnums=(0, 1))(layer, h_BxTxD)

  (g_par, gh_par), (g_dec, gh_dec) = grads(layer, h_BxTxD, False), grads(layer, h_BxTxD, True)
  np.testing.assert_allclose(gh_dec, gh_par, rtol=1e-5, atol=1e-6)
  flat_par, flat_dec = nnx.to_flat_state(g_par), nnx.to_flat_state(g_dec)
  assert [p for p, _ in flat_par] == [p for p, _ in flat_dec]
  for (path, g), (_, g_ref) in zip(flat_dec, flat_par, strict=True):
    if path[0] != "router_w":  # no surrogate: the router gets no gradient at all
      assert float(jnp.max(jnp.abs(g_ref[...]))) > 0, path
    scale = float(jnp.max(jnp.abs(g_ref[...])))
    np.testing.assert_allclose(g[...], g_ref[...], rtol=1e-5, atol=1e-5 * scale,
                               err_msg=str(path))
