"""Engram arm: hashing against a Python loop, segments, a per-position reference
(values and gradients), the branch contract, decode state, metrics, config."""

import dataclasses
import math

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
from tree_checks import relative_to_reference

from experiments.models.arms import engram
from experiments.models.branches import BranchContext

# Tiny primes (>= 31) so that heads collide and rows repeat within a test row.
CONFIG = engram.EngramConfig(d_model=16, orders=(2, 3), heads=2, head_dim=4, table_base=31,
                             init_std=0.3, table_init_std=1.0)


def _wrap32(v: int) -> int:
  return (v + 2**31) % 2**32 - 2**31


def _fold(i: int) -> int:
  return i + 32 if 65 <= i <= 90 else i


def loop_rows(config, multipliers, primes, offsets, tokens, segment_ids=None, valid=None):
  """Global rows [B, T, |N|·H] by a Python loop over positions, int32 wrap emulated."""
  tokens = np.asarray(tokens)
  B, T = tokens.shape
  seg = np.zeros((B, T), int) if segment_ids is None else np.asarray(segment_ids)
  ok = np.ones((B, T), bool) if valid is None else np.asarray(valid, bool)
  H = config.heads
  out = np.zeros((B, T, len(config.orders) * H), np.int64)
  for b in range(B):
    for t in range(T):
      for i, n in enumerate(config.orders):
        h = 0
        for k in range(n):
          s = t - k
          same = s >= 0 and seg[b, s] == seg[b, t] and ok[b, s]
          tok = int(tokens[b, s]) if same else config.pad_id
          tok = _fold(tok) if config.case_fold and same else tok
          h ^= _wrap32(tok * multipliers[k])
        for j in range(H):
          out[b, t, i * H + j] = offsets[i * H + j] + h % primes[i][j]
  return out


def make_branch(config=CONFIG, seed=0, live=True):
  branch = engram.Engram(config, rngs=nnx.Rngs(seed))
  if live:  # every parameter away from its init, the zero-init conv taps included
    keys = iter(jax.random.split(jax.random.key(seed + 100), 8))
    for name in ("b_k", "b_v", "conv_kernel"):
      p = getattr(branch, name)
      p[...] = 0.3 * jax.random.normal(next(keys), p.shape)
    for name in ("k_norm", "q_norm", "conv_norm"):
      p = getattr(branch, name)
      p[...] = 1.0 + 0.2 * jax.random.normal(next(keys), p.shape)
  return branch


def reference(params, config, multipliers, primes, offsets, x, tokens, segment_ids=None,
              valid=None):
  """The module docstring's equations written out: rows and conv taps by Python
  loops over positions, the per-position maths on [B, T] arrays."""
  rows = loop_rows(config, multipliers, primes, offsets, tokens, segment_ids, valid)
  B, T, D = x.shape
  seg = np.zeros((B, T), int) if segment_ids is None else np.asarray(segment_ids)
  ok = np.ones((B, T), bool) if valid is None else np.asarray(valid, bool)

  def rms(v, scale):
    return v / jnp.sqrt(jnp.mean(v * v, -1, keepdims=True) + config.eps) * scale

  e = params["tables"][0][rows].reshape(B, T, -1)                  # concat over heads
  key = rms(e @ params["w_k"] + params["b_k"], params["k_norm"])
  query = rms(x, params["q_norm"])
  s = jnp.sum(query * key, -1) / math.sqrt(D)
  g = jax.nn.sigmoid(jnp.sign(s) * jnp.sqrt(jnp.maximum(jnp.abs(s), 1e-6)))
  v = g[..., None] * (e @ params["w_v"] + params["b_v"])
  conv_in = rms(v, params["conv_norm"]) * ok[..., None]
  # Tap i of position t reads t - (W-1-i)·dilation if it is in t's segment.
  W, dil = config.conv_kernel, config.max_order
  src = np.zeros((B, T, W), int)
  tap_ok = np.zeros((B, T, W), bool)
  for b, t, i in np.ndindex(B, T, W):
    s_ = t - (W - 1 - i) * dil
    if s_ >= 0 and seg[b, s_] == seg[b, t]:
      src[b, t, i], tap_ok[b, t, i] = s_, True
  taps = conv_in[np.arange(B)[:, None, None], src] * tap_ok[..., None]   # [B, T, W, D]
  conv = jnp.sum(taps * params["conv_kernel"], axis=2)
  return (v + jax.nn.silu(conv)) * ok[..., None]


def _consts(branch):
  return branch.multipliers, branch.primes, branch.offsets


# --- hashing -------------------------------------------------------------------


