"""The MoE FFN (experiments/models/moe/layer.py): grouped dispatch == per-token loop, routing
rules on hand cases, configs, the decoder with MoE layers, and training runs (resume,
data=4 and expert=4 on host devices == one device). The dispatch on meshes:
test_moe_parallel.py."""

import json
import signal

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from experiments.configs import load_config
from experiments.jobs import run_train
from experiments.jobs.lm.task import lm_loss
from experiments.jobs.restore import restore
from experiments.models import DecoderLM, LMConfig, lm_config, moe
from experiments.models.moe import MoEConfig, MoEFFN
from experiments.models.moe import reference as moe_reference
from experiments.trainer.step import make_train_step

D = 8


def _module(dtype, **fields):
  config = MoEConfig(**{"d_model": D, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 6,
                        "n_shared_experts": 1, "norm_topk_prob": True,
                        "bias_update_rate": 0.1, **fields})
  module = MoEFFN(config, dtype=dtype, param_dtype=dtype, init_std=0.5, rngs=nnx.Rngs(3))
  if module.expert_bias is not None:   # a bias that changes some tokens' choices
    module.expert_bias[...] = jnp.asarray([0.0, 0.05, -0.05, 0.02], jnp.float32)
  return module


def _x(dtype, shape=(2, 5, D)):
  return jax.random.normal(jax.random.key(1), shape, dtype)


