"""PVM's masks select, never multiply: the text mask and the visual padding mask.

NaN at image positions of x (text_mask 0) or at padded visual tokens reaches
no text output and no gradient; a text mask of 2s is refused; float64 stays
float64 through the masked paths.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pvm_jax import PVM, PVMConfig

D, NV, B, T = 32, 5, 2, 7
CONFIG = PVMConfig(d_model=D, latent_dim=32, head_dim=8, backbone_gqa_ratio=2, latent_ffn_dim=24)


def _pvm():
  pvm = PVM(CONFIG, rngs=nnx.Rngs(0))
  pvm.gate[...] = jnp.asarray(0.7, pvm.gate[...].dtype)   # on: y != 0 at text tokens
  return pvm


def _inputs():
  kx, kv = jax.random.split(jax.random.key(1))
  x = jax.random.normal(kx, (B, T, D))
  visual = jax.random.normal(kv, (B, NV, D))
  text = jnp.arange(T)[None] >= jnp.array([NV, 2])[:, None]   # image first, then text
  return x, visual, text


def _loss_and_grads(pvm, x, visual, visual_valid, text):
  w = jax.random.normal(jax.random.key(2), x.shape)

  def loss(pvm, x):
    y = pvm(x, visual=visual, visual_valid=visual_valid, text_mask=text)
    return jnp.sum(y * w), y

  return nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(pvm, x)


def _assert_same(a, b):
  (l_a, y_a), (g_a, gx_a) = a
  (l_b, y_b), (g_b, gx_b) = b
  assert bool(jnp.isfinite(y_a).all())
  np.testing.assert_array_equal(y_a, y_b)
  assert float(l_a) == float(l_b)
  np.testing.assert_array_equal(gx_a, gx_b)
  for (path, p), (_, q) in zip(nnx.to_flat_state(g_a), nnx.to_flat_state(g_b), strict=True):
    np.testing.assert_array_equal(p[...], q[...], err_msg=str(path))


def test_nan_at_image_positions_reaches_no_text_output_or_gradient():
  pvm = _pvm()
  x, visual, text = _inputs()
  x_nan = jnp.where(text[..., None], x, jnp.nan)
  x_zero = jnp.where(text[..., None], x, 0.0)
  out = _loss_and_grads(pvm, x_nan, visual, None, text)
  _assert_same(out, _loss_and_grads(pvm, x_zero, visual, None, text))
  np.testing.assert_array_equal(out[0][1][~text], 0.0)


def test_nan_at_padded_visual_tokens_reaches_nothing():
  pvm = _pvm()
  x, visual, text = _inputs()
  visual_valid = jnp.arange(NV)[None] < jnp.array([3, NV])[:, None]
  v_nan = jnp.where(visual_valid[..., None], visual, jnp.nan)
  v_zero = jnp.where(visual_valid[..., None], visual, 0.0)
  _assert_same(_loss_and_grads(pvm, x, v_nan, visual_valid, text),
               _loss_and_grads(pvm, x, v_zero, visual_valid, text))


def test_text_mask_of_zeros_and_ones_equals_bool_and_twos_are_refused():
  pvm = _pvm()
  x, visual, text = _inputs()
  y = pvm(x, visual=visual, text_mask=text)
  np.testing.assert_array_equal(pvm(x, visual=visual, text_mask=text.astype(jnp.int32)), y)
  with pytest.raises(ValueError, match=r"text_mask must be bool or hold only 0 and 1; .*\[2\]"):
    pvm(x, visual=visual, text_mask=2 * text.astype(jnp.int32))


def test_masked_float64_stays_float64():
  with jax.enable_x64(True):
    config = CONFIG.replace(dtype=jnp.float64, param_dtype=jnp.float64)
    pvm = PVM(config, rngs=nnx.Rngs(0))
    x, visual, text = (a.astype(jnp.float64) if a.dtype != bool else a for a in _inputs())
    assert pvm(x, visual=visual, text_mask=text).dtype == jnp.float64
