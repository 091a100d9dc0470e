"""Top-1 sparse SwiGLU arm: every dispatch == a per-token reference (values and
gradients), the Switch loss on a hand-computed case, the branch contract,
metrics, config validation, parameter counts and matching, wiring."""

import functools
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from branch_contract import (
    assert_causal,
    assert_decode_from_empty_state,
    assert_decode_matches_forward,
    assert_segments_independent,
    assert_zero_at_init,
    random_inputs,
)
from flax import nnx

from experiments.models.arms import sparse_ffn
from experiments.models.arms.sparse_ffn import (
    DISPATCHES,
    SparseFFN,
    SparseFFNConfig,
    load_and_prob,
    match_lngram,
    param_count,
)
from experiments.models.branches import BranchContext
from lngram_jax.config import LngramConfig

D = 16
SMALL = dict(d_model=D, experts=5, expert_dim=8, shared_dim=3, tile=4)


def make(seed=0, **fields):
  return SparseFFN(SparseFFNConfig(**(SMALL | fields)), rngs=nnx.Rngs(seed))


def live(**fields):
  """A branch with nonzero output (W2 drawn instead of zero)."""
  return make(out_init_std=0.1, **fields)


def token_reference(params, x, experts_BxT, *, shared, eps=1e-6):
  """y one token at a time (a sequential loop, lax.map): its norm, router, its own
  expert's weights picked by index, plain matmuls; no sorting or tiling. The
  routing decisions (discrete, so without gradient) are given, so jax.grad of
  this is the reference's gradient."""

  def one(xt, e):
    h = xt * jax.lax.rsqrt(jnp.mean(xt * xt) + eps)
    p = jax.nn.softmax(h @ params["router_w"])
    a = jax.nn.silu(h @ params["w_gate"][e]) * (h @ params["w_up"][e])
    y = p[e] * (a @ params["w_down"][e])
    if shared:
      y = y + (jax.nn.silu(h @ params["shared_gate"]) * (h @ params["shared_up"])
               ) @ params["shared_down"]
    return y

  B, T, D_ = x.shape
  tokens = (x.reshape(B * T, D_), jnp.asarray(experts_BxT).reshape(B * T))
  return jax.lax.map(lambda te: one(*te), tokens).reshape(x.shape)


@pytest.mark.parametrize("shared,dispatches", [(3, DISPATCHES), (0, ("tiled",))])
def test_routing_matches_per_token_reference_values_and_gradients(shared, dispatches):
  x, _ = random_inputs(D, batch=2, length=6, seed=3)
  R = jax.random.normal(jax.random.key(7), x.shape)
  branch = live(shared_dim=shared)
  params = nnx.to_pure_dict(nnx.state(branch, nnx.Param))
  _, _, e = branch.route(x)
  xn = np.asarray(x, np.float64)
  h = xn / np.sqrt((xn * xn).mean(-1, keepdims=True) + 1e-6)
  np.testing.assert_array_equal(e, np.argmax(h @ np.asarray(params["router_w"]), -1))
  assert len(set(np.asarray(e).ravel().tolist())) >= 3  # several experts really used

  def ref_loss(p, x_):
    y_ = token_reference(p, x_, e, shared=shared)
    return jnp.sum(y_ * R), y_

  (_, y_ref), g_ref = jax.jit(jax.value_and_grad(ref_loss, argnums=(0, 1), has_aux=True))(
      params, x)
  for dispatch in dispatches:
    graphdef, state = nnx.split(live(shared_dim=shared, dispatch=dispatch), nnx.Param)
    chex.assert_trees_all_equal(nnx.to_pure_dict(state), params)  # same seed, same parameters

    def module_loss(p, x_, graphdef=graphdef):
      y_ = nnx.merge(graphdef, nnx.State(p)).forward(x_, BranchContext())[0]
      return jnp.sum(y_ * R), y_

    (_, y), g = jax.jit(jax.value_and_grad(module_loss, argnums=(0, 1), has_aux=True))(
        params, x)
    err = f"{dispatch}, shared={shared}"
    chex.assert_trees_all_close(y, y_ref, rtol=1e-5, atol=1e-6, custom_message=err)
    chex.assert_trees_all_close(g, g_ref, rtol=1e-4, atol=1e-6, custom_message=err)


def test_balance_loss_hand_computed():
  # Three valid tokens routed 0, 0, 1 and one padding token (excluded from f and P).
  p = jnp.array([[[0.7, 0.3], [0.8, 0.2], [0.4, 0.6], [0.1, 0.9]]])
  e = jnp.argmax(p, -1)
  valid = jnp.array([[True, True, True, False]])
  f, P = load_and_prob(p, e, valid, 2)
  np.testing.assert_allclose(f, [2 / 3, 1 / 3], rtol=1e-6)
  np.testing.assert_allclose(P, [1.9 / 3, 1.1 / 3], rtol=1e-6)
  # α·E·Σ f_e P_e = 0.01 · 2 · (2·1.9 + 1.1) / 9
  np.testing.assert_allclose(0.01 * 2 * jnp.sum(f * P), 0.01 * 2 * 4.9 / 9, rtol=1e-6)
  # f carries no gradient: d/dp of Σ f P is f for every valid token, 0 for padding.
  g = jax.grad(lambda p_: jnp.sum(jnp.prod(jnp.stack(load_and_prob(p_, e, valid, 2)), 0)))(p)
  np.testing.assert_allclose(g[0], [[2 / 9, 1 / 9]] * 3 + [[0, 0]], rtol=1e-6, atol=1e-7)


