"""The opt-in backbone learning-rate group of the one optimiser (pretrained-backbone recipe)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.trainer import optimizer as optim_lib


def _params():
  return {"embed": {"table": jnp.ones((4, 2))},
          "final_norm": {"scale": jnp.ones(2)},
          "blocks": {0: {"attn_norm": {"scale": jnp.ones(2)},
                         "attn": {"w_q": jnp.ones((2, 2))},
                         "ffn_branch": {"w_in": jnp.ones((2, 2))},
                         "memory": {"router_w": jnp.ones((2, 4)),
                                    "tables": {0: jnp.ones((8, 2))},
                                    "w_o": jnp.ones((2, 2))}}}}


def _optim(**kw):
  return ml_collections.ConfigDict(dict(
      lr=1e-2, table_lr_mult=4.0, weight_decay=0.5, b1=0.9, b2=0.95, eps=1e-12,
      warmup_steps=0, min_lr_ratio=1.0, clip_norm=1e9, **kw))


def _first_update(optim):
  params = _params()
  tx = optim_lib.make_optimizer(optim, params, total_steps=10)
  grads = jax.tree.map(jnp.ones_like, params)
  return jax.jit(tx.update)(grads, tx.init(params), params)[0]


def test_backbone_groups_only_when_asked():
  params = _params()
  assert optim_lib.param_labels(params) == optim_lib.param_labels(params, optim=_optim())
  assert optim_lib.param_labels(params, optim=_optim(backbone_lr=0.0)) == (
      optim_lib.param_labels(params))
  labels = optim_lib.param_labels(params, optim=_optim(backbone_lr=1e-3))
  block = labels["blocks"][0]
  assert labels["embed"]["table"] == block["attn"]["w_q"] == "backbone"
  assert labels["final_norm"]["scale"] == block["attn_norm"]["scale"] == "backbone_no_decay"
  assert block["memory"]["tables"][0] == "table"
  # The branches' other parameters: the base rate, no weight decay (Table 13).
  assert block["memory"]["w_o"] == block["memory"]["router_w"] == "no_decay"
  assert block["ffn_branch"]["w_in"] == "no_decay"
  sizes = optim_lib.group_sizes(params, optim=_optim(backbone_lr=1e-3))
  assert sizes == {"decay": 0, "no_decay": 16, "table": 16, "backbone": 12,
                   "backbone_no_decay": 4}


def test_backbone_lr_and_weight_decay_in_the_first_step():
  # First Adam step: m/sqrt(v) = 1, so update = -lr·(1 + wd·p) with p = 1.
  same = _first_update(_optim())
  np.testing.assert_allclose(same["blocks"][0]["attn"]["w_q"], -1.5e-2, rtol=1e-5)
  np.testing.assert_allclose(same["blocks"][0]["memory"]["w_o"], -1.5e-2, rtol=1e-5)
  up = _first_update(_optim(backbone_lr=1e-3))
  np.testing.assert_allclose(up["blocks"][0]["attn"]["w_q"], -1.5e-3, rtol=1e-5)
  np.testing.assert_allclose(up["embed"]["table"], -1.5e-3, rtol=1e-5)
  np.testing.assert_allclose(up["blocks"][0]["attn_norm"]["scale"], -1e-3, rtol=1e-5)
  np.testing.assert_allclose(up["blocks"][0]["memory"]["w_o"], -1e-2, rtol=1e-5)
  np.testing.assert_allclose(up["blocks"][0]["memory"]["tables"][0], -4e-2, rtol=1e-5)


def test_each_group_decays_to_its_own_minimum():
  optim = _optim(backbone_lr=1e-3, backbone_min_lr_ratio=0.5, table_min_lr_ratio=0.25)
  optim.min_lr_ratio = 0.1
  end = lambda **kw: float(optim_lib.learning_rate_schedule(optim, 10, **kw)(10))  # noqa: E731
  assert np.isclose(end(), 1e-3)                                  # base: 1e-2 -> 1e-3
  assert np.isclose(end(multiplier=4.0, min_ratio=optim.table_min_lr_ratio), 1e-2)
  assert np.isclose(end(peak=1e-3, min_ratio=optim.backbone_min_lr_ratio), 5e-4)
