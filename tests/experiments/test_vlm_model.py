"""The VLM's PVM insertion: zero gate = base model, zero output on image tokens, cached decode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.models.config import LMConfig
from experiments.vlm.config import VLMConfig
from experiments.vlm.model import VLM
from experiments.vlm.train import flat_params, lm_loss
from pvm_jax.config import PVMConfig
from pvm_jax.module import param_count

LM = LMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
              max_len=48)
PVM_CFG = PVMConfig(d_model=32, latent_dim=32, head_dim=16, backbone_gqa_ratio=2,
                    backbone_ffn_dim=64)


def vlm_config(branch="pvm", source="raw", layers=(1,), visual_pos=False):
  return VLMConfig(lm=LM, image_hw=(16, 16), patch_size=8, vit_dim=16, vit_layers=1,
                   vit_heads=2, vit_ffn=32, visual_pos=visual_pos, branch=branch,
                   branch_layers=() if branch == "none" else layers,
                   pvm=None if branch == "none" else PVM_CFG, pvm_source=source)


def inputs(B=2, T=10):
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.integers(0, 256, (B, 16, 16, 3)), jnp.uint8)
  tokens = jnp.asarray(rng.integers(1, 256, (B, T)), jnp.int32)
  return images, tokens


def with_base_params(model, base):
  """model's parameters copied from `base` where the paths match (all but the branch)."""
  src = flat_params(nnx.state(base, nnx.Param))
  params = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  from experiments.vlm.train import path_str
  new = [src.get(path_str(p), v) for p, v in leaves]
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return model


@nnx.jit
def forward(model, images, tokens):
  return model(images, tokens)


@nnx.jit
def prefill(model, images, tokens, lengths):
  return model.prefill(images, tokens, lengths=lengths, cache_len=24)


@nnx.jit
def decode_step(model, feed, cache, vcaches):
  return model.decode_step(feed, cache, vcaches)


def set_gate(model, layer, value):
  model.branches[str(layer)].gate[...] = jnp.asarray(value, jnp.float32)


def test_config_round_trip_and_iso_mlp_size():
  for c in (vlm_config(), vlm_config("mlp"), vlm_config("none")):
    assert VLMConfig.from_dict(c.to_dict()) == c
  c = vlm_config("mlp")
  m = nnx.eval_shape(lambda: VLM(c, rngs=nnx.Rngs(0)))   # shapes only, no init work
  mlp_params = sum(v.size for k, v in flat_params(nnx.state(m, nnx.Param)).items()
                   if k.startswith("branches/1/"))
  pvm_params = param_count(PVM_CFG)["total"]
  assert abs(mlp_params - pvm_params) <= 3 * LM.d_model, (mlp_params, pvm_params)
  with pytest.raises(ValueError, match="branch_layers"):
    VLMConfig(lm=LM, branch="pvm", pvm=PVM_CFG)


def test_no_branch_equals_decoder_lm_on_the_same_embeddings():
  base = VLM(vlm_config("none"), rngs=nnx.Rngs(0))
  images, tokens = inputs()
  v = base.visual(images)
  x = jnp.concatenate([v, base.lm.embed(tokens)], axis=1)
  want = nnx.jit(lambda m, x: m.lm.forward_embedded(x))(base, x)
  # Two compiled programs (XLA fuses them differently): equal up to rounding.
  np.testing.assert_allclose(forward(base, images, tokens), want, atol=1e-6)


@pytest.mark.parametrize("branch,source", [("pvm", "raw"), ("pvm", "hidden"), ("mlp", "raw")])
def test_zero_gate_is_the_base_model_and_image_tokens_get_zero(branch, source):
  base = VLM(vlm_config("none"), rngs=nnx.Rngs(0))
  model = with_base_params(VLM(vlm_config(branch, source), rngs=nnx.Rngs(1)), base)
  images, tokens = inputs()
  want = forward(base, images, tokens)
  np.testing.assert_array_equal(forward(model, images, tokens), want)   # gate = 0: bit-for-bit
  set_gate(model, 1, 0.7)
  got = forward(model, images, tokens)
  Nv = model.config.n_visual
  # Causal LM + zero branch output on image tokens: image positions are untouched.
  np.testing.assert_array_equal(got[:, :Nv], want[:, :Nv])
  assert float(jnp.abs(got[:, Nv:] - want[:, Nv:]).max()) > 1e-4
  # And the branch output itself is exactly 0 there.
  x = jax.random.normal(jax.random.key(0), (2, Nv + 10, LM.d_model))
  text_mask = jnp.broadcast_to(jnp.arange(Nv + 10) >= Nv, (2, Nv + 10))
  vcache = model._visual_cache(1, model.visual(images), x)
  y, _ = model._branch_out(1, x, text_mask, vcache)
  assert np.all(np.asarray(y[:, :Nv]) == 0) and float(jnp.abs(y[:, Nv:]).mean()) > 0


def test_gate_and_w_up_gradients_nonzero_at_init_in_the_vlm():
  model = VLM(vlm_config(), rngs=nnx.Rngs(0))
  images, tokens = inputs()
  batch = {"images": images, "tokens": tokens, "valid": jnp.ones(tokens.shape, bool),
           "loss_mask": jnp.ones(tokens.shape, bool)}
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  grads = jax.jit(jax.grad(lambda p: lm_loss(nnx.merge(graphdef, p, rest), batch)))(params)
  g = flat_params(grads)
  assert float(jnp.abs(g["branches/1/gate"])) > 0
  # W_up sits behind λ = 0: its gradient is exactly zero at step 0 (pvm_jax/module.py).
  assert float(jnp.abs(g["branches/1/w_up"]).max()) == 0.0


@pytest.mark.parametrize("branch,source,visual_pos",
                         [("pvm", "raw", True), ("pvm", "hidden", False)])
def test_cached_decode_matches_parallel_forward(branch, source, visual_pos):
  model = VLM(vlm_config(branch, source, layers=(0, 1), visual_pos=visual_pos),
              rngs=nnx.Rngs(0))
  set_gate(model, 0, 0.5)
  set_gate(model, 1, -0.8)
  images, tokens = inputs(B=2, T=12)
  Nv = model.config.n_visual
  full = forward(model, images, tokens)
  lengths = jnp.array([5, 3])
  logits, cache, vcaches = prefill(model, images, tokens[:, :5], lengths)
  np.testing.assert_allclose(logits[0, :Nv + 5], full[0, :Nv + 5], atol=2e-5)
  np.testing.assert_allclose(logits[1, :Nv + 3], full[1, :Nv + 3], atol=2e-5)
  for step in range(4):
    feed = jnp.stack([tokens[0, 5 + step], tokens[1, 3 + step]])[:, None]
    out, cache = decode_step(model, feed, cache, vcaches)
    np.testing.assert_allclose(out[0], full[0, Nv + 5 + step], atol=2e-5)
    np.testing.assert_allclose(out[1], full[1, Nv + 3 + step], atol=2e-5)