def test_forward_aux_loss_and_metrics_skip_padding():
  branch = live(balance_coef=0.05)
  x, _ = random_inputs(D, batch=2, length=8, seed=1)
  valid = jnp.arange(8)[None, :] < jnp.array([[8], [5]])

  @nnx.jit
  def run(b, x_):
    y_, aux_ = b.forward(x_, BranchContext(valid_BxT=valid))
    return y_, aux_, b.route(x_)[1], b.metric_sums(aux_, valid)

  y, aux, p, sums = run(branch, x)
  pv, ev = np.asarray(p)[np.asarray(valid)], np.asarray(aux["expert"])[np.asarray(valid)]
  np.testing.assert_array_equal(ev, np.argmax(pv, -1))
  f = np.bincount(ev, minlength=5) / len(ev)
  np.testing.assert_allclose(aux["aux_loss"], 0.05 * 5 * np.sum(f * pv.mean(0)), rtol=1e-5)
  np.testing.assert_allclose(aux["metric/max_expert_load"], f.max(), rtol=1e-6)
  assert aux["aux_loss"].dtype == jnp.float32 and aux["aux_loss"].shape == ()
  np.testing.assert_array_equal(y[1, 5:], 0.0)
  # Padding inputs change nothing that is counted.
  np.testing.assert_allclose(run(branch, x.at[1, 5:].set(100.0))[1]["aux_loss"],
                             aux["aux_loss"], rtol=1e-6)
  np.testing.assert_allclose(sums["expert_tokens"], np.bincount(ev, minlength=5))
  assert float(sums["tokens"]) == 13
  summary = SparseFFN.summarise_metrics({k: np.asarray(v) for k, v in sums.items()})
  np.testing.assert_allclose(summary["expert_load_max"], f.max(), rtol=1e-6)
  np.testing.assert_allclose(summary["expert_load_min"], f.min(), rtol=1e-6)
  assert summary["experts_used"] == np.mean(f > 0)


_COMPILED = {}


@jax.tree_util.register_static
class Jitted:
  """The branch with its protocol methods compiled, its parameters an argument
  (the contract's checks call them many times, and eager dispatch is slow);
  branches of one structure share the compiled programs."""

  def __init__(self, branch):
    graphdef, self.state = nnx.split(branch)
    for method in ("forward", "prefill", "decode_step"):
      if (graphdef, method) not in _COMPILED:
        _COMPILED[graphdef, method] = jax.jit(
            lambda state, *args, m=method: getattr(nnx.merge(graphdef, state), m)(*args))
      setattr(self, method, functools.partial(_COMPILED[graphdef, method], self.state))
    self.init_decode_state = branch.init_decode_state


def test_branch_contract():
  x, tokens = random_inputs(D, batch=2, length=10, seed=5)
  fresh = make(out_init_std=0.0)
  np.testing.assert_array_equal(fresh.w_down[...], 0.0)
  np.testing.assert_array_equal(fresh.shared_down[...], 0.0)
  branch = live()
  zeroed = nnx.clone(branch)  # W2 as at init, the rest live: y must still be exactly 0
  zeroed.w_down[...] = jnp.zeros_like(zeroed.w_down[...])
  zeroed.shared_down[...] = jnp.zeros_like(zeroed.shared_down[...])
  assert_zero_at_init(Jitted(zeroed), x, tokens)
  branch = Jitted(branch)
  assert float(jnp.abs(branch.forward(x, BranchContext())[0]).max()) > 1e-3
  assert_causal(branch, x, tokens)
  assert_segments_independent(branch, x, tokens, split=5)
  assert_decode_matches_forward(branch, x, tokens, prompt=6)
  assert_decode_from_empty_state(branch, x, tokens)
  assert branch.init_decode_state(2, BranchContext()) is None


@pytest.mark.parametrize("field,value", [
    ("d_model", 0), ("experts", 0), ("expert_dim", -1), ("shared_dim", -1), ("tile", 0),
    ("balance_coef", -0.1), ("init_std", 0.0), ("out_init_std", float("nan")), ("eps", 0),
    ("dispatch", "sorted"), ("experts", True)])
def test_config_validation_names_the_field(field, value):
  with pytest.raises(ValueError, match=f"{field}="):
    SparseFFNConfig(**(SMALL | {field: value}))