def test_hashes_equal_python_loop_with_int32_wraparound():
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 257, size=(3, 10)).astype(np.int32)
  ids[0, :4] = 256                                    # pad ids in the window
  window = engram.window_ids(jnp.asarray(ids), 3, 256)
  # Multipliers near int32_max: every product overflows and wraps.
  mults = (2**31 - 1, 2**31 - 3, 1_999_999_973)
  primes = ((31, 37), (41, 43))
  got = np.asarray(engram.ngram_hashes(window, (2, 3), mults, primes))
  cfg = dataclasses.replace(CONFIG, case_fold=False)
  want = loop_rows(cfg, mults, primes, (0, 0, 0, 0), ids)
  np.testing.assert_array_equal(got, want)
  assert got.min() >= 0
  assert any(_wrap32(256 * m) != 256 * m for m in mults)   # the case really wraps


def test_module_rows_equal_python_loop_case_folded():
  branch = make_branch(live=False)
  tokens = jnp.asarray([[72, 105, 33, 104, 73, 0, 255, 90, 122],
                        [65, 97, 65, 97, 66, 98, 66, 98, 10]], jnp.int32)
  rows = branch.rows(tokens)
  want = loop_rows(CONFIG, *_consts(branch), tokens)
  np.testing.assert_array_equal(np.asarray(rows), want)
  # 'AaA' and 'aAa' hash alike: case folding is the canonical map.
  np.testing.assert_array_equal(np.asarray(rows[1, 3]), np.asarray(rows[1, 2]))


def test_primes_distinct_per_head_and_multipliers_bounded():
  cfg = engram.EngramConfig(d_model=8, orders=(2, 3, 4), heads=5, table_base=1000)
  primes = [p for order in engram.head_primes(cfg) for p in order]
  assert len(set(primes)) == len(primes) == 15
  assert min(primes) >= 1000 and all(engram._is_prime(p) for p in primes)
  assert primes == sorted(primes)
  mults = engram.hash_multipliers(cfg)
  assert len(mults) == 4 and all(m % 2 == 1 for m in mults)
  assert all(m * cfg.pad_id <= 2**31 - 1 for m in mults)
  assert engram.hash_multipliers(dataclasses.replace(cfg, hash_seed=1)) != mults
  offsets = engram.head_offsets(engram.head_primes(cfg))
  assert offsets[0] == 0 and offsets[-1] == sum(primes[:-1])


def test_no_ngram_crosses_a_segment():
  branch = make_branch(live=False)
  _, tokens = random_inputs(16, batch=2, length=10, seed=3)
  split = 4
  seg = jnp.broadcast_to((jnp.arange(10) >= split).astype(jnp.int32), tokens.shape)
  packed = branch.rows(tokens, segment_ids=seg)
  first = branch.rows(tokens[:, :split])
  second = branch.rows(tokens[:, split:])
  np.testing.assert_array_equal(np.asarray(packed[:, :split]), np.asarray(first))
  np.testing.assert_array_equal(np.asarray(packed[:, split:]), np.asarray(second))
  window = engram.window_ids(tokens, 3, 256, segment_ids=seg)
  np.testing.assert_array_equal(np.asarray(window[:, split, 1:]), 256)
  np.testing.assert_array_equal(np.asarray(window[:, split + 1, 2]), 256)


# --- the forward against the reference, values and gradients ---------------------


def test_forward_equals_reference_values_and_gradients():
  branch = make_branch()
  x, tokens = random_inputs(16, batch=2, length=10, seed=1)
  seg = jnp.asarray([[0] * 4 + [1] * 6, [0] * 10], jnp.int32)
  valid = jnp.asarray([[True] * 8 + [False] * 2, [True] * 10])
  ctx = BranchContext(tokens_BxT=tokens, segment_ids_BxT=seg, valid_BxT=valid)
  graphdef, state = nnx.split(branch, nnx.Param)
  params = nnx.to_pure_dict(state)
  probe = jax.random.normal(jax.random.key(7), x.shape)

  def model_fn(params, x):
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state).forward(x, ctx)[0]

  def ref_fn(params, x):
    return reference(params, CONFIG, *_consts(branch), x, tokens, seg, valid)

  def value_and_vjp(fn):
    @jax.jit
    def run(params, x):
      y, pullback = jax.vjp(fn, params, x)
      return y, pullback(probe)
    return run(params, x)

  y, g = value_and_vjp(model_fn)
  y_ref, g_ref = value_and_vjp(ref_fn)
  chex.assert_trees_all_close(y, y_ref, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(y_ref).max()) > 0.1
  for path, b in jax.tree_util.tree_leaves_with_path(g_ref):
    assert float(jnp.abs(b).max()) > 0, jax.tree_util.keystr(path)
  # Each gradient against its own scale: |a - b| <= 1e-5·max|b| + 1e-4·|b|.
  chex.assert_trees_all_close(*relative_to_reference(g, g_ref), rtol=1e-4, atol=1e-5)


