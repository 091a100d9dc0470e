"""The VLM = encoder + projector + the one DecoderLM: zero gate = base model, cached decode, generate."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.models import PVMBranch, generate, liven_lngram
from experiments.models.branches import ParallelMLP
from experiments.models.config import LMConfig
from experiments.vlm.tiny.config import VLMConfig
from experiments.vlm.tiny.model import VLM
from lngram_jax.config import LngramConfig
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


def flat_params(model) -> dict:
  return {"/".join(map(str, p)): v.get_value()
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def with_base_params(model, base):
  """model's parameters copied from `base` where the paths match (all but the branch)."""
  src = flat_params(base)
  for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    key = "/".join(map(str, path))
    if key in src:
      v[...] = src[key]
  return model


@nnx.jit
def forward(model, images, tokens):
  return model(images, tokens)


@nnx.jit
def prefill(model, images, tokens, lengths):
  return model.prefill(images, tokens, lengths=lengths, cache_len=24)


@nnx.jit
def decode_step(model, feed, cache):
  return model.decode_step(feed, cache)


def set_gate(model, layer, value):
  model.branch(layer).gate[...] = jnp.asarray(value, jnp.float32)


def test_config_round_trip_paths_and_iso_mlp_size():
  for c in (vlm_config(), vlm_config("pvm", "hidden"), vlm_config("mlp"), vlm_config("none")):
    assert VLMConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
  c = vlm_config("mlp")
  m = nnx.eval_shape(lambda: VLM(c, rngs=nnx.Rngs(0)))   # shapes only, no init work
  params = flat_params(m)
  assert isinstance(m.branch(1), ParallelMLP) and m.branch(0) is None
  mlp_params = sum(v.size for k, v in params.items() if k.startswith("lm/blocks/1/ffn_branch/"))
  pvm_params = param_count(PVM_CFG)["total"]
  assert abs(mlp_params - pvm_params) <= 3 * LM.d_model, (mlp_params, pvm_params)
  assert {k.split("/")[0] for k in params} == {"encoder", "projector", "lm"}
  assert not any("ffn_branch" in k for k in params if not k.startswith("lm/blocks/1/"))
  pvm = nnx.eval_shape(lambda: VLM(vlm_config("pvm", "hidden"), rngs=nnx.Rngs(0)))
  assert isinstance(pvm.branch(1), PVMBranch) and pvm.branch(1).source == "hidden"
  assert "lm/blocks/1/ffn_branch/w_up" in flat_params(pvm)
  with pytest.raises(ValueError, match="branch_layers"):
    VLMConfig(lm=LM, branch="pvm", pvm=PVM_CFG)
  with pytest.raises(ValueError, match="pvm_source='latent'"):
    vlm_config(source="latent")
  with pytest.raises(ValueError, match="lm.ffn_branch"):
    VLMConfig(lm=vlm_config().decoder, branch="none")


def test_no_branch_equals_decoder_lm_on_the_same_embeddings():
  base = VLM(vlm_config("none"), rngs=nnx.Rngs(0))
  images, tokens = inputs()
  v = base.visual(images)
  x = jnp.concatenate([v, base.lm.embed(tokens)], axis=1)
  want = nnx.jit(lambda m, x: m.lm.forward_embedded(x))(base, x)
  # Two compiled programs (XLA fuses them differently): equal up to rounding.
  np.testing.assert_allclose(forward(base, images, tokens), want, atol=1e-6)


def test_a_branch_model_starts_from_the_base_model_of_the_same_seed():
  """Branches are drawn after the backbone: same seed, same encoder/projector/LM numbers."""
  base = flat_params(VLM(vlm_config("none"), rngs=nnx.Rngs(3)))
  pvm = flat_params(VLM(vlm_config("pvm", layers=(0, 1)), rngs=nnx.Rngs(3)))
  assert set(base) < set(pvm)
  chex.assert_trees_all_equal({key: pvm[key] for key in base}, base)


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
  _, ctx = model._inputs(model.visual(images), tokens)
  y, _ = model.branch(1).forward(x, ctx)
  assert np.all(np.asarray(y[:, :Nv]) == 0) and float(jnp.abs(y[:, Nv:]).mean()) > 0