def test_param_count_matches_the_module():
  for shared in (0, 3):
    branch = make(shared_dim=shared)
    n = sum(v.size for v in jax.tree.leaves(nnx.state(branch, nnx.Param)))
    c = param_count(branch.config)
    assert c["total"] == n
    assert c["active"] == D * 5 + 3 * D * 8 + 3 * D * shared  # router + one expert + shared
  # The paper's arm: two layers at d = 2048 give its printed 155.845M / 20.972M.
  c = param_count(SparseFFNConfig(d_model=2048, experts=8, expert_dim=1568, shared_dim=136))
  assert (round(2 * c["total"] / 1e6, 3), round(2 * c["active"] / 1e6, 3)) == (155.845, 20.972)


def _lm_lngram(routes):
  from experiments.configs import load_config

  m = load_config(f"experiments/configs/lm_lngram.py:r{routes}").model
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in m.memory.items()
            if k != "kind"}
  return LngramConfig(d_model=m.d_model, **fields)


PAPER_R121 = LngramConfig(d_model=2048, routes=121, bits=4, orders=(2, 3), mem_dim=128,
                          q_heads=16, kv_heads=16, head_dim=128)


@pytest.mark.parametrize("lngram", [_lm_lngram(16), _lm_lngram(64), PAPER_R121],
                         ids=["r16", "r64", "paper-r121-m4-kv16"])
def test_match_lngram_within_two_percent(lngram):
  from lngram_jax import param_count as lngram_param_count

  target = lngram_param_count(lngram)
  got = param_count(match_lngram(lngram))
  for key in ("total", "active"):
    assert abs(got[key] / target[key] - 1) <= 0.02, (key, got, target)
  if lngram is PAPER_R121:
    # Lngram's side is the paper's (155.689M / 20.944M for two layers), and the
    # match lands within 0.2% of the paper's own arm (155.845M / 20.972M).
    assert (round(2 * target["total"] / 1e6, 3), round(2 * target["active"] / 1e6, 3)) == (
        155.689, 20.944)
    assert abs(2 * got["total"] / 155.845e6 - 1) < 2e-3
    assert abs(2 * got["active"] / 20.972e6 - 1) < 2e-3


def test_match_refuses_the_impossible():
  with pytest.raises(ValueError, match="no sparse FFN"):
    sparse_ffn.match_counts(total=10, active=9, d_model=128)


def test_experiment_config_matches_the_helper():
  from experiments.configs import load_config
  from experiments.models.config import LMConfig, lm_config

  # The file's sizes are written out (config files import no library code): each
  # matched-to arg must give what the helper computes.
  for routes in (8, 16, 32, 64, 128):
    arm = lm_config(load_config(f"experiments/configs/lm_sparse_ffn.py:matched-to=r{routes}"))
    m = match_lngram(_lm_lngram(routes))
    got = (arm.memory.experts, arm.memory.expert_dim, arm.memory.shared_dim)
    assert got == (m.experts, m.expert_dim, m.shared_dim), routes
  for arg in ("", "matched-to=r64,dense", "smoke"):
    model = lm_config(load_config(f"experiments/configs/lm_sparse_ffn.py:{arg}".rstrip(":")))
    assert isinstance(model.memory, SparseFFNConfig) and model.memory.d_model == model.d_model
    assert LMConfig.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    if arg.startswith("matched"):
      assert (model.memory.experts, model.memory.dispatch) == (152, "dense")
  with pytest.raises(ValueError, match="matched-to=r17"):
    load_config("experiments/configs/lm_sparse_ffn.py:matched-to=r17")


def test_registered_builds_an_lm_and_round_trips():
  from experiments.models.branches import KINDS, config_from_dict, config_to_dict
  from experiments.models.config import LMConfig
  from experiments.models.lm import DecoderLM
  from experiments.trainer.optimizer import param_group

  assert KINDS["sparse_ffn"].module is SparseFFN and sparse_ffn.SLOT == "memory"
  config = LMConfig(d_model=D, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32,
                    max_len=16, memory=SparseFFNConfig(**SMALL), memory_layers=(1,))
  assert LMConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
  d = json.loads(json.dumps(config_to_dict(SparseFFNConfig(**SMALL))))
  assert d["kind"] == "sparse_ffn" and config_from_dict(d) == SparseFFNConfig(**SMALL)
  # Traced, not run: the wiring is what is checked here (shapes and aux names).
  model = nnx.eval_shape(lambda: DecoderLM(config, rngs=nnx.Rngs(0)))
  assert isinstance(model.blocks[1].memory, SparseFFN) and model.blocks[0].memory is None
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
  logits, aux = nnx.eval_shape(lambda m: m(tokens, return_aux=True), model)
  assert logits.shape == (2, 6, 256) and aux["memory/1/aux_loss"].shape == ()
  assert aux["memory/1/expert"].shape == (2, 6)
  # Optimiser groups: the router without weight decay (as Lngram's), the experts with.
  groups = {p[-1]: param_group(("blocks", "1", "memory", *map(str, p)))
            for p, _ in nnx.to_flat_state(nnx.state(make(), nnx.Param))}
  assert groups == {"router_w": "no_decay", "w_gate": "decay", "w_up": "decay",
                    "w_down": "decay", "shared_gate": "decay", "shared_up": "decay",
                    "shared_down": "decay"}
