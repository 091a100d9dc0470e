"""PKM arm: two-stage search == brute force over every slot, a numpy reference,
the branch contract, metrics, config validation, parameter counts, wiring."""

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

from experiments.models.arms import pkm
from experiments.models.arms.pkm import PKMConfig, PKMMemory, param_count
from experiments.models.branches import BranchContext

D = 16
SMALL = dict(d_model=D, heads=2, key_dim=8, num_keys=8, topk=4)


def make(seed=0, **fields):
  return PKMMemory(PKMConfig(**(SMALL | fields)), rngs=nnx.Rngs(seed))


def live(**fields):
  """A branch with nonzero output (values / W_o drawn instead of zero)."""
  return make(zero_init=False, **fields)


def numpy_reference(branch, x):
  """Every one of the Nk² slot scores per token and head, the exact top-P by
  sorting, softmax, shared values summed over heads; plain or gated."""
  c = branch.config
  x = np.asarray(x, np.float64)
  u = x / np.sqrt((x * x).mean(-1, keepdims=True) + c.eps)
  q = (u @ np.asarray(branch.w_q[...], np.float64)).reshape(*x.shape[:2], c.heads, c.key_dim)
  if c.query_norm == "rms":
    q = q / np.sqrt((q * q).mean(-1, keepdims=True) + c.eps) * np.asarray(branch.query_norm[...])
  keys = np.asarray(branch.subkeys[...], np.float64)
  if c.key_norm:
    keys = keys / np.sqrt((keys * keys).mean(-1, keepdims=True) + c.eps)
  V = np.asarray(branch.tables[0][...], np.float64)
  half = c.key_dim // 2
  y = np.zeros((*x.shape[:2], c.dv))
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      for h in range(c.heads):
        s = np.array([[q[b, t, h, :half] @ keys[0, h, i] + q[b, t, h, half:] @ keys[1, h, j]
                       for j in range(c.num_keys)] for i in range(c.num_keys)]).reshape(-1)
        top = np.argsort(-s)[:c.topk]
        w = np.exp(s[top] - s[top].max())
        y[b, t] += (w / w.sum()) @ V[top]
  if c.gated:
    g = u @ np.asarray(branch.w_g[...], np.float64)
    y = (y * g / (1 + np.exp(-g))) @ np.asarray(branch.w_o[...], np.float64)
  return y


@pytest.mark.parametrize("fields", [{}, {"gated": True, "value_dim": 12},
                                    {"key_norm": True, "query_norm": "none"}])