def test_gate_gradient_nonzero_and_w_up_gradient_zero_at_init():
  model = VLM(vlm_config(), rngs=nnx.Rngs(0))
  images, tokens = inputs()
  Nv = model.config.n_visual
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss(p):
    logits = nnx.merge(graphdef, p, rest)(images, tokens)[:, Nv - 1:-1]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

  grads = jax.jit(jax.grad(loss))(params)
  chex.assert_trees_all_equal_shapes_and_dtypes(grads, params)
  chex.assert_tree_all_finite(grads)
  g = {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(grads)}
  assert float(jnp.abs(g["lm/blocks/1/ffn_branch/gate"])) > 0
  # W_up sits behind λ = 0: its gradient is exactly zero at step 0 (pvm_jax/module.py).
  w_up = g["lm/blocks/1/ffn_branch/w_up"]
  chex.assert_trees_all_equal(w_up, jnp.zeros_like(w_up))
  assert float(jnp.abs(g["lm/blocks/1/mlp/w_up"]).max()) > 0.0


@pytest.mark.parametrize("branch,source,visual_pos,memory",
                         [("pvm", "raw", True, False), ("pvm", "hidden", False, False),
                          ("mlp", "raw", False, False),
                          pytest.param("pvm", "hidden", False, True, marks=pytest.mark.slow)])
def test_cached_decode_matches_parallel_forward(branch, source, visual_pos, memory):
  """memory: the backbone also has a live Lngram branch in layer 1's memory slot,
  so both slots of one block are exercised in the three modes."""
  config = vlm_config(branch, source, layers=(0, 1), visual_pos=visual_pos)
  if memory:
    lngram = LngramConfig(d_model=32, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=2,
                          kv_heads=1, head_dim=16, surrogate="exact")
    config = config.replace(lm=LM.replace(memory_layers=(1,), memory=lngram))
  model = VLM(config, rngs=nnx.Rngs(0))
  liven_lngram(model.lm, key=5, w_o_std=0.3, conv_std=0.3)
  set_gate(model, 0, 0.5)
  set_gate(model, 1, -0.8)
  images, tokens = inputs(B=2, T=12)
  Nv = model.config.n_visual
  full = forward(model, images, tokens)
  lengths = jnp.array([5, 3])
  logits, cache = prefill(model, images, tokens[:, :5], lengths)
  if branch == "pvm":   # the visual caches are the PVM branches' decode states
    assert cache.layers[1].ffn_branch_state.k.shape == (2, Nv, PVM_CFG.kv_heads, 16)
  np.testing.assert_allclose(logits[0, :Nv + 5], full[0, :Nv + 5], atol=2e-5)
  np.testing.assert_allclose(logits[1, :Nv + 3], full[1, :Nv + 3], atol=2e-5)
  for step in range(4):
    feed = jnp.stack([tokens[0, 5 + step], tokens[1, 3 + step]])[:, None]
    out, cache = decode_step(model, feed, cache)
    np.testing.assert_allclose(out[0], full[0, Nv + 5 + step], atol=2e-5)
    np.testing.assert_allclose(out[1], full[1, Nv + 3 + step], atol=2e-5)


@pytest.mark.parametrize("branch,source", [
    ("pvm", "raw"),
    pytest.param("pvm", "hidden", marks=pytest.mark.slow),
    pytest.param("mlp", "raw", marks=pytest.mark.slow)])
def test_generate_cached_equals_uncached_and_logp(branch, source):
  """One `generate` for the VLM: the cached path (prefill builds the visual caches)
  draws the same tokens with the same log-probs as full forwards (~20 s each)."""
  model = VLM(vlm_config(branch, source, layers=(0, 1)), rngs=nnx.Rngs(2))
  set_gate(model, 0, 0.9)
  set_gate(model, 1, -0.9)
  images, tokens = inputs(B=2, T=6)
  kwargs = dict(prompt_lengths=jnp.array([6, 2]), images=images, max_new_tokens=5,
                rng=jax.random.key(0), return_logp=True)
  for sampler in (dict(greedy=True), dict(temperature=3.0)):
    got, logp = generate(model, tokens, use_cache=True, **kwargs, **sampler)
    ref, ref_logp = generate(model, tokens, use_cache=False, **kwargs, **sampler)
    assert got.shape == (2, 5) and got.dtype == jnp.int32 and logp.dtype == jnp.float32
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(logp, ref_logp, atol=2e-5)
  # The last greedy token's logp, against a parallel forward over [image | prompt | answer].
  seq = jnp.concatenate([tokens[:1], got[:1, :4]], axis=1)
  logits = forward(model, images[:1], seq)
  want = jax.nn.log_softmax(logits[0, -1])[got[0, 4]]
  np.testing.assert_allclose(logp[0, 4], want, atol=2e-5)
  with pytest.raises(ValueError, match="images="):
    generate(model, tokens, max_new_tokens=2, rng=jax.random.key(0))