# --- the branch contract ----------------------------------------------------------


@pytest.fixture(scope="module")
def live():
  return make_branch(seed=2)


def test_causal(live):
  x, tokens = random_inputs(16, length=12, seed=4)
  assert_causal(live, x, tokens, atol=1e-7)


def test_segments_independent(live):
  x, tokens = random_inputs(16, length=12, seed=5)
  assert_segments_independent(live, x, tokens, split=5)


def test_decode_matches_forward(live):
  x, tokens = random_inputs(16, length=14, seed=6)
  assert_decode_matches_forward(live, x, tokens, prompt=5)


def test_decode_from_empty_state(live):
  x, tokens = random_inputs(16, length=12, seed=7)
  assert_decode_from_empty_state(live, x, tokens)


def test_zero_at_init_with_zero_init():
  branch = engram.Engram(dataclasses.replace(CONFIG, zero_init=True), rngs=nnx.Rngs(0))
  x, tokens = random_inputs(16, length=8, seed=8)
  assert_zero_at_init(branch, x, tokens)
  # The original's value projection is random: nonzero at init.
  assert float(jnp.abs(engram.Engram(CONFIG, rngs=nnx.Rngs(0)).forward(
      x, BranchContext(tokens_BxT=tokens))[0]).max()) > 0


def test_prefill_of_ragged_packed_prompts_then_decode(live):
  """Rows of different lengths, row 0 packing two segments: decoding after the
  prefill continues each row's last segment exactly as the parallel forward."""
  x, tokens = random_inputs(16, batch=2, length=14, seed=9)
  lengths = jnp.asarray([7, 4], jnp.int32)
  T = 9                                        # the right-padded prompt slab
  seg = jnp.asarray([[0, 0, 1, 1, 1, 1, 1, 0, 0], [0] * T], jnp.int32)
  ctx = BranchContext(tokens_BxT=tokens[:, :T], segment_ids_BxT=seg,
                      valid_BxT=jnp.arange(T)[None] < lengths[:, None], lengths_B=lengths)
  y_prompt, state = live.prefill(x[:, :T], ctx)
  seg_full = jnp.asarray([[0, 0] + [1] * 12, [0] * 14], jnp.int32)
  ref = live.forward(x, BranchContext(tokens_BxT=tokens, segment_ids_BxT=seg_full))[0]
  np.testing.assert_allclose(np.asarray(y_prompt[0, :7]), np.asarray(ref[0, :7]), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(np.asarray(y_prompt[1, :4]), np.asarray(ref[1, :4]), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_array_equal(np.asarray(y_prompt[1, 4:]), 0.0)   # padding adds nothing
  step = nnx.jit(lambda b, xt, s, tok: b.decode_step(xt, s, BranchContext(tokens_BxT=tok)))
  rows = jnp.arange(2)
  for i in range(5):
    pos = lengths + i
    y, state = step(live, x[rows, pos][:, None], state, tokens[rows, pos][:, None])
    np.testing.assert_allclose(np.asarray(y[:, 0]), np.asarray(ref[rows, pos]), rtol=1e-5,
                               atol=1e-6, err_msg=f"step {i}")


# --- metrics, counts, config --------------------------------------------------------


def test_metric_sums_and_slot_usage(live):
  x, tokens = random_inputs(16, length=10, seed=10)
  valid = jnp.ones((2, 10), bool).at[1, 6:].set(False)
  y, aux = live.forward(x, BranchContext(tokens_BxT=tokens, valid_BxT=valid))
  assert 0 < float(aux["metric/gate_mean"]) < 1
  sums = live.metric_sums(aux, valid)
  rows = np.asarray(aux["rows"])
  for i, n in enumerate(CONFIG.orders):
    read = np.zeros(sum(live.primes[i]))
    first = live.offsets[i * CONFIG.heads]
    for b, t, h in np.ndindex(2, 10, CONFIG.heads):
      if valid[b, t]:
        read[rows[b, t, i * CONFIG.heads + h] - first] = 1
    np.testing.assert_array_equal(np.asarray(sums[f"read_o{n}_max"]), read)
  summary = engram.Engram.summarise_metrics({k: np.asarray(v) for k, v in sums.items()})
  for n in CONFIG.orders:
    assert summary[f"slot_usage_o{n}"] == pytest.approx(
        np.mean(np.asarray(sums[f"read_o{n}_max"]) > 0))
  assert 0 < summary["slot_usage"] < 1


def test_param_count_matches_module():
  for cfg in (CONFIG, engram.EngramConfig(d_model=24, orders=(2, 3, 4), heads=3, head_dim=8,
                                          table_base=101, conv_kernel=3)):
    branch = engram.Engram(cfg, rngs=nnx.Rngs(0))
    n = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(branch, nnx.Param)))
    count = engram.param_count(cfg)
    assert count["total"] == n
    assert count["tables"] == branch.tables[0].shape[0] * cfg.head_dim
    assert count["active"] == count["dense"] + cfg.memory_dim
    assert count["total"] == count["tables"] + count["dense"]


