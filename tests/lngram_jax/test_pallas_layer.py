"""LngramV2 with readout="pallas" or "pallas_fused" equals readout="absorbed".

Values, aux (route mass, through lse) and every parameter gradient, the router
included (surrogate). On CPU the Pallas readouts run the Triton kernels in
interpret mode (chosen automatically), so this is the whole layer through the
kernels' forward and backward; "pallas_fused" also gathers the table rows
inside the kernel. w_o and the conv are zero at init, which would hide the readout from
every gradient; they are set to random values first.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lngram_jax import LngramConfig, LngramV2

B, T = 2, 7
CONFIG = LngramConfig(d_model=16, routes=5, bits=2, orders=(2, 3), mem_dim=8, q_heads=4,
                      kv_heads=2, head_dim=4, readout="absorbed")


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
  """On GPUs XLA may run float32 dots as TF32; the comparisons here want float32."""
  with jax.default_matmul_precision("highest"):
    yield


def _model(config):
  model = LngramV2(config, rngs=nnx.Rngs(0))
  k_o, k_c = jax.random.split(jax.random.key(1))
  model.w_o[...] = 0.3 * jax.random.normal(k_o, model.w_o.shape, model.w_o.dtype)
  model.conv_kernel[...] = 0.3 * jax.random.normal(
      k_c, model.conv_kernel.shape, model.conv_kernel.dtype)
  return model


@nnx.jit
def _loss_and_grads(model, h, g_y, g_mass, segment_ids):
  def loss(model):
    y, aux = model(h, segment_ids=segment_ids, return_aux=True)
    return (jnp.sum(y.astype(jnp.float32) * g_y)
            + jnp.sum(aux["route_mass"] * g_mass)), (y, aux["route_mass"])
  (value, (y, mass)), grads = nnx.value_and_grad(loss, has_aux=True)(model)
  return value, y, mass, grads


def _rel_err(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


@pytest.mark.slow  # the layer's forward and backward through interpret-mode kernels
@pytest.mark.parametrize("readout", ["pallas", "pallas_fused"])
def test_pallas_layer_matches_absorbed(readout):
  dtype, tol = jnp.float32, 2e-5
  kh, ky, km = jax.random.split(jax.random.key(2), 3)
  h = jax.random.normal(kh, (B, T, CONFIG.d_model), jnp.float32)
  g_y = jax.random.normal(ky, (B, T, CONFIG.d_model), jnp.float32)
  g_mass = jax.random.normal(km, (B, T, CONFIG.q_heads), jnp.float32)
  segment_ids = jnp.array([[0] * 4 + [1] * 3, [0] * 7], jnp.int32)

  results = {}
  for form in ("absorbed", readout):
    model = _model(CONFIG.replace(readout=form, dtype=dtype))
    results[form] = _loss_and_grads(model, h, g_y, g_mass, segment_ids)

  (_, y, mass, grads), (_, y_ref, mass_ref, grads_ref) = results[readout], results["absorbed"]
  assert y.dtype == y_ref.dtype == dtype
  assert _rel_err(y, y_ref) < tol
  assert _rel_err(mass, mass_ref) < tol
  flat, flat_ref = nnx.to_flat_state(grads), nnx.to_flat_state(grads_ref)
  assert [path for path, _ in flat] == [path for path, _ in flat_ref]
  for (path, g), (_, g_ref) in zip(flat, flat_ref, strict=True):
    g, g_ref = g[...], g_ref[...]
    if path[0] != "router_w":  # the router only sees the surrogate's gradient
      assert float(jnp.max(jnp.abs(g_ref))) > 0.0, path
    assert _rel_err(g, g_ref) < tol, (path, _rel_err(g, g_ref))

