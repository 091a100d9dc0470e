"""The opt-in `optim.freeze` (frozen-by-name, the random-router control) and
`optim.gate_lr_mult` (the branch gate's own learning rate) of the one optimiser."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.trainer import optimizer as optim_lib


def _params():
  return {"embed": {"table": jnp.ones((4, 2))},
          "blocks": {0: {"attn": {"w_q": jnp.ones((2, 2))},
                         "ffn_branch": {"gate": jnp.ones(()), "w_in": jnp.ones((2, 2))},
                         "memory": {"router_w": jnp.ones((2, 4)),
                                    "tables": {0: jnp.ones((8, 2))},
                                    "w_o": jnp.ones((2, 2))}}}}


def _optim(**kw):
  return ml_collections.ConfigDict(dict(
      lr=1e-2, table_lr_mult=4.0, weight_decay=0.0, b1=0.9, b2=0.95, eps=1e-12,
      warmup_steps=0, min_lr_ratio=1.0, clip_norm=1e9, **kw))


def _two_steps(optim):
  params = _params()
  tx = optim_lib.make_optimizer(optim, params, total_steps=10)
  state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  for _ in range(2):
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  return params


def test_defaults_leave_the_groups_as_they_were():
  params = _params()
  assert optim_lib.param_labels(params) == optim_lib.param_labels(
      params, optim=_optim(freeze=(), gate_lr_mult=0.0))


def test_frozen_router_stays_bit_identical_and_the_rest_trains():
  labels = optim_lib.param_labels(_params(), optim=_optim(freeze="router_w"))
  assert labels["blocks"][0]["memory"]["router_w"] == optim_lib.FROZEN
  assert labels["blocks"][0]["memory"]["w_o"] == "decay"
  out = _two_steps(_optim(freeze=("router_w",)))
  np.testing.assert_array_equal(out["blocks"][0]["memory"]["router_w"], 1.0)
  # Everything else moved by 2 Adam steps of lr 1e-2 (m/sqrt(v) = 1 with constant grads).
  np.testing.assert_allclose(out["blocks"][0]["memory"]["w_o"], 1 - 2e-2, rtol=1e-5)
  np.testing.assert_allclose(out["blocks"][0]["attn"]["w_q"], 1 - 2e-2, rtol=1e-5)
  sizes = optim_lib.group_sizes(_params(), optim=_optim(freeze="router_w"))
  assert sizes[optim_lib.FROZEN] == 8


def test_freeze_of_an_unknown_name_is_refused():
  with pytest.raises(ValueError, match="optim.freeze"):
    optim_lib.make_optimizer(_optim(freeze="no_such"), _params(), total_steps=10)


def test_gate_group_takes_its_own_learning_rate():
  labels = optim_lib.param_labels(_params(), optim=_optim(gate_lr_mult=10.0))
  assert labels["blocks"][0]["ffn_branch"]["gate"] == "gate"
  assert labels["blocks"][0]["ffn_branch"]["w_in"] == "decay"
  out = _two_steps(_optim(gate_lr_mult=10.0))
  np.testing.assert_allclose(out["blocks"][0]["ffn_branch"]["gate"], 1 - 2e-1, rtol=1e-5)
  np.testing.assert_allclose(out["blocks"][0]["ffn_branch"]["w_in"], 1 - 2e-2, rtol=1e-5)
  assert optim_lib.group_sizes(_params(), optim=_optim(gate_lr_mult=10.0))["gate"] == 1
