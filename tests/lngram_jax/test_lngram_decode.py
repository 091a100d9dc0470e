"""Lngram v2 decode state: token-by-token decoding equals the parallel forward."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tree_checks import relative_to_reference

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
  chex.assert_trees_all_close(gh_dec, gh_par, rtol=1e-5, atol=1e-6)
  g_par, g_dec = nnx.to_pure_dict(g_par), nnx.to_pure_dict(g_dec)
  for path, g_ref in jax.tree_util.tree_leaves_with_path(g_par):
    if "router_w" not in jax.tree_util.keystr(path):  # no surrogate: the router gets none
      assert float(jnp.max(jnp.abs(g_ref))) > 0, path
  # Each tensor against its own scale; the router's zeros must be matched exactly.
  chex.assert_trees_all_close(*relative_to_reference(g_dec, g_par), rtol=1e-5, atol=1e-5)


# --- inputs are checked as the layer checks them --------------------------------------


@pytest.mark.parametrize("lengths, error, match", [
    ([20, 20], ValueError, r"lengths=\[20, 20\] must be in \[0, T=6\]"),
    ([3, -1], ValueError, r"lengths=\[3, -1\] must be in \[0, T=6\]"),
    ([2.5, 3.0], TypeError, r"lengths=\[2.5, 3.0\] must be integers"),
    ([True, False], TypeError, "lengths.*must be integers"),
    ([3, 3, 3], ValueError, r"lengths must have shape \(2,\)"),
])
def test_prefill_refuses_impossible_lengths(lengths, error, match):
  """A length past the prompt took its history from clipped positions: the
  continuation was silently wrong (up to 1.68 off the parallel forward)."""
  layer = _layer(CONFIGS["default"])
  with pytest.raises(error, match=match):
    prefill_decode_state(layer, _inputs(2, 6), lengths=lengths)


def test_prefill_of_zero_lengths_is_the_empty_state():
  config = CONFIGS["default"]
  layer = _layer(config)
  _, state = prefill_decode_state(layer, _inputs(2, 6), lengths=jnp.zeros((2,), jnp.int32))
  empty = init_decode_state(config, 2)
  np.testing.assert_array_equal(state.codes_ok_BxH, empty.codes_ok_BxH)
  np.testing.assert_array_equal(state.conv_BxSxD, empty.conv_BxSxD)


@pytest.mark.parametrize("call", ["layer", "prefill", "step"])
def test_int_and_list_hidden_states_are_refused_everywhere(call):
  config = CONFIGS["default"]
  layer = _layer(config)
  T = 1 if call == "step" else 4
  run = {"layer": lambda h: layer(h),
         "prefill": lambda h: prefill_decode_state(layer, h),
         "step": lambda h: lngram_decode_step(layer, h, init_decode_state(config, 2))}[call]
  with pytest.raises(TypeError, match="h must be a floating array; got dtype int32"):
    run(jnp.ones((2, T, D), jnp.int32))
  with pytest.raises(TypeError, match="h must be an array .*got list"):
    run(np.zeros((2, T, D), np.float32).tolist())


@pytest.mark.parametrize("call", ["layer", "prefill", "step"])
@pytest.mark.parametrize("shape, field", [((0, 1, D), "B=0"), ((2, 0, D), "T=0")])
def test_empty_batch_or_sequence_names_the_field(call, shape, field):
  """T = 0 or B = 0 ended in ZeroDivisionError deep inside the readout."""
  config = CONFIGS["default"]
  layer = _layer(config)
  h = jnp.zeros(shape)
  run = {"layer": lambda: layer(h), "prefill": lambda: prefill_decode_state(layer, h),
         "step": lambda: lngram_decode_step(layer, h, init_decode_state(config, shape[0]))}
  with pytest.raises(ValueError, match=f"h has shape .*{field} must be >= 1"):
    run[call]()


def test_decode_step_refuses_a_state_of_another_batch_or_config():
  config = CONFIGS["default"]
  layer = _layer(config)
  with pytest.raises(ValueError, match="state has batch 3 but the input has B=2"):
    lngram_decode_step(layer, _inputs(2, 1), init_decode_state(config, 3))
  other = init_decode_state(CONFIGS["literal_exact_1_2_4_dil2"], 2)
  with pytest.raises(ValueError, match=r"state\.codes_BxHxR has shape \[B, 3, 2\].*\[B, 2, 3\]"):
    lngram_decode_step(layer, _inputs(2, 1), other)
  with pytest.raises(TypeError, match="state must be an LngramDecodeState"):
    lngram_decode_step(layer, _inputs(2, 1), {"codes": 0})


def test_prefill_refuses_a_valid_mask_of_twos():
  layer = _layer(CONFIGS["default"])
  with pytest.raises(ValueError, match=r"valid must be bool or hold only 0 and 1; .*\[2\]"):
    prefill_decode_state(layer, _inputs(2, 6), valid=jnp.full((2, 6), 2, jnp.int32))


def test_nan_at_padding_changes_neither_prefill_nor_the_continuation():
  """Padding positions of a right-padded prompt hold NaN: the prefill output at
  real tokens, the state and every decoded step are those of a zero padding."""
  config = CONFIGS["default"]
  layer = _layer(config, seed=8)
  lengths = jnp.array([3, 7])
  h = _inputs(2, 7, seed=9)
  pad_BxT = jnp.arange(7)[None] >= lengths[:, None]
  h_nan = jnp.where(pad_BxT[:, :, None], jnp.nan, h)
  h_zero = jnp.where(pad_BxT[:, :, None], 0.0, h)
  y_nan, state_nan = prefill_decode_state(layer, h_nan, lengths=lengths)
  y_zero, state_zero = prefill_decode_state(layer, h_zero, lengths=lengths)
  assert not bool(jnp.isnan(y_nan).any())
  np.testing.assert_array_equal(y_nan, y_zero)
  for a, b in zip(jax.tree_util.tree_leaves(state_nan), jax.tree_util.tree_leaves(state_zero),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  new = _inputs(2, 3, seed=10)
  np.testing.assert_array_equal(_step_all(layer, new, state_nan)[0],
                                _step_all(layer, new, state_zero)[0])
