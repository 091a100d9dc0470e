"""The decoder LM: shapes, causality, packed segments, zero-init branches, config."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.models import DecoderLM, LMConfig, ParallelMLPConfig, PVMBranchConfig, liven_lngram
from lngram_jax.config import LngramConfig

LNGRAM = LngramConfig(d_model=32, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=4,
                      kv_heads=2, head_dim=8)
CONFIG = LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
                  max_len=32, memory_layers=(1,), memory=LNGRAM)
B, T = 2, 12


def _model(config=CONFIG, seed=0, live_lngram=True):
  """A model; `live_lngram` makes the zero-init W_O and conv nonzero."""
  model = DecoderLM(config, rngs=nnx.Rngs(seed))
  if live_lngram:
    liven_lngram(model, key=100, w_o_std=0.3, conv_std=0.3)
  return model


@nnx.jit
def _forward(model, tokens, segment_ids=None, valid=None):
  return model(tokens, segment_ids=segment_ids, valid=valid)


def _tokens(seed=1, shape=(B, T)):
  return jax.random.randint(jax.random.key(seed), shape, 0, 256, dtype=jnp.int32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_shapes_dtypes_and_aux(dtype):
  config = CONFIG.replace(dtype=dtype, memory=LNGRAM.replace(dtype=jnp.dtype(dtype)))
  model = _model(config)
  logits, aux = nnx.jit(lambda m, x: m(x, return_aux=True))(model, _tokens())
  assert logits.shape == (B, T, 256) and logits.dtype == jnp.float32
  assert bool(jnp.isfinite(logits).all())
  assert sorted(aux) == ["memory/1/codes", "memory/1/route_mass"]
  assert aux["memory/1/codes"].shape == (B, T, LNGRAM.routes)
  assert aux["memory/1/codes"].dtype == jnp.int32
  assert aux["memory/1/route_mass"].shape == (B, T, LNGRAM.q_heads)
  mass = aux["memory/1/route_mass"].astype(jnp.float32)
  assert bool(((mass > 0) & (mass < 1)).all())


def test_causality_by_gradient():
  """d logits[t] / d input[s] is exactly zero for every s > t (Lngram branch live)."""
  model = _model()
  x_BxTxD = model.embed(_tokens())

  @nnx.jit
  def grads_wrt_inputs(model, x_BxTxD):
    """Row t: d <logits[:, t], w> / d x, every t at once (one vmapped VJP)."""
    _, vjp = jax.vjp(model.forward_embedded, x_BxTxD)
    w_V = jnp.linspace(-1, 1, 256)
    cot_TxBxTxV = jnp.broadcast_to(jnp.eye(T)[:, None, :, None] * w_V, (T, B, T, 256))
    return jax.vmap(lambda cot: vjp(cot)[0])(cot_TxBxTxV)

  g_TxBxTxD = np.asarray(grads_wrt_inputs(model, x_BxTxD))
  for t in range(T):
    assert np.all(g_TxBxTxD[t][:, t + 1:] == 0.0), t
    assert np.all(np.abs(g_TxBxTxD[t][:, : t + 1]).sum(-1) > 0), t


def test_future_tokens_do_not_change_earlier_logits():
  model = _model()
  tokens = _tokens()
  changed = tokens.at[:, 7:].set((tokens[:, 7:] + 1) % 256)
  before, after = _forward(model, tokens), _forward(model, changed)
  np.testing.assert_array_equal(before[:, :7], after[:, :7])
  assert float(jnp.abs(before[:, 7:] - after[:, 7:]).max()) > 1e-4


def test_packed_segments_do_not_see_each_other():
  """A row packing segments A (5 tokens) and B (7) gives the logits of A and B alone."""
  model = _model()
  tokens = _tokens(seed=2)
  packed = tokens[:1]
  segment_ids = jnp.array([[0] * 5 + [1] * 7])
  alone = jnp.stack([jnp.pad(packed[0, :5], (0, 7)), jnp.pad(packed[0, 5:], (0, 5))])
  valid = jnp.array([[True] * 5 + [False] * 7, [True] * 7 + [False] * 5])
  logits_packed = _forward(model, jnp.concatenate([packed, packed]),
                           jnp.concatenate([segment_ids, segment_ids]), None)[0]
  logits_alone = _forward(model, alone, jnp.zeros((2, T), jnp.int32), valid)
  np.testing.assert_allclose(logits_packed[:5], logits_alone[0, :5], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(logits_packed[5:], logits_alone[1, :7], rtol=1e-5, atol=1e-5)


def test_zero_init_lngram_branch_leaves_logits_unchanged():
  baseline = DecoderLM(CONFIG.replace(memory_layers=(), memory=None), rngs=nnx.Rngs(5))
  model = DecoderLM(CONFIG, rngs=nnx.Rngs(6))
  nnx.update(model, nnx.state(baseline))  # every non-Lngram weight copied
  tokens = _tokens(seed=3)
  np.testing.assert_array_equal(_forward(model, tokens), _forward(baseline, tokens))
  liven_lngram(model, key=1, w_o_std=0.3, conv_std=0.3)   # the check can fail
  assert float(jnp.abs(_forward(model, tokens) - _forward(baseline, tokens)).max()) > 1e-4


@pytest.mark.parametrize("branch", [
    ParallelMLPConfig(d_model=32, hidden_dim=48),
    PVMBranchConfig(d_model=32, latent_dim=16, head_dim=8, backbone_ffn_dim=64)],
    ids=["mlp", "pvm"])
def test_beside_ffn_branch_draws_after_the_backbone_and_zero_gate_is_the_base(branch):
  """Same seed: the backbone draws the same numbers with a branch; gate 0 = base model."""
  base_config = CONFIG.replace(memory_layers=(), memory=None)
  baseline = DecoderLM(base_config, rngs=nnx.Rngs(5))
  model = DecoderLM(base_config.replace(ffn_branch_layers=(0,), ffn_branch=branch),
                    rngs=nnx.Rngs(5))
  tokens = _tokens(seed=3)
  visual = jax.random.normal(jax.random.key(0), (B, 3, 32))
  from experiments.models import BranchContext
  ctx = BranchContext(visual_BxNvxD=visual)
  fwd = nnx.jit(lambda m, t, c: m(t, context=c))
  np.testing.assert_array_equal(fwd(model, tokens, ctx), _forward(baseline, tokens))
  model.blocks[0].ffn_branch.gate[...] = jnp.asarray(0.5)
  assert float(jnp.abs(fwd(model, tokens, ctx) - _forward(baseline, tokens)).max()) > 1e-4


@pytest.mark.slow
def test_remat_matches_plain_and_zero_init_branch_trains():
  """Same loss and grads with remat; at init (W_O = conv = 0) W_O still gets gradient."""
  plain = DecoderLM(CONFIG, rngs=nnx.Rngs(7))
  remat = DecoderLM(CONFIG.replace(remat=True), rngs=nnx.Rngs(8))
  nnx.update(remat, nnx.state(plain))
  tokens = _tokens(seed=4)

  @nnx.jit
  def value_and_grad(model, tokens):
    def loss(model):
      logits = model(tokens[:, :-1])
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits),
                                           tokens[:, 1:, None], axis=-1))
    return nnx.value_and_grad(loss)(model)

  (v0, g0), (v1, g1) = value_and_grad(plain, tokens), value_and_grad(remat, tokens)
  np.testing.assert_allclose(v0, v1, rtol=1e-6)
  chex.assert_trees_all_close(g0, g1, rtol=1e-5, atol=1e-8)
  # DESIGN.md §2, Init: the branch is exactly zero at step 0 but W_O trains.
  assert float(jnp.abs(g0["blocks"][1]["memory"]["w_o"][...]).max()) > 0
  assert float(jnp.abs(g0["blocks"][1]["memory"]["conv_kernel"][...]).max()) == 0


def test_untied_embeddings_and_param_paths():
  model = DecoderLM(CONFIG.replace(tie_embeddings=False), rngs=nnx.Rngs(0))
  assert model.unembed.shape == (32, 256)
  paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  for expected in ("embed/table", "unembed", "final_norm/scale", "blocks/0/attn/w_q",
                   "blocks/1/memory/tables/0", "blocks/1/memory/router_w"):
    assert expected in paths, (expected, sorted(paths))
  assert not any(p.startswith("blocks/0/memory") for p in paths)
  assert _forward(model, _tokens()).shape == (B, T, 256)


@pytest.mark.parametrize("config", [
    CONFIG,
    CONFIG.replace(dtype="bfloat16", param_dtype=jnp.bfloat16, tie_embeddings=False,
                   memory=LNGRAM.replace(dtype=jnp.bfloat16, surrogate="exact")),
    CONFIG.replace(memory_layers=(), memory=None),
    CONFIG.replace(ffn_branch_layers=(0,), ffn_branch=ParallelMLPConfig(d_model=32, hidden_dim=8)),
    CONFIG.replace(ffn_branch_layers=(0, 1), ffn_branch=PVMBranchConfig(
        d_model=32, latent_dim=16, head_dim=8, backbone_ffn_dim=64, source="hidden")),
], ids=["lngram", "bf16", "plain", "mlp", "pvm"])
def test_config_json_round_trip(config):
  d = json.loads(json.dumps(config.to_dict()))
  assert LMConfig.from_dict(d) == config
  assert isinstance(d["dtype"], str)
  for field in ("memory", "ffn_branch"):
    if getattr(config, field) is not None:
      assert d[field]["kind"] in ("lngram", "pvm", "mlp")


def test_config_from_dict_reads_the_pre_slot_names():
  d = CONFIG.to_dict()
  d["lngram_layers"], d["lngram"] = d.pop("memory_layers"), d.pop("memory")
  d["lngram"].pop("kind")
  assert LMConfig.from_dict(d) == CONFIG


@pytest.mark.parametrize("changes, match", [
    (dict(n_heads=3), "n_heads=3 must be a multiple of n_kv_heads=2"),
    (dict(head_dim=7), "head_dim=7 must be even"),
    (dict(d_model=0), "d_model=0 must be a positive int"),
    (dict(memory_layers=(2,)), r"memory_layers=\(2,\) has \[2\] outside"),
    (dict(memory_layers=(1, 1)), "duplicates"),
    (dict(memory=None), "needs a `memory` config"),
    (dict(memory=LNGRAM.replace(d_model=64, q_heads=8)), "memory.d_model=64 must equal"),
    (dict(ffn_branch_layers=(0,), ffn_branch=LNGRAM), "goes in the 'memory' slot"),
    (dict(ffn_branch_layers=(0,)), "needs a `ffn_branch` config"),
    (dict(memory="lngram"), "no registered branch takes a str"),
    (dict(dtype="int32"), "dtype='int32' is not one of"),
    (dict(norm_eps=0.0), "norm_eps=0.0 must be > 0"),
])
def test_bad_config_errors_name_the_field(changes, match):
  with pytest.raises(ValueError, match=match):
    CONFIG.replace(**changes)


def test_from_dict_rejects_unknown_fields_and_long_inputs():
  with pytest.raises(ValueError, match="unknown fields"):
    LMConfig.from_dict({**CONFIG.to_dict(), "n_layer": 3})
  with pytest.raises(ValueError, match="max_len=32"):
    _model().forward_embedded(jnp.zeros((1, 33, 32)))
