"""sink=False (the paper's §4.2 ablation) and q_heads·head_dim ≠ d_model.

Without the sink the readout is a plain softmax over the routes. Every readout
form (literal, streaming, absorbed, pallas, pallas_fused; the Pallas kernels in
interpret mode on CPU) must equal a transcription with `jax.nn.softmax` over
explicit K and V (`lngram_jax.reference.softmax_readout`), in values and in the
gradients of every parameter and of h.
The layer under test has Hq·Dh = 24 ≠ d = 16 (W_Q [d, Hq·Dh], W_O [Hq·Dh, d]),
so the same tests cover both variants; decode is checked against the parallel
forward.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx
from tree_checks import relative_to_reference

from lngram_jax import (
  LngramConfig,
  LngramV2,
  absorbed_readout,
  core,
  init_decode_state,
  literal_readout,
  lngram_decode_step,
  prefill_decode_state,
  reference,
  streaming_readout,
)
from lngram_jax.config import READOUTS
from lngram_jax.pallas import pallas_readout

B, T, D = 2, 7, 16
# Hq·Dh = 4·6 = 24 ≠ D; R = 5 with route_chunk 3: a ragged streaming chunk. One
# order keeps the compilations short (the sink does not touch the lookup).
CONFIG = LngramConfig(d_model=D, routes=5, bits=2, orders=(2,), mem_dim=8, q_heads=4,
                      kv_heads=2, head_dim=6, sink=False, route_chunk=3)


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
  """On GPUs XLA may run float32 dots as TF32; the comparisons here want float32."""
  with jax.default_matmul_precision("highest"):
    yield


def softmax_piece(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *,
                  sink_logit=None, return_lse=True):
  """`reference.softmax_readout` (what sink=False means) as the core's readout piece."""
  del sink_logit, return_lse
  return reference.softmax_readout(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh)


