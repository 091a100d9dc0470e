"""LoRA through qwix on the decoder (experiments/models/lora.py).

Against a plain-JAX reference (W + (α/r)·A·B folded into the weights of the model
without LoRA): the forward and the factors' gradients; step 0 equals the base model
bit for bit (B = 0, with a memory arm too); the scanned model equals the unrolled one;
merging equals the unmerged forward; float64 stays float64; bad targets are one line;
on an fsdp mesh the factors are split like their weights and the gradients are the
single-device ones.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.models.config import LMConfig
from experiments.models.lm import DecoderLM
from experiments.models.lora import ALL_LINEAR, LoRAConfig, is_factor, lora_config, merged_params

CONFIG = LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=24,
                  max_len=16, vocab_size=32)
LORA = LoRAConfig(rank=2, alpha=6.0, targets=ALL_LINEAR)
TOKENS = (jnp.arange(10)[None] * 7 + jnp.arange(2)[:, None]) % 32


def _bs(tree):
  """The B factors of a pure-dict tree."""
  return [x for path, x in jax.tree_util.tree_leaves_with_path(tree)
          if str(path[-1].key).endswith("_lora_b")]


def _live(model, seed=1):
  """Random B factors (they start at 0), so the LoRA path changes the output."""
  state = nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, [
      0.3 * jax.random.normal(k, x.shape, x.dtype) if str(path[-1].key).endswith("_lora_b")
      else x for k, (path, x) in zip(keys, leaves, strict=True)]))
  return model


def _pure(model):
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _reference_weights(params, scale):
  """W + scale·A·B written out per weight with the einsum of each layout (the reference)."""
  out = {}
  for name, value in params.items():
    if isinstance(value, dict):
      out[name] = _reference_weights(value, scale)
      continue
    if is_factor(name):
      continue
    a, b = params.get(name + "_lora_a"), params.get(name + "_lora_b")
    if a is None:
      out[name] = value
    elif name == "w_o":     # [Hq, Dh, D]: A [Hq, Dh, r], B [r, D]
      out[name] = value + scale * jnp.einsum("her,rd->hed", a, b)
    elif name == "w_q":     # [D, Hq, Dh]: A [D, r], B [r, Hq, Dh]
      out[name] = value + scale * jnp.einsum("dr,rhe->dhe", a, b)
    elif name == "w_kv":    # [D, 2, Hkv, Dh]: A [D, r], B [r, 2, Hkv, Dh]
      out[name] = value + scale * jnp.einsum("dr,rckh->dckh", a, b)
    else:                   # [in, out]
      out[name] = value + scale * a @ b
  return out


def _loss(model, tokens=TOKENS):
  return jnp.mean(jax.nn.log_softmax(model(tokens))[..., 3])


@pytest.fixture(scope="module")
def models():
  """(base, LoRA at step 0, the same LoRA model with random B factors), built once."""
  base = DecoderLM(CONFIG, rngs=nnx.Rngs(0))
  lora = DecoderLM(CONFIG.replace(lora=LORA), rngs=nnx.Rngs(0))
  live = _live(DecoderLM(CONFIG.replace(lora=LORA), rngs=nnx.Rngs(0)))
  return base, lora, live


def test_factors_sit_beside_their_weights_in_qwix_layout(models):
  _, lora, _ = models
  attn = _pure(lora)["blocks"][0]["attn"]
  assert attn["w_q_lora_a"].shape == (16, 2) and attn["w_q_lora_b"].shape == (2, 2, 8)
  assert attn["w_kv_lora_b"].shape == (2, 2, 1, 8) and attn["w_o_lora_a"].shape == (2, 8, 2)
  mlp = _pure(lora)["blocks"][0]["mlp"]
  assert mlp["w_down_lora_a"].shape == (24, 2) and mlp["w_down_lora_b"].shape == (2, 16)
  assert len(_bs(_pure(lora))) == 6 and not any(np.any(b) for b in _bs(_pure(lora)))
  assert isinstance(lora.blocks[0].attn.w_q_lora_a, nnx.LoRAParam)


def test_step_zero_is_the_model_without_lora_bit_for_bit(models):
  base, lora, _ = models
  chex.assert_trees_all_equal(lora(TOKENS), base(TOKENS))
  # Every base weight is the same draw: LoRA's own key leaves the others' alone.
  chex.assert_trees_all_equal(merged_params(_pure(lora), LORA.scale), _pure(base))


def test_step_zero_with_a_memory_arm():
  from experiments.configs import load_config
  from experiments.models import lm_config
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  config.model.lora.rank = 4
  mc = lm_config(config)
  assert mc.lora == LoRAConfig(rank=4)
  tokens = TOKENS % 256
  forward = jax.jit(lambda model: model(tokens))
  chex.assert_trees_all_equal(forward(DecoderLM(mc, rngs=nnx.Rngs(0))),
                              forward(DecoderLM(mc.replace(lora=None), rngs=nnx.Rngs(0))))


def test_forward_and_gradients_equal_the_plain_jax_reference(models):
  base, _, lora = models
  graphdef, params, rest = nnx.split(lora, nnx.Param, ...)
  base_graphdef, _, base_rest = nnx.split(base, nnx.Param, ...)
  pure = nnx.to_pure_dict(params)

  def ours(p):
    return _loss(nnx.merge(graphdef, p, rest))

  def reference(p):
    return _loss(nnx.merge(base_graphdef, _reference_weights(p, LORA.scale), base_rest))

  # Jitted (eager gradients compile every op: the scanned test below takes them, against
  # the traced scan); the eager forward is checked here and by the merged-weights test.
  want, want_grads = jax.jit(jax.value_and_grad(reference))(pure)
  assert abs(float(want - _loss(base))) > 1e-3   # the LoRA path acts
  np.testing.assert_allclose(ours(pure), want, rtol=1e-5)
  value, grads = jax.jit(jax.value_and_grad(ours))(pure)
  np.testing.assert_allclose(value, want, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, rtol=1e-4, atol=1e-5)
  factor_grads = [g for path, g in jax.tree_util.tree_leaves_with_path(grads)
                  if is_factor(str(path[-1].key))]
  assert len(factor_grads) == 6 * 2 and all(np.any(g) for g in factor_grads)


def test_merged_weights_give_the_unmerged_forward(models):
  _, _, lora = models
  base = DecoderLM(CONFIG, rngs=nnx.Rngs(0))
  nnx.update(base, merged_params(_pure(lora), LORA.scale))
  np.testing.assert_allclose(base(TOKENS), lora(TOKENS), rtol=1e-5, atol=1e-5)


def test_the_scanned_model_equals_the_unrolled_one():
  config = CONFIG.replace(lora=LORA, n_layers=2)
  unrolled = _live(DecoderLM(config, rngs=nnx.Rngs(0)))
  scanned = DecoderLM(config, rngs=nnx.Rngs(0), scan=True)
  assert scanned.layer_spans == ((0, 2),)
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(_pure(b) for b in unrolled.blocks))
  nnx.update(scanned, {"blocks": {0: stacked}})
  assert scanned.blocks[0].attn.w_q_lora_b.shape == (2, 2, 2, 8)
  np.testing.assert_allclose(scanned(TOKENS), unrolled(TOKENS), rtol=1e-5, atol=1e-5)
  # Jitted: eager gradients compile every op one by one (seconds for nothing checked).
  grad = nnx.jit(nnx.grad(_loss, argnums=nnx.DiffState(0, nnx.LoRAParam)))
  grads_scanned, grads_unrolled = nnx.state(grad(scanned)), grad(unrolled)
  want = jax.tree.map(lambda *xs: jnp.stack(xs),
                      *(nnx.to_pure_dict(grads_unrolled)["blocks"][i] for i in range(2)))
  chex.assert_trees_all_close(nnx.to_pure_dict(grads_scanned)["blocks"][0], want,
                              rtol=1e-4, atol=1e-6)


def test_float64_factors_stay_float64():
  with jax.enable_x64(True):
    config = CONFIG.replace(lora=LORA, dtype="float64", param_dtype="float64")
    model = nnx.jit(lambda: DecoderLM(config, rngs=nnx.Rngs(0)))()   # one compile, not one per op
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))} == {
        jnp.dtype("float64")}
    x = jnp.ones((1, 2, 16), jnp.float64)
    block = nnx.jit(lambda m, x: (m.mlp(x), m.attn.qkv(x, jnp.zeros((1, 2), jnp.int32))[0]))
    mlp, q = block(model.blocks[0], x)
    assert mlp.dtype == q.dtype == jnp.float64   # the LoRA path computes in float64


@pytest.mark.parametrize("targets, message", [
    (r"blocks/\d+/attn_norm/scale", "not an attention or dense-MLP projection"),
    (r"layers/\d+/q_proj", "selects no weight"),
])
def test_bad_targets_are_one_line(targets, message):
  with pytest.raises(ValueError, match=message) as info:
    DecoderLM(CONFIG.replace(lora=LoRAConfig(targets=targets)), rngs=nnx.Rngs(0))
  assert "\n" not in str(info.value)


def test_the_config_block():
  assert lora_config({"rank": 0, "alpha": 8.0}) is None
  assert lora_config({"rank": 16, "alpha": 32.0, "dropout": 0.0, "targets": ""}) == LoRAConfig(
      rank=16, alpha=32.0)
  with pytest.raises(ValueError, match="dropout=0.1 is not supported"):
    lora_config({"rank": 4, "dropout": 0.1})
  config = CONFIG.replace(lora=LORA)
  assert LMConfig.from_dict(config.to_dict()) == config
  assert "lora" not in CONFIG.to_dict()   # configs without LoRA write the JSON they wrote


def test_the_tiny_vlm_lora_arm_has_the_pvm_branches_trainable_count():
  """vlm_long_sft.py:lora (LoRA-SFT) against its PVM arm: 147,456 vs 147,842 trained."""
  from experiments.configs import load_config
  from experiments.models.lora import lora_param_count
  from experiments.vlm.tiny.config import vlm_config
  from experiments.vlm.tiny.model import VLM
  from pvm_jax.module import param_count

  def build(arg):
    vc = vlm_config(load_config(f"experiments/configs/vlm_long_sft.py{arg}"))
    return vc, nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: VLM(vc, rngs=nnx.Rngs(0))),
                                          nnx.Param))

  pvm, _ = build("")
  lora, params = build(":lora")
  branch = param_count(pvm.decoder.ffn_branch)["total"] * len(pvm.decoder.ffn_branch_layers)
  assert (branch, lora_param_count(params)) == (147_842, 147_456)
  assert lora.decoder.ffn_branch_layers == ()


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 (host) devices")
def test_on_an_fsdp_mesh_factors_follow_their_weight_and_gradients_match(models):
  """fsdp=4 with the trainer's placement: each factor is split over fsdp on its weight's
  split dimension (A on a contracted one, B on an output one); the jitted loss and
  gradients on the mesh equal the single-device ones."""
  from experiments.models import layout
  from experiments.trainer import placement
  _, _, lora = models
  mesh = placement.make_train_mesh(dict(fsdp=4))
  graphdef, params, rest = nnx.split(lora, nnx.Param, ...)
  pure = nnx.to_pure_dict(params)
  specs = placement.param_specs(pure, mesh, rules=layout.placement_rules(lora))
  placed = jax.device_put(pure, placement.shardings(specs, mesh))
  checked = 0
  for module in (placed["blocks"][0]["attn"], placed["blocks"][0]["mlp"]):
    for name in [n for n in module if not is_factor(n)]:
      spec = tuple(module[name].sharding.spec) + (None,) * module[name].ndim
      dim = spec.index("fsdp")   # every weight of CONFIG has a dimension fsdp divides
      a, b = module[name + "_lora_a"], module[name + "_lora_b"]
      contracted = a.ndim - 1
      factor, at = (a, dim) if dim < contracted else (b, dim - contracted + 1)
      assert tuple(factor.sharding.spec)[at] == "fsdp", (name, factor.sharding.spec)
      assert factor.sharding.shard_shape(factor.shape)[at] * 4 == factor.shape[at]
      checked += 1
  assert checked == 6

  loss = jax.jit(jax.value_and_grad(lambda p: _loss(nnx.merge(graphdef, p, rest))))
  value, grads = loss(placed)
  want, want_grads = loss(pure)
  np.testing.assert_allclose(value, want, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, rtol=1e-4, atol=1e-6)
  assert grads["blocks"][0]["attn"]["w_q_lora_a"].sharding.mesh.shape["fsdp"] == 4
