"""Property tests (hypothesis) of config validation: the CLI overrides, LMConfig, LngramConfig.

Every draw, valid or not, either builds (and a tiny model runs one forward)
or raises the project's own error, a ValueError naming a drawn field; never
a TypeError, ZeroDivisionError or a failure deep inside the model.
"""

import math

import jax.numpy as jnp
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from experiments import cli  # noqa: E402
from experiments.configs import load_config  # noqa: E402
from experiments.models.config import lm_config  # noqa: E402
from experiments.train.task import check_experiment_config  # noqa: E402
from lngram_jax.config import LngramConfig  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

# CLI-style override texts per field of the lm_lngram smoke config: valid small
# values, out-of-range numbers, wrong types, and texts that do not parse.
OVERRIDES = {
    "model.d_model": ["16", "32", "0", "-4", "x", "32.5"],
    "model.n_layers": ["1", "2", "0"],
    "model.n_heads": ["1", "2", "3", "0"],
    "model.n_kv_heads": ["1", "2", "0"],
    "model.head_dim": ["8", "16", "7", "0"],
    "model.ffn_dim": ["16", "0", "-1"],
    "model.max_len": ["16", "32", "8", "0"],
    "model.rope_theta": ["10000", "0", "-1", "nan"],
    "model.norm_eps": ["1e-6", "0", "-1e-6"],
    "model.dtype": ["float32", "bfloat16", "int8", "floaty"],
    "model.memory_layers": ["(0,)", "(1,)", "()", "(5,)", "(0, 0)", "(-1,)", "1"],
    "model.memory.kind": ["lngram", "pvm", "nope"],
    "model.memory.routes": ["1", "2", "4", "0", "-1", "lots"],
    "model.memory.bits": ["1", "2", "0", "9"],
    "model.memory.orders": ["(2,)", "(1, 2)", "(3, 2)", "()", "(0,)", "2"],
    "model.memory.mem_dim": ["4", "8", "0"],
    "model.memory.q_heads": ["1", "2", "0"],
    "model.memory.kv_heads": ["1", "2", "0"],
    "model.memory.head_dim": ["8", "16", "0"],
    "model.memory.sink_mass": ["0.5", "0.1", "0", "1", "nan", "-0.5"],
    "model.memory.surrogate": ["exact", "ste", "none", "bogus"],
    "model.memory.readout": ["absorbed", "literal", "streaming", "nope"],
    "data.seq_len": ["8", "16", "0", "-3", "4096"],
    "data.batch_size": ["1", "2", "0", "-2"],
    "data.val_fraction": ["0.05", "0", "1", "-0.1"],
    "optim.lr": ["1e-3", "0", "-1", "inf", "nan"],
    "optim.warmup_steps": ["0", "2", "-1"],
    "optim.b1": ["0.9", "1.0", "-0.1"],
    "train.steps": ["1", "0", "-5"],
    "train.eval_every": ["1", "0"],
    "train.ckpt_every": ["1", "-1"],
    "train.stepz": ["5"],                 # an unknown field
}


@st.composite
def overrides(draw):
  fields = draw(st.lists(st.sampled_from(sorted(OVERRIDES)), max_size=5, unique=True))
  return [(f, draw(st.sampled_from(OVERRIDES[f]))) for f in fields]


def _names_a_field(message: str, fields) -> bool:
  return any(f in message or f.rsplit(".", 1)[-1] in message for f in fields)


def _forward(model_config):
  from flax import nnx

  from experiments.models import DecoderLM
  model = DecoderLM(model_config, rngs=nnx.Rngs(0))
  T = min(8, model_config.max_len)
  logits = model(jnp.arange(T, dtype=jnp.int32)[None] % model_config.vocab_size)
  assert logits.shape == (1, T, model_config.vocab_size)
  assert bool(jnp.isfinite(logits).all())


@SETTINGS
@given(overrides())
def test_cli_overrides_build_or_name_the_field(drawn):
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  try:
    cli.apply_overrides(config, drawn)
    check_experiment_config(config)
    model_config = lm_config(config)
  except ValueError as e:
    assert _names_a_field(str(e), [f for f, _ in drawn]), (drawn, str(e))
    return
  _forward(model_config)


# Python values straight into LngramConfig: ints, floats (nan, inf), bools, None.
_ANY = st.one_of(st.integers(-3, 9), st.floats(allow_nan=True, allow_infinity=True),
                 st.booleans(), st.none())