def _values_and_grads(fn, module, x):
  """(y, d/d(params, x) of Σ y·r) for a fixed random r."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  r = jax.random.normal(jax.random.key(2), x.shape, x.dtype)

  def objective(params, x):
    y = fn(nnx.merge(graphdef, params, rest), x)
    return jnp.sum(y * r), y

  (_, y), grads = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))(
      params, x)
  return y, grads


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-5), (jnp.float64, 1e-12)])
def test_grouped_dispatch_equals_the_per_token_loop_values_and_grads(dtype, tol):
  with jax.enable_x64(dtype == jnp.float64):
    module, x = _module(dtype), _x(dtype)
    y, grads = _values_and_grads(lambda m, x: m(x)[0], module, x)
    y_ref, grads_ref = _values_and_grads(moe_reference.moe_forward_loop, module, x)
    chex.assert_type([y, y_ref], dtype)
    chex.assert_trees_all_equal_dtypes(grads, grads_ref)
    chex.assert_trees_all_close((y, grads), (y_ref, grads_ref), rtol=tol, atol=tol)
    # The router gets a gradient (through the gates); the bias none (only top-k reads it).
    assert float(jnp.abs(grads[0]["router"]).max()) > 0
    assert float(jnp.abs(grads[0]["expert_bias"]).max()) == 0
    # The routing itself: the same experts and gates, token by token.
    x_NxD = x.reshape(-1, D)
    got = moe.route(x_NxD, module.router[...], module.expert_bias[...], top_k=2,
                    norm_topk_prob=True)
    want = moe_reference.route_loop(x_NxD, module.router[...], module.expert_bias[...],
                                    top_k=2, norm_topk_prob=True)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[2], want[2], rtol=tol)


def test_the_reference_dispatch_option_runs_the_loop():
  grouped = _module(jnp.float32)
  loop = _module(jnp.float32, dispatch="reference")
  np.testing.assert_allclose(grouped(_x(jnp.float32))[0], loop(_x(jnp.float32))[0],
                             rtol=2e-5, atol=2e-6)


def test_top_k_ties_go_to_the_lowest_expert_index():
  router = jnp.zeros((D, 4))   # every expert equally likely
  x = _x(jnp.float32).reshape(-1, D)
  for route in (moe.route, moe_reference.route_loop):
    _, experts, gates = route(x, router, None, top_k=2, norm_topk_prob=False)
    np.testing.assert_array_equal(experts, np.tile([0, 1], (x.shape[0], 1)))
    np.testing.assert_allclose(gates, 0.25)
    # A bias tie between experts 1 and 3 above 0 and 2: 1 wins the first place.
    bias = jnp.asarray([0.0, 0.1, 0.0, 0.1])
    _, experts, gates = route(x, router, bias, top_k=2, norm_topk_prob=True)
    np.testing.assert_array_equal(experts, np.tile([1, 3], (x.shape[0], 1)))
    np.testing.assert_allclose(gates, 0.5)   # the gates ignore the bias


def test_balance_loss_and_load_on_a_hand_case():
  p = jnp.asarray([[0.7, 0.3], [0.6, 0.4], [0.2, 0.8], [0.9, 0.1]])
  experts = jnp.asarray([[0], [0], [1], [0]])
  loss, load = moe.balance_stats(p, experts)
  # load = (3/4, 1/4), P = (0.6, 0.4): E · Σ load·P = 2 · (0.45 + 0.1)
  np.testing.assert_allclose(load, [0.75, 0.25])
  np.testing.assert_allclose(loss, 1.1, rtol=1e-6)
  # Top-2 of 3 over two valid tokens (the third is padding, NaN there stays out).
  p3 = jnp.asarray([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [jnp.nan, 0.0, 0.0]])
  experts3 = jnp.asarray([[0, 1], [2, 1], [0, 1]])
  loss3, load3 = moe.balance_stats(p3, experts3, jnp.asarray([True, True, False]))
  # slots: e0 1, e1 2, e2 1 of 4 -> load (1/4, 1/2, 1/4); P = (0.3, 0.25, 0.45)
  np.testing.assert_allclose(load3, [0.25, 0.5, 0.25])
  np.testing.assert_allclose(loss3, 3 * (0.25 * 0.3 + 0.5 * 0.25 + 0.25 * 0.45), rtol=1e-6)


def test_bias_update_on_a_hand_case():
  new = moe.bias_update(jnp.asarray([0.0, 0.1, -0.1, 0.0]),
                        jnp.asarray([0.5, 0.25, 0.25, 0.0]), 0.01)
  # 1/E = 0.25: overloaded expert 0 loses γ, idle expert 3 gains γ, the others stay.
  np.testing.assert_allclose(new, [-0.01, 0.1, -0.1, 0.01], rtol=1e-6)


# --- configs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, match", [
    (dict(n_experts=0), "n_experts=0 must be a positive int"),
    (dict(top_k=5), "top_k=5 must be <= n_experts=4"),
    (dict(router="sigmoid"), "router='sigmoid' must be one of"),
    (dict(dispatch="dense"), "dispatch='dense' must be one of"),
    (dict(balance_coef=-1.0), "balance_coef=-1.0 must be a finite number >= 0.0"),
    (dict(n_shared_experts=-1), "n_shared_experts=-1 must be an int >= 0"),
    (dict(norm_topk_prob=1), "norm_topk_prob=1 must be a bool"),
])
def test_bad_moe_configs_are_refused_naming_the_field(fields, match):
  with pytest.raises(ValueError, match=match):
    MoEConfig(**{"d_model": D, "n_experts": 4, **fields})


def _lm(**fields):
  return LMConfig(**{"d_model": 32, "n_layers": 3, "n_heads": 2, "n_kv_heads": 1,
                     "head_dim": 16, "ffn_dim": 64, "max_len": 16, **fields})


@pytest.mark.parametrize("fields, match", [
    (dict(moe_layers=(1,)), r"moe_layers=\(1,\) needs a `moe` config"),
    (dict(moe_layers=(3,), moe=MoEConfig(d_model=32)), r"has \[3\] outside \[0, n_layers=3\)"),
    (dict(moe_layers=(1, 1), moe=MoEConfig(d_model=32)), "has duplicates"),
    (dict(moe_layers=(1,), moe=MoEConfig(d_model=16)), "moe.d_model=16 must equal d_model=32"),
])
def test_bad_moe_layers_are_refused(fields, match):
  with pytest.raises(ValueError, match=match):
    _lm(**fields)


def test_lm_config_json_round_trip_and_defaults_unchanged():
  config = _lm(moe_layers=[0, 2], moe=MoEConfig(d_model=32, n_shared_experts=1))
  assert config.moe_layers == (0, 2)
  assert LMConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
  assert "moe" not in _lm().to_dict() and "moe_layers" not in _lm().to_dict()
  c = load_config("experiments/configs/lm_baseline.py:smoke")
  c.model.moe_layers = (1,)
  c.model.moe = dict(n_experts=4, top_k=1, expert_ffn_dim=16)
  assert lm_config(c).moe == MoEConfig(d_model=32, n_experts=4, top_k=1, expert_ffn_dim=16)
  c.model.moe = dict(n_expert=4)
  with pytest.raises(ValueError, match="model.moe: .*n_expert"):
    lm_config(c)


# --- the decoder with MoE layers -----------------------------------------------------------------


def _moe_lm(**moe_fields):
  moe_config = MoEConfig(**{"d_model": 32, "n_experts": 4, "top_k": 2, "expert_ffn_dim": 16,
                            "n_shared_experts": 1, "bias_update_rate": 0.01, **moe_fields})
  return _lm(moe_layers=(1, 2), moe=moe_config)


def test_moe_layers_leave_the_other_layers_draws_and_scan_equals_unrolled():
  config = _moe_lm()
  model = DecoderLM(config, rngs=nnx.Rngs(0))
  dense = DecoderLM(_lm(), rngs=nnx.Rngs(0))
  # Layer 0 and the embedding are drawn before the first MoE FFN: unchanged.
  for a, b in ((model.embed.table, dense.embed.table),
               (model.blocks[0].mlp.w_up, dense.blocks[0].mlp.w_up)):
    np.testing.assert_array_equal(a[...], b[...])
  assert model.blocks[1].mlp.w_gate.shape == (4, 32, 16)
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 256)
  forward = nnx.jit(lambda m, t: m(t, return_aux=True))   # eager op-by-op is slower
  logits, aux = forward(model, tokens)
  scanned = DecoderLM(config, rngs=nnx.Rngs(0), scan=True)
  assert scanned.layer_spans == ((0, 1), (1, 3))   # the two MoE layers stacked
  logits_scan, aux_scan = forward(scanned, tokens)
  np.testing.assert_allclose(logits_scan, logits, rtol=1e-5, atol=1e-5)
  assert set(aux) == {f"moe/{i}/{n}" for i in (1, 2) for n in ("balance_loss", "expert_load")}
  chex.assert_trees_all_close(aux_scan, aux, rtol=1e-5, atol=0)

  # Decoding through the cache gives the parallel forward's logits.
  @nnx.jit
  def prefill_then_decode(m, t):
    _, cache = m.prefill(t[:, :8], cache_len=16)
    return m.decode_step(t[:, 8:9], cache)[0]

  np.testing.assert_allclose(prefill_then_decode(model, tokens), logits[:, 8], rtol=1e-4,
                             atol=1e-5)


def test_a_train_step_adds_the_balance_loss_and_sets_the_bias_by_its_rule():
  model = DecoderLM(_moe_lm(balance_coef=0.5), rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 256)
  batch = dict(inputs=tokens, targets=jnp.roll(tokens, -1, 1), segment_ids=jnp.ones_like(tokens),
               positions=jnp.broadcast_to(jnp.arange(16), (2, 16)),
               loss_mask=jnp.ones_like(tokens))
  _, aux = model(tokens, return_aux=True)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  tx = optax.adamw(1e-2, weight_decay=0.1)
  step = make_train_step(graphdef, tx, lambda s: 1e-2, lm_loss)
  state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
  before = jax.tree.map(np.array, params)
  new, metrics = step(state, rest, batch)
  balance = [float(aux[f"moe/{i}/balance_loss"]) for i in (1, 2)]
  np.testing.assert_allclose(metrics["train/moe_balance_loss"], np.mean(balance), rtol=1e-6)
  np.testing.assert_allclose(metrics["train/loss"] - metrics["train/bits_per_byte"] * np.log(2),
                             0.5 * sum(balance), rtol=1e-4)
  assert all(np.ndim(v) == 0 for v in metrics.values())   # the writer takes scalars
  for i in (1, 2):
    want = moe.bias_update(jnp.zeros(4), aux[f"moe/{i}/expert_load"], 0.01)
    np.testing.assert_array_equal(new["params"]["blocks"][i]["mlp"]["expert_bias"], want)
    assert not np.array_equal(new["params"]["blocks"][i]["mlp"]["router"],
                              before["blocks"][i]["mlp"]["router"])


# --- training runs -------------------------------------------------------------------------------

STEPS = 4
needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")


def _run_config(mesh=None):
  c = load_config("experiments/configs/lm_baseline.py:smoke")
  c.model.moe_layers = (0, 1)
  c.model.moe = dict(n_experts=4, top_k=2, expert_ffn_dim=16, n_shared_experts=1,
                     balance_coef=0.01, bias_update_rate=0.01)
  c.train.update(steps=STEPS, progress=False, eval_every=STEPS, ckpt_every=2)
  c.mesh.update(mesh or {})
  return c


def _losses(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}, rows


def _params(workdir):
  model, _ = restore(workdir)
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("moe_one_device")
  result = run_train(_run_config(), workdir)
  return workdir, result, _losses(workdir)[0], _params(workdir)


def test_an_moe_run_trains_logs_expert_load_and_restores_its_bias(one_device_run):
  workdir, result, losses, params = one_device_run
  assert result["step"] == STEPS and list(losses) == list(range(1, STEPS + 1))
  assert losses[STEPS] < losses[1]
  _, rows = _losses(workdir)
  train_row = next(r for r in rows if "train/loss" in r)
  assert {"train/moe_balance_loss", "train/moe/0/load_max", "train/moe/1/load_min"} <= set(train_row)
  evaluation = result["eval"]
  loads = [evaluation[f"moe/1/load/{e}"] for e in range(4)]
  assert sum(loads) == pytest.approx(1.0) and evaluation["moe/1/load_max"] == max(loads)
  # The bias moved by whole steps of γ and came back with the checkpoint.
  bias = params["blocks"][0]["mlp"]["expert_bias"]
  assert np.abs(bias).max() > 0
  np.testing.assert_allclose(np.round(bias / 0.01), bias / 0.01, atol=1e-4)


def test_an_interrupted_moe_run_resumes_bit_for_bit(one_device_run, tmp_path):
  _, _, want_losses, want_params = one_device_run

  def stop_at_2(step, batch):
    if step == 2:
      signal.raise_signal(signal.SIGTERM)

  assert run_train(_run_config(), tmp_path, callback=stop_at_2)["interrupted"]
  assert run_train(_run_config(), tmp_path)["step"] == STEPS
  assert _losses(tmp_path)[0] == want_losses
  chex.assert_trees_all_equal(_params(tmp_path), want_params)


@needs_8
@pytest.mark.parametrize("mesh", [dict(data=4), dict(expert=4)])
def test_training_on_4_devices_equals_one_device(one_device_run, tmp_path, mesh):
  """data=4 splits the batch; expert=4 splits it too and sends every token's slots to
  the device holding its expert by all-to-all, and back: the same losses and weights."""
  _, _, want_losses, want_params = one_device_run
  run_train(_run_config(mesh), tmp_path)
  got_losses = _losses(tmp_path)[0]
  assert list(got_losses) == list(want_losses)
  np.testing.assert_allclose(list(got_losses.values()), list(want_losses.values()), atol=2e-5)
  chex.assert_trees_all_close(_params(tmp_path), want_params, rtol=2e-4, atol=2e-5)


@needs_8
def test_an_expert_axis_that_does_not_divide_the_experts_is_refused(tmp_path):
  config = _run_config(dict(expert=8))   # refused for the experts before the batch
  with pytest.raises(ValueError, match="n_experts=4 must be a multiple of mesh.expert=8"):
    run_train(config, tmp_path / "run")
  assert not (tmp_path / "run").exists()
