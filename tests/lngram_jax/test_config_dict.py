"""LngramConfig.to_dict / from_dict: the JSON form checkpoints store."""

import json

import jax.numpy as jnp
import pytest

from lngram_jax import LngramConfig


def test_round_trip_through_json_keeps_every_field():
  config = LngramConfig(d_model=64, routes=8, bits=3, orders=(1, 3), mem_dim=16, q_heads=4,
                        kv_heads=2, head_dim=16, surrogate="exact", readout="streaming",
                        dtype=jnp.bfloat16, param_dtype=jnp.float32, sink_mass=0.3)
  text = json.dumps(config.to_dict())
  restored = LngramConfig.from_dict(json.loads(text))
  assert restored == config
  assert restored.orders == (1, 3) and jnp.dtype(restored.dtype) == jnp.bfloat16


def test_unknown_field_is_an_error():
  d = LngramConfig(d_model=64, q_heads=4, head_dim=16).to_dict()
  d["typo_field"] = 1
  with pytest.raises(ValueError, match="unknown fields.*typo_field"):
    LngramConfig.from_dict(d)


def test_invalid_values_are_validated_on_load():
  d = LngramConfig(d_model=64, q_heads=4, head_dim=16).to_dict()
  d["sink_mass"] = 1.5
  with pytest.raises(ValueError, match="sink_mass"):
    LngramConfig.from_dict(d)