LNGRAM_FIELDS = {
    "routes": st.one_of(st.integers(1, 4), _ANY),
    "bits": st.one_of(st.integers(1, 3), _ANY),
    "orders": st.one_of(st.sampled_from([(1,), (2,), (1, 2), (2, 3)]),
                        st.lists(st.integers(-1, 4), max_size=3).map(tuple), _ANY),
    "mem_dim": st.one_of(st.integers(1, 8), _ANY),
    "kv_heads": st.one_of(st.sampled_from([1, 2]), _ANY),
    "sink_mass": st.one_of(st.floats(0.05, 0.95), _ANY),
    "surrogate_tau": st.one_of(st.floats(0.1, 2.0), _ANY),
    "surrogate_scale": st.one_of(st.floats(0.1, 2.0), _ANY),
    "conv_kernel": st.one_of(st.integers(1, 4), _ANY),
    "conv_dilation": st.one_of(st.none(), st.integers(1, 3), _ANY),
    "route_chunk": st.one_of(st.integers(1, 8), _ANY),
    "eps": st.one_of(st.floats(1e-8, 1e-3), _ANY),
    "init_std": st.one_of(st.floats(1e-3, 0.1), _ANY),
    "table_init_std": st.one_of(st.floats(1e-3, 0.1), _ANY),
}


def some_fields(strategies):
  """Up to 4 of the named fields, each drawn from its strategy."""
  @st.composite
  def draw_fields(draw):
    names = draw(st.lists(st.sampled_from(sorted(strategies)), max_size=4, unique=True))
    return {n: draw(strategies[n]) for n in names}
  return draw_fields()


@SETTINGS
@given(some_fields(LNGRAM_FIELDS))
def test_lngram_config_builds_or_names_the_field(fields):
  base = dict(d_model=16, routes=2, bits=2, orders=(1, 2), mem_dim=4, q_heads=2,
              kv_heads=1, head_dim=8)
  try:
    config = LngramConfig(**(base | fields))
  except ValueError as e:
    assert _names_a_field(str(e), fields), (fields, str(e))
    return
  # A valid draw holds finite, sensible numbers and runs in a tiny decoder.
  for name in ("sink_mass", "surrogate_tau", "surrogate_scale", "eps", "init_std",
               "table_init_std"):
    assert math.isfinite(getattr(config, name)), (name, config)
  from experiments.models.config import LMConfig
  _forward(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=16,
                    max_len=16, memory_layers=(0,), memory=config))


LM_FIELDS = {
    "d_model": st.one_of(st.sampled_from([16]), _ANY),
    "n_layers": st.one_of(st.integers(1, 2), _ANY),
    "n_heads": st.one_of(st.sampled_from([1, 2, 4]), _ANY),
    "n_kv_heads": st.one_of(st.sampled_from([1, 2]), _ANY),
    "head_dim": st.one_of(st.sampled_from([4, 8]), _ANY),
    "ffn_dim": st.one_of(st.integers(1, 16), _ANY),
    "max_len": st.one_of(st.integers(8, 16), _ANY),
    "rope_theta": st.one_of(st.floats(10.0, 1e4), _ANY),
    "norm_eps": st.one_of(st.floats(1e-8, 1e-3), _ANY),
    "init_std": st.one_of(st.floats(1e-3, 0.1), _ANY),
    "tie_embeddings": st.one_of(st.booleans(), _ANY),
    "remat": st.one_of(st.booleans(), _ANY),
    "memory_layers": st.one_of(st.sampled_from([(), (0,)]),
                               st.lists(st.integers(-1, 3), max_size=2).map(tuple), _ANY),
    "dtype": st.one_of(st.sampled_from(["float32", "bfloat16", "int32", "nope"]), _ANY),
}


@SETTINGS
@given(some_fields(LM_FIELDS))
def test_lm_config_builds_or_names_the_field(fields):
  from experiments.models.config import LMConfig
  memory = LngramConfig(d_model=16, routes=2, bits=2, orders=(1, 2), mem_dim=4, q_heads=2,
                        kv_heads=1, head_dim=8)
  base = dict(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=16,
              max_len=16, memory_layers=(0,), memory=memory)
  try:
    config = LMConfig(**(base | fields))
  except ValueError as e:
    assert _names_a_field(str(e), fields), (fields, str(e))
    return
  for name in ("rope_theta", "norm_eps", "init_std"):
    assert math.isfinite(getattr(config, name)), (name, config)
  _forward(config)
