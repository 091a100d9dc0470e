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

from experiments.cli.overrides import config_from_command_line  # noqa: E402
from experiments.jobs.checks import check_experiment_config  # noqa: E402
from experiments.models.config import lm_config  # noqa: E402
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
  try:
    config = config_from_command_line("experiments/configs/lm_lngram.py:smoke", drawn)
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


# --- the layer's and decode's inputs: shapes, dtypes, masks, lengths, NaN at padding ---

LAYER = LngramConfig(d_model=8, routes=2, bits=2, orders=(1, 2), mem_dim=4, q_heads=2,
                     kv_heads=1, head_dim=4)
INPUT_SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])


def _live_layer():
  import jax
  from flax import nnx

  from lngram_jax.layer import LngramV2
  layer = LngramV2(LAYER, rngs=nnx.Rngs(0))
  k1, k2 = jax.random.split(jax.random.key(5))
  layer.w_o[...] = 0.5 * jax.random.normal(k1, layer.w_o.shape)
  layer.conv_kernel[...] = 0.5 * jax.random.normal(k2, layer.conv_kernel.shape)
  return layer


# Faults a draw may carry (at most one), and the input its error must name.
FAULTS = {"B=0": "h", "T=0": "h", "width": "h", "int h": "h", "list h": "h",
          "length > T": "lengths", "length < 0": "lengths", "float lengths": "lengths",
          "lengths shape": "lengths", "valid of 2s": "valid", "valid shape": "valid"}


@st.composite
def layer_inputs(draw):
  """A right-padded prompt h [B, T, 8] with lengths and a mask, maybe with one fault."""
  import numpy as np
  fault = draw(st.sampled_from([None] * 6 + sorted(FAULTS)))
  B, T = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 4, 6]))
  dtype = draw(st.sampled_from(["float32", "bfloat16"]))
  lengths = draw(st.one_of(st.none(), st.lists(st.integers(0, T), min_size=B, max_size=B)))
  valid_kind = draw(st.sampled_from(["none", "bool", "int01"]))
  nan_at_padding = draw(st.booleans())
  B = 0 if fault == "B=0" else B
  T = 0 if fault == "T=0" else T
  if fault in ("B=0", "T=0"):
    lengths = None
  h = np.random.default_rng(draw(st.integers(0, 3))).standard_normal(
      (B, T, 5 if fault == "width" else 8)).astype("int32" if fault == "int h" else dtype)
  t_T = np.arange(T)
  counts = lengths if lengths is not None else [T] * B
  valid = {"none": None, "bool": t_T[None] < np.asarray(counts).reshape(-1, 1),
           "int01": (t_T[None] < np.asarray(counts).reshape(-1, 1)).astype(np.int32)
           }[valid_kind]
  if fault in ("length > T", "length < 0", "float lengths", "lengths shape"):
    lengths = {"length > T": [T + 1] * B, "length < 0": [-1] * B,
               "float lengths": [float(T)] * B, "lengths shape": [T] * (B + 1)}[fault]
  if fault == "valid of 2s":
    valid = np.full((B, T), 2, np.int32)
  if fault == "valid shape":
    valid = np.ones((B, T + 1), bool)
  return dict(h=h.tolist() if fault == "list h" else h, lengths=lengths, valid=valid,
              nan_at_padding=nan_at_padding, fault=fault)


def _first_field(message: str) -> str:
  """The field an input error starts with: "h must ...", "lengths=[..] must ..."."""
  return message.split()[0].split("=")[0]


@INPUT_SETTINGS
@given(layer_inputs())
def test_layer_and_prefill_inputs_run_or_name_the_field(drawn):
  """A faulty draw raises a ValueError / TypeError whose message starts with the
  input at fault (never a ZeroDivisionError, AttributeError or an error from
  inside jax); a sound one runs: finite, zero at padding, equal to the layer,
  unchanged by NaN at padding, and one decode step continues it."""
  import numpy as np

  from lngram_jax.decode import lngram_decode_step, prefill_decode_state
  h, lengths, valid, fault = drawn["h"], drawn["lengths"], drawn["valid"], drawn["fault"]
  layer = _live_layer()
  if fault is not None:
    with pytest.raises((ValueError, TypeError)) as e:
      prefill_decode_state(layer, h, lengths=lengths, valid=valid)
    assert _first_field(str(e.value)) == FAULTS[fault], (fault, str(e.value))
    if FAULTS[fault] != "lengths":   # the layer itself refuses the same inputs
      with pytest.raises((ValueError, TypeError)) as e_layer:
        layer(h, valid=valid)
      assert _first_field(str(e_layer.value)) == FAULTS[fault], (fault, str(e_layer.value))
    return
  B, T = h.shape[:2]
  y, state = prefill_decode_state(layer, h, lengths=lengths, valid=valid)
  mask = (np.asarray(valid).astype(bool) if valid is not None
          else np.arange(T)[None] < np.asarray(lengths if lengths is not None else [T] * B)
          .reshape(-1, 1))
  assert bool(jnp.isfinite(y).all())
  np.testing.assert_array_equal(np.asarray(y, np.float32)[~mask], 0.0)
  np.testing.assert_array_equal(y, layer(jnp.asarray(h), valid=jnp.asarray(mask)))
  if drawn["nan_at_padding"] and not mask.all():
    h_nan = np.where(mask[..., None], h, np.nan).astype(h.dtype)
    y_nan, state_nan = prefill_decode_state(layer, h_nan, lengths=lengths, valid=valid)
    np.testing.assert_array_equal(y_nan, y)
    for a, b in zip(jax_leaves(state_nan), jax_leaves(state), strict=True):
      np.testing.assert_array_equal(a, b)
  y_next, _ = lngram_decode_step(layer, jnp.ones((B, 1, 8), h.dtype), state)
  assert y_next.shape == (B, 1, 8) and bool(jnp.isfinite(y_next).all())


def jax_leaves(tree):
  import jax
  return jax.tree_util.tree_leaves(tree)
