"""The memory slot on Qwen3-VL (the Lngram paper's VLM setting): Lngram v2 in a decoder
layer of the tiny random Qwen3-VL builds after the backbone (paired seeds), reads the
image-and-text stream and trains."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.vlm.qwen3vl.model import Qwen3VL
from experiments.vlm.qwen3vl.random_config import RANDOM_VOCAB, random_qwen3vl_config
from lngram_jax.config import LngramConfig

MEMORY = LngramConfig(d_model=64, routes=4, bits=3, orders=(2, 3), mem_dim=16, q_heads=2,
                      kv_heads=1, head_dim=16)
GRID = (1, 4, 4)   # 16 patches of 3·2·4·4 values, 4 merged image tokens


def _inputs():
  config = random_qwen3vl_config()
  rng = np.random.default_rng(0)
  ids = ([3, 4, config.vision_start_token_id] + [config.image_token_id] * 4
         + [config.vision_end_token_id] + list(rng.integers(0, RANDOM_VOCAB - 8, 6)))
  return dict(input_ids_BxT=np.asarray([ids], np.int64),
              pixel_values=jnp.asarray(rng.normal(size=(16, 96)), jnp.float32),
              image_grid_thw=np.asarray([GRID], np.int64),
              attention_mask_BxT=np.ones((1, len(ids)), np.int64))


def test_lngram_in_qwen3vl_pairs_with_the_base_and_trains():
  base = Qwen3VL(random_qwen3vl_config(), rngs=nnx.Rngs(0))
  model = Qwen3VL(random_qwen3vl_config(text=dict(memory_layers=(1,), memory=MEMORY)), rngs=nnx.Rngs(0))
  base_params = dict(nnx.to_flat_state(nnx.state(base, nnx.Param)))
  ours = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  memory = {k for k in ours if "memory" in map(str, k)}
  assert memory and set(ours) - memory == set(base_params)
  for key, value in base_params.items():   # the same backbone draw for the same seed
    np.testing.assert_array_equal(np.asarray(ours[key][...]), np.asarray(value[...]))

  inputs = _inputs()
  logits, aux = model(**inputs)
  assert logits.shape == (1, inputs["input_ids_BxT"].shape[1], RANDOM_VOCAB)
  assert bool(jnp.all(jnp.isfinite(logits)))
  assert aux["memory/1/codes"].shape == (1, inputs["input_ids_BxT"].shape[1], MEMORY.routes)
  base_logits, _ = base(**inputs)
  # Lngram's output starts at zero (DESIGN.md §2.8): step 0 is the base model ...
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(base_logits))

  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss(params):
    out, _ = nnx.merge(graphdef, params, rest)(**inputs)
    return jnp.mean(jax.nn.logsumexp(out, -1) - out[..., 0])

  # Jitted (the inputs are closed over, so the positions are still read on the host):
  # an eager backward pass through the VLM dispatches, and compiles, op by op.
  grads = jax.jit(jax.grad(loss))(params)
  flat = dict(nnx.to_flat_state(grads))
  memory_grads = [g for k, g in flat.items() if "memory" in map(str, k)]
  assert any(float(jnp.abs(g[...]).max()) > 0 for g in memory_grads)
  # ... and one gradient step on the memory alone moves the logits.
  is_memory = lambda path, _: "memory" in map(str, path)
  stepped = jax.tree_util.tree_map_with_path(
      lambda path, p, g: p - 0.5 * g if is_memory([getattr(k, "key", k) for k in path], p)
      else p, params, grads)
  moved, _ = jax.jit(lambda p: nnx.merge(graphdef, p, rest)(**inputs))(stepped)
  assert float(jnp.abs(moved - base_logits).max()) > 1e-4