def test_forward_equals_numpy_reference(fields):
  branch = live(**fields)
  x, _ = random_inputs(D, batch=2, length=8)
  y, _ = branch(x)
  np.testing.assert_allclose(np.asarray(y), numpy_reference(branch, x), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("fields", [{}, {"gated": True, "key_norm": True}])
def test_two_stage_topk_equals_brute_force_values_and_grads(fields):
  branch = live(**fields)
  x, _ = random_inputs(D, batch=2, length=8, seed=3)
  probe = jax.random.normal(jax.random.key(9), (2, 8, D))

  def loss(b, x_, brute):
    return jnp.sum(b(x_, brute_force=brute)[0] * probe)

  y_fast, aux_fast = branch(x)
  y_slow, aux_slow = branch(x, brute_force=True)
  np.testing.assert_array_equal(np.sort(aux_fast["slots"], -1), np.sort(aux_slow["slots"], -1))
  chex.assert_trees_all_close(y_fast, y_slow, rtol=1e-6, atol=1e-7)
  grad = nnx.grad(loss, argnums=(0, 1))
  (g_fast, gx_fast), (g_slow, gx_slow) = grad(branch, x, False), grad(branch, x, True)
  for path, a in nnx.to_flat_state(g_fast):
    assert np.abs(np.asarray(a[...])).max() > 0, f"no gradient reaches {path}"
  chex.assert_trees_all_close((g_fast, gx_fast), (g_slow, gx_slow), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gated", [False, True])
def test_zero_at_init(gated):
  x, tokens = random_inputs(D, batch=2, length=8)
  assert_zero_at_init(make(gated=gated), x, tokens)


@pytest.mark.parametrize("gated", [False, True])
def test_branch_contract(gated):
  branch = live(gated=gated)
  x, tokens = random_inputs(D, batch=2, length=8)
  assert_causal(branch, x, tokens)
  assert_segments_independent(branch, x, tokens, split=3)
  assert_decode_matches_forward(branch, x, tokens, prompt=5)
  assert_decode_from_empty_state(branch, x, tokens)
  assert branch.init_decode_state(2, BranchContext()) is None


def test_padding_outputs_zero():
  branch = live()
  x, tokens = random_inputs(D, batch=2, length=8)
  valid = jnp.arange(8)[None, :] < jnp.array([[4], [8]])
  y = branch.forward(x, BranchContext(tokens_BxT=tokens, valid_BxT=valid))[0]
  np.testing.assert_array_equal(np.asarray(y[0, 4:]), 0.0)
  np.testing.assert_array_equal(np.asarray(y[:, :4]), np.asarray(branch(x)[0][:, :4]))


def test_slot_usage_metric():
  branch = live()
  x, tokens = random_inputs(D, batch=2, length=8)
  valid = jnp.arange(8)[None, :] < jnp.array([[2], [8]])
  aux = branch.forward(x, BranchContext(tokens_BxT=tokens, valid_BxT=valid))[1]
  sums = jax.jit(branch.metric_sums)(aux, valid)
  slots = np.asarray(aux["slots"])
  read = set(slots[0, :2].reshape(-1)) | set(slots[1].reshape(-1))
  expected = np.zeros(branch.config.slots)
  expected[sorted(read)] = 1.0
  np.testing.assert_array_equal(np.asarray(sums["slots_read_max"]), expected)
  assert float(sums["tokens"]) == 10.0
  assert float(aux["metric/batch_slot_usage"]) == pytest.approx(len(read) / branch.config.slots)
  usage = PKMMemory.summarise_metrics({k: np.asarray(v) for k, v in sums.items()})
  assert usage == {"slot_usage": len(read) / branch.config.slots}
  # Merging batches by elementwise max: a slot read in any batch counts once.
  other = np.zeros(branch.config.slots)
  other[0] = 1.0
  merged = PKMMemory.summarise_metrics({"slots_read_max": np.maximum(expected, other)})
  assert merged["slot_usage"] == len(read | {0}) / branch.config.slots


@pytest.mark.parametrize("field,value", [
    ("d_model", 0), ("heads", -1), ("key_dim", 7), ("num_keys", 2.5), ("topk", 9),
    ("value_dim", 12), ("value_dim", -1), ("gated", 1), ("query_norm", "batch"),
    ("key_norm", "yes"), ("zero_init", None), ("init_std", 0.0), ("eps", float("nan")),
    ("num_keys", 50_000)])
def test_config_rejects_bad_field(field, value):
  with pytest.raises(ValueError, match=f"PKMConfig: {field}="):
    PKMConfig(**(SMALL | {field: value}))


@pytest.mark.parametrize("fields", [{}, {"gated": True, "value_dim": 12},
                                    {"query_norm": "none"}])
def test_param_count(fields):
  config = PKMConfig(**(SMALL | fields))
  count = param_count(config)
  branch = PKMMemory(config, rngs=nnx.Rngs(0))
  leaves = jax.tree.leaves(nnx.state(branch, nnx.Param))
  assert count["total"] == sum(leaf.size for leaf in leaves)
  assert count["total"] == count["dense"] + count["keys"] + count["values"]
  c = config
  gate = 2 * D * c.dv if c.gated else 0
  norm = c.heads * c.key_dim if c.query_norm == "rms" else 0
  assert count["active"] == (D * c.heads * c.key_dim + norm + c.heads * c.num_keys * c.key_dim
                             + c.heads * c.topk * c.dv + gate)


def test_registered_builds_an_lm_and_round_trips():
  from experiments.models.branches import KINDS
  from experiments.models.config import LMConfig
  from experiments.models.lm import DecoderLM
  from experiments.trainer.optimizer import param_group

  assert KINDS["pkm"].module is PKMMemory and pkm.SLOT == "memory"
  config = LMConfig(d_model=D, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32,
                    max_len=16, memory=PKMConfig(**(SMALL | {"gated": True})),
                    memory_layers=(1,))
  assert LMConfig.from_dict(config.to_dict()) == config
  model = DecoderLM(config, rngs=nnx.Rngs(0))
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
  logits, aux = model(tokens, return_aux=True)
  assert logits.shape == (2, 6, 256) and aux["memory/1/slots"].shape == (2, 6, 2, 4)
  # The optimiser's groups from the full paths (`blocks/1/memory/...`).
  groups = {"/".join(map(str, p)): param_group(("blocks", "1", "memory", *map(str, p)))
            for p, _ in nnx.to_flat_state(nnx.state(model.blocks[1].memory, nnx.Param))}
  assert groups == {"tables/0": "table", "subkeys": "decay", "w_q": "decay", "w_g": "decay",
                    "w_o": "decay", "query_norm": "no_decay"}


@pytest.mark.parametrize("arg", ["", "smoke", "gated,smoke"])
def test_experiment_config_builds(arg):
  from experiments.configs import load_config
  from experiments.models.config import lm_config

  model = lm_config(load_config(f"experiments/configs/lm_pkm.py:{arg}".rstrip(":")))
  assert isinstance(model.memory, PKMConfig) and model.memory.d_model == model.d_model
  assert model.memory.gated == ("gated" in arg)
  if arg == "":
    # Comparable with lm_lngram's default (r16: 2.28M total, 51k active per layer).
    count = param_count(model.memory)
    assert 1.8e6 < count["total"] < 2.8e6 and 30e3 < count["active"] < 80e3


def test_experiment_config_args():
  from experiments.configs import load_config

  memory = load_config("experiments/configs/lm_pkm.py:keys64,top8").model.memory
  assert (memory.num_keys, memory.topk, memory.gated) == (64, 8, False)
  with pytest.raises(ValueError, match="lm_pkm: unknown config arg 'r16'"):
    load_config("experiments/configs/lm_pkm.py:r16")


def test_config_json_round_trip():
  from experiments.models.branches import config_from_dict, config_to_dict

  config = PKMConfig(**(SMALL | {"gated": True, "value_dim": 12}))
  d = json.loads(json.dumps(config_to_dict(config)))
  assert d["kind"] == "pkm" and config_from_dict(d) == config