@pytest.mark.parametrize("field,value", [
    ("d_model", 0), ("orders", (3, 2)), ("orders", (1, 2)), ("orders", ()), ("heads", 0),
    ("head_dim", -1), ("table_base", 1), ("vocab_size", 0), ("hash_seed", -1),
    ("conv_kernel", 0), ("eps", 0.0), ("init_std", -1.0), ("table_init_std", float("nan")),
    ("case_fold", 1), ("zero_init", "no"), ("table_base", 2**28), ("dtype", "float99")])
def test_config_rejects_bad_field(field, value):
  with pytest.raises(ValueError, match=f"EngramConfig: {field}="):
    dataclasses.replace(CONFIG, **{field: value})


def test_missing_tokens_is_an_error(live):
  x, _ = random_inputs(16, length=4)
  with pytest.raises(ValueError, match="tokens_BxT"):
    live.forward(x, BranchContext())


# --- inside the decoder ------------------------------------------------------------


def test_decoder_lm_with_engram_round_trips_and_decodes():
  from experiments.models.config import LMConfig
  from experiments.models.lm import DecoderLM

  arm = engram.EngramConfig(d_model=16, heads=2, head_dim=4, table_base=37)
  config = LMConfig(d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32,
                    max_len=16, memory=arm, memory_layers=(1,))
  assert LMConfig.from_dict(config.to_dict()) == config
  assert config.to_dict()["memory"]["kind"] == "engram"
  model = DecoderLM(config, rngs=nnx.Rngs(0))
  assert isinstance(model.blocks[1].memory, engram.Engram)
  model.blocks[1].memory.conv_kernel[...] = 0.3 * jax.random.normal(
      jax.random.key(1), model.blocks[1].memory.conv_kernel.shape)
  _, tokens = random_inputs(16, batch=2, length=10, seed=11)
  logits, aux = nnx.jit(lambda m, tok: m(tok, return_aux=True))(model, tokens)
  assert aux["memory/1/rows"].shape == (2, 10, 4)
  _, cache = nnx.jit(lambda m, tok: m.prefill(tok, cache_len=16))(model, tokens[:, :6])
  decode = nnx.jit(lambda m, tok, c: m.decode_step(tok, c))
  for t in range(6, 10):
    step, cache = decode(model, tokens[:, t:t + 1], cache)
    np.testing.assert_allclose(np.asarray(step), np.asarray(logits[:, t]), rtol=1e-5,
                               atol=1e-5)


def test_config_file_sizes_like_lngram_r16_and_args():
  import json

  import lngram_jax
  from experiments.configs import load_config
  from experiments.models.config import LMConfig, lm_config

  def model(arg=""):
    return lm_config(load_config(f"experiments/configs/lm_engram.py:{arg}"))

  m = model()
  lngram = lm_config(load_config("experiments/configs/lm_lngram.py")).memory
  ours, theirs = engram.param_count(m.memory), lngram_jax.param_count(lngram)
  assert m.memory_layers == (1, 2) and isinstance(m.memory, engram.EngramConfig)
  for key in ("total", "active"):   # per layer, within 2% of Lngram v2 r16
    assert abs(ours[key] / theirs[key] - 1) < 0.02, (key, ours, theirs)
  for arg in ("smoke", "zeroinit,nofold,base4099", "smoke,zeroinit"):
    lm = model(arg)
    assert LMConfig.from_dict(json.loads(json.dumps(lm.to_dict()))) == lm
  assert model("zeroinit,nofold,base4099").memory == dataclasses.replace(
      m.memory, zero_init=True, case_fold=False, table_base=4099)
  assert model("smoke").memory_layers == (1,)
  with pytest.raises(ValueError, match="lm_engram: unknown config arg"):
    model("bogus")