def _max_rel_err(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


# --- the readout forms on their own --------------------------------------------

_FORMS = {
    "literal": literal_readout,
    "streaming": functools.partial(streaming_readout, chunk=4),  # R = 6: ragged
    "absorbed": absorbed_readout,
    "pallas": pallas_readout,
}


def _form_value_and_grads(q, mem, w_k, w_v, g_o, g_lse, *, name):
  form = softmax_piece if name == "softmax" else functools.partial(
      _FORMS[name], sink_logit=CONFIG.sink_logit, return_lse=True)
  (o, lse), vjp = jax.vjp(form, q, mem, w_k, w_v)
  return (o, lse) + vjp((g_o, g_lse))


_OUTPUTS = ("o", "lse", "dq", "dmem", "dw_k", "dw_v")


class ReadoutFormsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(*[(name, name) for name in sorted(_FORMS)])
  def test_readout_forms_without_sink_equal_plain_softmax(self, name):
    Hq, Hkv, Dh, R, Dr = 4, 2, 8, 6, 10
    k = jax.random.split(jax.random.key(0), 6)
    args = (2.0 * jax.random.normal(k[0], (B, 3, Hq, Dh)),
            jax.random.normal(k[1], (B, 3, R, Dr)),
            0.5 * jax.random.normal(k[2], (Dr, Hkv, Dh)),
            0.5 * jax.random.normal(k[3], (Dr, Hkv, Dh)),
            jax.random.normal(k[4], (B, 3, Hq, Dh)), jax.random.normal(k[5], (B, 3, Hq)))
    form = self.variant(_form_value_and_grads, static_argnames="name")
    got = dict(zip(_OUTPUTS, form(*args, name=name), strict=True))
    want = dict(zip(_OUTPUTS, jax.jit(_form_value_and_grads, static_argnames="name")(
        *args, name="softmax"), strict=True))
    with_sink = literal_readout(*args[:4], sink_logit=math.log(R))  # guards the comparison
    assert _max_rel_err(with_sink, want["o"]) > 1e-2
    chex.assert_tree_all_finite(got)
    # Each output against its own scale: max|got - want| <= 2e-5·max|want|.
    chex.assert_trees_all_close(*relative_to_reference(got, want, floor=1e-30), rtol=0,
                                atol=2e-5)


# --- the layer: every form, sink off, Hq·Dh ≠ D -----------------------------------


def _layer(config, seed=0):
  """A layer with W_O and the conv drawn nonzero (zero at init would hide the readout)."""
  layer = LngramV2(config, rngs=nnx.Rngs(seed))
  k_o, k_c = jax.random.split(jax.random.key(seed + 100))
  layer.w_o[...] = 0.3 * jax.random.normal(k_o, layer.w_o.shape)
  layer.conv_kernel[...] = 0.3 * jax.random.normal(k_c, layer.conv_kernel.shape)
  return layer


def _layer_inputs():
  kh, ky = jax.random.split(jax.random.key(2))
  segment_ids = jnp.array([[0] * 4 + [1] * 3, [0] * 7], jnp.int32)
  return (jax.random.normal(kh, (B, T, D)), jax.random.normal(ky, (B, T, D)), segment_ids)


@functools.partial(nnx.jit, static_argnames="plain")
def _layer_value_and_grads(layer, h, g_y, segment_ids, *, plain=False):
  """y, route mass and the gradients of every parameter and h of Σ g_y·y."""

  def loss(layer, h):
    if plain:  # the core with the plain-softmax readout swapped in
      y, trace = core.forward(layer.param_arrays(), layer.config, h, segment_ids=segment_ids,
                              readout=softmax_piece)
      aux = core.aux_outputs(layer.config, trace)
    else:
      y, aux = layer(h, segment_ids=segment_ids, return_aux=True)
    return jnp.sum(y * g_y), (y, aux["route_mass"])

  (_, (y, mass)), grads = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(layer, h)
  return y, mass, grads


@pytest.fixture(scope="module")
def plain_softmax():
  """The plain-softmax layer's results, computed once (the form does not enter them)."""
  return _layer_value_and_grads(_layer(CONFIG), *_layer_inputs(), plain=True)


@pytest.mark.parametrize("readout", READOUTS)
def test_layer_without_sink_equals_plain_softmax_in_every_form(readout, plain_softmax):
  layer = _layer(CONFIG.replace(readout=readout))
  assert layer.w_q.shape == (D, 24) and layer.w_o.shape == (24, D)
  y, mass, (g_layer, g_h) = _layer_value_and_grads(layer, *_layer_inputs())
  y_ref, _, (g_layer_ref, g_h_ref) = plain_softmax
  np.testing.assert_array_equal(mass, 1.0)  # no sink: all mass on the routes
  for path, g_ref in nnx.to_flat_state(g_layer_ref):
    assert float(jnp.max(jnp.abs(g_ref[...]))) > 0.0, path
  # y and every gradient against its own scale: max|got - want| <= 2e-5·max|want|.
  chex.assert_trees_all_close(
      *relative_to_reference((y, g_h, g_layer), (y_ref, g_h_ref, g_layer_ref), floor=1e-30),
      rtol=0, atol=2e-5)


# --- decode ---------------------------------------------------------------------------


_jit_step = nnx.jit(lngram_decode_step)


def test_decode_without_sink_equals_parallel_forward(plain_softmax):
  """Prefill 5 packed tokens, decode the last 2: the plain-softmax forward's outputs.

  Row 0's segments are 0,0,0,0,1,1,1: decoding continues segment 1. The first
  position is also decoded from an empty state (the same compiled step).
  """
  layer = _layer(CONFIG)  # the plain-softmax run's parameters
  h, _, segment_ids = _layer_inputs()
  want = plain_softmax[0]
  y_first, _ = _jit_step(layer, h[:, :1], init_decode_state(CONFIG, B))
  np.testing.assert_allclose(y_first, want[:, :1], rtol=1e-5, atol=1e-5)
  y_prompt, state = nnx.jit(prefill_decode_state)(layer, h[:, :5],
                                                  segment_ids=segment_ids[:, :5])
  ys = [y_prompt]
  for t in range(5, T):
    y, state = _jit_step(layer, h[:, t:t + 1], state)
    ys.append(y)
  np.testing.assert_allclose(jnp.concatenate(ys, axis=1), want, rtol=1e-5, atol=1e-5)


# --- config ---------------------------------------------------------------------------


def test_sink_is_on_by_default_and_off_means_minus_infinity():
  on = LngramConfig(d_model=16, q_heads=4, head_dim=4, routes=16, sink_mass=0.5)
  assert on.sink and on.sink_logit == pytest.approx(math.log(16.0))
  off = on.replace(sink=False)
  assert off.sink_logit == -math.inf
  assert LngramConfig.from_dict(off.to_dict()) == off
  old = on.to_dict()
  del old["sink"]  # a checkpoint written before the field existed
  assert LngramConfig.from_dict(old).sink


@pytest.mark.parametrize("bad", [0, 1, "no", None, np.float32(0.0)])
def test_sink_must_be_a_bool(bad):
  with pytest.raises(ValueError, match=r"LngramConfig: sink="):
    LngramConfig(d_model=16, q_heads=4, head_dim=4, sink=bad)


@pytest.mark.parametrize("q_heads,head_dim", [(4, 6), (16, 256), (1, 2)])
def test_heads_times_head_dim_need_not_equal_d_model(q_heads, head_dim):
  config = LngramConfig(d_model=16, routes=2, bits=2, mem_dim=4, q_heads=q_heads,
                        kv_heads=1, head_dim=head_dim)
  layer = nnx.eval_shape(lambda: LngramV2(config, rngs=nnx.Rngs(0)))
  assert layer.w_q.shape == (16, q_heads * head_dim)
  assert layer.w_o.shape == (q_heads * head_dim, 16)
  assert layer.w_kv.shape == (config.route_dim, 2 * head_dim)
