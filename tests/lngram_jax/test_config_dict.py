"""LngramConfig.to_dict / from_dict: the JSON form checkpoints store; the shared validators."""

import json

import jax.numpy as jnp
import pytest

from lngram_jax import LngramConfig
from lngram_jax import dataclass_json as dj


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


# --- the one dataclass <-> JSON helper (lngram_jax.dataclass_json) ---------------------

# What checkpoints written before the shared helper hold (json.dumps of
# `to_dict()`): they must load unchanged and be written again key for key.
SAVED_LNGRAM = (
    '{"d_model": 32, "routes": 4, "bits": 4, "orders": [1, 3], "mem_dim": 128, "q_heads": 4, '
    '"kv_heads": 2, "head_dim": 8, "sink_mass": 0.5, "sink": true, "surrogate": "onebit", '
    '"surrogate_tau": 1.0, "surrogate_scale": 1.0, "conv_kernel": 4, "conv_dilation": null, '
    '"readout": "absorbed", "route_chunk": 64, "dtype": "bfloat16", "param_dtype": "float32", '
    '"eps": 1e-06, "init_std": 0.02, "table_init_std": 0.02}')
def test_saved_lngram_json_loads_and_is_written_back_key_for_key():
  config = LngramConfig.from_dict(json.loads(SAVED_LNGRAM))
  assert config.orders == (1, 3) and jnp.dtype(config.dtype) == jnp.bfloat16
  assert json.dumps(config.to_dict()) == SAVED_LNGRAM


def test_an_integer_dtype_is_refused_up_front():
  """dtype=int32 used to fail only at call time, deep inside jax."""
  with pytest.raises(ValueError, match=r"LngramConfig: dtype='int32' is not one of"):
    LngramConfig(d_model=64, q_heads=4, head_dim=16, dtype=jnp.int32)


def test_shared_validators_name_the_owner_field_and_value():
  with pytest.raises(ValueError, match=r"^Owner: n=0 must be a positive int\.$"):
    dj.check_positive_int("Owner", "n", 0)
  with pytest.raises(ValueError, match=r"^Owner: n=4\.0 must be a positive int\.$"):
    dj.check_positive_int("Owner", "n", 4.0)
  with pytest.raises(ValueError, match=r"^Owner: x=nan must be a finite number\.$"):
    dj.check_finite("Owner", "x", float("nan"))
  with pytest.raises(ValueError, match=r"^Owner: x=0 must be a finite number > 0\.$"):
    dj.check_finite("Owner", "x", 0, above=0)
  with pytest.raises(ValueError, match=r"^Owner: b=1 must be a bool\.$"):
    dj.check_bool("Owner", "b", 1)
  with pytest.raises(ValueError, match=r"^Owner: dtype='floaty' is not a dtype\.$"):
    dj.as_dtype("Owner", "dtype", "floaty")
  dj.check_finite("Owner", "x", 0.5, above=0)
  assert dj.as_float_dtype("Owner", "dtype", "bfloat16") == jnp.bfloat16
