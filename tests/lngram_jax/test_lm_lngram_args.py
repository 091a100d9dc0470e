"""The Lngram v2 variants' args of experiments/configs/lm_lngram.py: nosink and the
Table-3-style m<bits>, kv<heads>, mem<dim> (the paper names its rows r23/m4/KV8/mem256)."""

import pytest

from experiments.configs import load_config
from experiments.models.config import LMConfig, lm_config


def _memory(arg):
  return lm_config(load_config(f"experiments/configs/lm_lngram.py:{arg}")).memory


def test_defaults_keep_the_sink_and_heads_times_dim_equal_to_d():
  memory = _memory("")
  assert memory.sink and (memory.bits, memory.kv_heads, memory.mem_dim) == (4, 2, 32)
  assert memory.q_heads * memory.head_dim == memory.d_model


def test_nosink():
  assert not _memory("nosink").sink
  assert not _memory("smoke,nosink").sink


def test_table3_style_args():
  memory = _memory("r23,m5,kv4,mem64,exact")
  assert (memory.routes, memory.bits, memory.kv_heads) == (23, 5, 4)
  # head_dim follows mem_dim as in the paper: Hq·Dh = 4·64 = 256 ≠ d = 128.
  assert (memory.mem_dim, memory.head_dim, memory.q_heads, memory.d_model) == (64, 64, 4, 128)
  assert memory.surrogate == "exact" and memory.sink
  model = lm_config(load_config("experiments/configs/lm_lngram.py:r23,m5,kv4,mem64,nosink"))
  assert LMConfig.from_dict(model.to_dict()) == model


@pytest.mark.parametrize("arg,match", [
    ("mx", "unknown config arg 'mx'"),
    ("kv", "unknown config arg 'kv'"),
    ("sink", "unknown config arg 'sink'"),
])
def test_bad_args_are_named(arg, match):
  with pytest.raises(ValueError, match=match):
    load_config(f"experiments/configs/lm_lngram.py:{arg}")


def test_kv_heads_that_do_not_divide_the_query_heads_are_named():
  with pytest.raises(ValueError, match="kv_heads=3"):
    _memory("kv3")
