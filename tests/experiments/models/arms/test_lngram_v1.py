"""Lngram v1 arm: a direct transcription of its equations, lngram_jax reuse, contract."""

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

from experiments.models.arms.lngram_v1 import LngramV1, LngramV1Config, param_count
from experiments.models.branches import BranchContext
from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.lookup import surrogate_logit_grad

# d = 16 with 2-bit codes: R = 8 routes, C = 4 codes, tables of 8·4^n rows.
D, BITS, DM, B, T = 16, 2, 4, 2, 9


def live_branch(config, seed=1):
  """The branch with its zero-init weights (tables, biases, conv) drawn nonzero."""
  branch = LngramV1(config, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(seed)  # numpy draws: no per-shape compiles
  for table in branch.tables:
    table[...] = jnp.asarray(rng.standard_normal(table.shape, np.float32))
  for p, std in ((branch.b_k, 0.5), (branch.b_v, 0.5), (branch.conv_kernel, 0.5),
                 (branch.router_w, 1.0), (branch.q_norm, 0.3), (branch.k_norm, 0.3),
                 (branch.conv_norm, 0.3)):
    p[...] = jnp.asarray(np.asarray(p[...]) + std * rng.standard_normal(p.shape, np.float32))
  return branch


@functools.partial(jax.jit, static_argnums=(0, 1))
def _jitted_call(method, graph, state, *args):
  return getattr(nnx.merge(graph, state), method)(*args)


class Jitted(nnx.Module):
  """The branch with each protocol method under one jax.jit (the tests stay fast);
  a Module, so the contract's nnx.jit of decode_step takes it too."""

  def __init__(self, branch):
    self.branch = branch

  def _call(self, method, *args):
    return _jitted_call(method, *nnx.split(self.branch), *args)

  def forward(self, x, ctx):
    return self._call("forward", x, ctx)

  def prefill(self, x, ctx):
    return self._call("prefill", x, ctx)

  def decode_step(self, x, state, ctx):
    return self._call("decode_step", x, state, ctx)

  def init_decode_state(self, batch, ctx):
    return self.branch.init_decode_state(batch, ctx)


# --- a direct transcription of v1's equations (lngram-v1 spec §2-§7) -----------------


def ref_rms(v, w, eps=1e-6):
  return v / jnp.sqrt(jnp.mean(v * v, -1, keepdims=True) + eps) * w


def ref_codes(z_BxTxD, bits):
  """a[b, t, r] = Σ_j [z[b, t, r·M + j] > 0]·2^j."""
  z = np.asarray(z_BxTxD)
  Bz, Tz, d = z.shape
  a = np.zeros((Bz, Tz, d // bits), np.int64)
  for b in range(Bz):
    for t in range(Tz):
      for r in range(d // bits):
        a[b, t, r] = sum(int(z[b, t, r * bits + j] > 0) << j for j in range(bits))
  return a


def ref_rows(a_BxTxR, order, bits):
  """A[b, t, r] = r·K^n + Σ_i a[t-n+1+i, r]·K^i for t >= n-1, else -1 (no window)."""
  K = 2**bits
  rows = -np.ones_like(a_BxTxR)
  Bz, Tz, R = a_BxTxR.shape
  for b in range(Bz):
    for t in range(order - 1, Tz):
      for r in range(R):
        rows[b, t, r] = r * K**order + sum(
            int(a_BxTxR[b, t - order + 1 + i, r]) * K**i for i in range(order))
  return rows


def ref_gather(table, rows_BxTxR):
  """e[b, t, r·Dm + k] = E[A[b, t, r], k], zero where there is no window."""
  table = np.asarray(table)
  Bz, Tz, R = rows_BxTxR.shape
  e = np.zeros((Bz, Tz, R * table.shape[1]), np.float32)
  for b in range(Bz):
    for t in range(Tz):
      for r in range(R):
        if rows_BxTxR[b, t, r] >= 0:
          e[b, t, r * table.shape[1]:(r + 1) * table.shape[1]] = table[rows_BxTxR[b, t, r]]
  return jnp.asarray(e)


def ref_readout(es, h, p, orders):
  """Y = mixed + SiLU(DWConv(RMSNorm_c(mixed))), mixed = Σ_n σ(q·k̂^(n)/√d) v^(n)."""
  d = h.shape[-1]
  q = ref_rms(h, p["q_norm"])
  mixed = 0.0
  for e in es:
    k = e @ p["w_k"] + p["b_k"]
    v = e @ p["w_v"] + p["b_v"]
    gate = jax.nn.sigmoid(jnp.sum(q * ref_rms(k, p["k_norm"]), -1, keepdims=True) / np.sqrt(d))
    mixed = mixed + gate * v
  c_in = ref_rms(mixed, p["conv_norm"])
  W, delta, Tz = p["conv_kernel"].shape[0], max(orders), h.shape[1]
  # y_t = Σ_τ w_τ·x_{t-(W-1-τ)δ}, zero before the start (x padded on the left).
  padded = jnp.pad(c_in, ((0, 0), ((W - 1) * delta, 0), (0, 0)))
  conv = sum(p["conv_kernel"][tau] * padded[:, tau * delta:tau * delta + Tz]
             for tau in range(W))
  return mixed + jax.nn.silu(conv)


@functools.partial(jax.jit, static_argnames="orders")
def ref_readout_vjp(es, h, p, cot, orders):
  """(Y, its vjp at cot wrt es, h, p): jit only keeps the test fast (one compile)."""
  y, vjp = jax.vjp(lambda es_, h_, p_: ref_readout(es_, h_, p_, orders), es, h, p)
  return y, vjp(cot)


def ref_router(h, s, w):
  """z = RMSNorm(h; the block's attention-norm weight) W_q."""
  return ref_rms(h, s) @ w


@jax.jit
def ref_router_vjp(h, s, w, dz):
  return jax.vjp(ref_router, h, s, w)[1](dz)


def ref_surrogate(table, z_BxTxD, a_BxTxR, rows_BxTxR, g_BxTxF, *, order, bits, kind, tau,
                  scale):
  """∂z of one order by §7's formulas, window by window, slot by slot (float64)."""
  E = np.asarray(table, np.float64)
  z = np.asarray(z_BxTxD, np.float64)
  g_all = np.asarray(g_BxTxF, np.float64)
  K, Dm = 2**bits, E.shape[1]
  dz = np.zeros_like(z)
  Bz, Tz, R = a_BxTxR.shape
  for b in range(Bz):
    for t in range(Tz):
      for r in range(R):
        A = rows_BxTxR[b, t, r]
        if A < 0:
          continue
        g = g_all[b, t, r * Dm:(r + 1) * Dm]
        for i in range(order):
          s = t - order + 1 + i
          a_s = int(a_BxTxR[b, s, r])
          p = 1 / (1 + np.exp(-tau * z[b, s, r * bits:(r + 1) * bits]))
          base = A - a_s * K**i
          for j in range(bits):
            if kind == "onebit":
              one, zero = a_s | (1 << j), a_s & ~(1 << j)
              S = g @ (E[base + one * K**i] - E[base + zero * K**i])
              dz[b, s, r * bits + j] += scale * tau * p[j] * (1 - p[j]) * S
            else:
              for c in range(K):
                beta = [(c >> jj) & 1 for jj in range(bits)]
                P = np.prod([p[jj] if beta[jj] else 1 - p[jj] for jj in range(bits)])
                dz[b, s, r * bits + j] += (scale * tau * P * (beta[j] - p[j])
                                           * (g @ E[base + c * K**i]))
  return dz


def reference(branch, h, scale_D, cot):
  """(Y, grads) of Σ Y·cot by the transcription: chain rule through everything but
  the hard codes, whose gradient is §7's surrogate into z = RMSNorm(h; scale) W_q."""
  c = branch.config
  p = {k: v[...] for k, v in nnx.to_pure_dict(nnx.state(branch, nnx.Param)).items()
       if k != "tables"}
  tables = [t[...] for t in branch.tables]
  z = np.asarray(ref_router(h, scale_D, p["router_w"]))
  a = ref_codes(z, c.bits)
  rows = [ref_rows(a, n, c.bits) for n in c.orders]
  es = [ref_gather(table, r) for table, r in zip(tables, rows, strict=True)]
  readout_params = {k: v for k, v in p.items() if k != "router_w"}
  y, (g_es, g_h, grads) = ref_readout_vjp(es, h, readout_params, cot, c.orders)
  g_es = [np.asarray(g) for g in g_es]
  dz = 0.0
  grads["tables"] = []
  for n, table, r, g_e in zip(c.orders, tables, rows, g_es, strict=True):
    d_table = np.zeros(table.shape)
    for idx in zip(*np.nonzero(r >= 0), strict=True):
      d_table[r[idx]] += g_e[idx[0], idx[1], idx[2] * c.mem_dim:(idx[2] + 1) * c.mem_dim]
    grads["tables"].append(d_table)
    dz = dz + ref_surrogate(table, z, a, r, g_e, order=n, bits=c.bits, kind=c.surrogate,
                            tau=c.surrogate_tau, scale=c.surrogate_scale)
  g_h_z, g_scale, grads["router_w"] = ref_router_vjp(h, scale_D, p["router_w"],
                                                     jnp.asarray(dz, jnp.float32))
  return y, grads, g_h + g_h_z, g_scale


@pytest.mark.parametrize("surrogate", ["onebit", "exact"])
def test_matches_transcription_values_and_grads(surrogate):
  c = LngramV1Config(d_model=D, bits=BITS, mem_dim=DM, surrogate=surrogate,
                     surrogate_tau=0.7, surrogate_scale=1.3)
  branch = live_branch(c)
  h, _ = random_inputs(D, batch=B, length=T, seed=3)
  rng = np.random.default_rng(4)
  scale_D = jnp.asarray(1.0 + 0.3 * rng.standard_normal(D, np.float32))
  cot = jnp.asarray(rng.standard_normal(h.shape, np.float32))
  graph, state = nnx.split(branch)

  def loss(state_, h_, s_):
    y = nnx.merge(graph, state_).forward(h_, BranchContext(attn_norm_scale_D=s_))[0]
    return jnp.sum(y * cot), y

  (_, y), (g_state, g_h, g_scale) = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(
      state, h, scale_D)
  y_ref, grads_ref, g_h_ref, g_scale_ref = reference(branch, h, scale_D, cot)
  chex.assert_trees_all_close(y, y_ref, rtol=1e-5, atol=1e-5)
  g = nnx.to_pure_dict(g_state)
  g_params = {name: g[name] for name in grads_ref}
  g_params["tables"] = [g["tables"][i] for i in range(len(grads_ref["tables"]))]
  chex.assert_trees_all_close((g_params, g_h, g_scale), (grads_ref, g_h_ref, g_scale_ref),
                              rtol=1e-4, atol=1e-5)
  # The router did get a surrogate gradient (else the check above is vacuous).
  assert np.abs(g["router_w"]).max() > 1e-3


@pytest.mark.parametrize("kind", ["onebit", "exact"])
def test_v1_surrogate_equals_lngram_jax_on_the_same_rows(kind):
  """lngram_jax's surrogate on lngram_jax's rows == §7 on v1's rows (bits 3 here)."""
  bits, order, R, Dm = 3, 2, 3, 5
  rng = np.random.default_rng(7)
  z = rng.standard_normal((B, 6, R * bits), np.float32)
  table = rng.standard_normal((R * 2 ** (bits * order), Dm), np.float32)
  a = ref_codes(z, bits)
  rows_ref = ref_rows(a, order, bits)
  g = rng.standard_normal((B, 6, R, Dm), np.float32) * (rows_ref[..., :1, None] >= 0)

  @jax.jit
  def lngram_jax_side(table, z_BxTxRxM, g):
    codes = codes_from_logits(z_BxTxRxM)
    rows, ok = ngram_rows(codes, order=order, bits=bits)
    return codes, jnp.where(ok[..., None], rows, -1), surrogate_logit_grad(
        table, z_BxTxRxM, codes, rows, g, order=order, bits=bits, surrogate=kind, tau=1.3,
        scale=0.8)

  codes, rows, got = lngram_jax_side(table, z.reshape(B, 6, R, bits), g)
  np.testing.assert_array_equal(codes, a)
  np.testing.assert_array_equal(rows, rows_ref)
  want = ref_surrogate(table, z, a, rows_ref, g.reshape(B, 6, R * Dm), order=order,
                       bits=bits, kind=kind, tau=1.3, scale=0.8)
  chex.assert_trees_all_close(np.asarray(got).reshape(want.shape), want, rtol=1e-4, atol=1e-5)


def test_v1_row_layout_is_lngram_jax_layout_for_every_order():
  """v1's address A = r·K^n + Σ_i a[t-n+1+i]·K^i (oldest least significant) is ngram_rows'."""
  for bits, order in ((1, 1), (2, 3), (4, 2), (3, 4)):
    codes = np.random.default_rng(order).integers(0, 2**bits, (2, 7, 3), np.int32)
    rows, ok = jax.jit(functools.partial(ngram_rows, order=order, bits=bits))(codes)
    np.testing.assert_array_equal(np.where(ok[..., None], rows, -1),
                                  ref_rows(np.asarray(codes), order, bits))


# --- the branch contract ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live():
  return Jitted(live_branch(LngramV1Config(d_model=D, bits=BITS, mem_dim=DM)))


def test_zero_at_init():
  x, tokens = random_inputs(D, length=T)
  branch = LngramV1(LngramV1Config(d_model=D, bits=BITS, mem_dim=DM), rngs=nnx.Rngs(0))
  assert_zero_at_init(Jitted(branch), x, tokens)


def test_causal(live):
  x, tokens = random_inputs(D, length=T)
  assert_causal(live, x, tokens)


def test_segments_independent(live):
  x, tokens = random_inputs(D, length=T)
  assert_segments_independent(live, x, tokens, split=4)


def test_decode_matches_forward(live):
  x, tokens = random_inputs(D, length=T)
  assert_decode_matches_forward(live, x, tokens, prompt=4)
  assert_decode_from_empty_state(live, x, tokens)


def test_padding_reads_nothing_and_prefill_of_right_padded_prompt(live):
  """Y is zero on padding; a right-padded prompt's state continues like the short one."""
  x, tokens = random_inputs(D, length=T)
  valid = jnp.arange(T)[None, :] < jnp.array([[T], [5]])
  y = live.forward(x, BranchContext(valid_BxT=valid))[0]
  np.testing.assert_array_equal(y[1, 5:], 0.0)
  np.testing.assert_allclose(y[1, :5], live.forward(x[1:, :5], BranchContext())[0][0],
                             rtol=1e-5, atol=1e-6)
  lengths = jnp.array([T, 5], jnp.int32)
  _, state = live.prefill(x, BranchContext(lengths_B=lengths, valid_BxT=valid))
  _, short = live.prefill(x[1:, :5], BranchContext(lengths_B=lengths[1:]))
  chex.assert_trees_all_close(jax.tree.map(lambda a: a[1], state),
                              jax.tree.map(lambda a: a[0], short), rtol=1e-5, atol=1e-6)


# --- config, parameter counts, registration --------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("d_model", 0), ("bits", 3), ("bits", 9), ("orders", ()), ("orders", (3, 2)),
    ("mem_dim", 0), ("surrogate", "exactly"), ("surrogate_tau", 0.0), ("eps", -1.0),
    ("init_std", -0.1), ("conv_kernel", 0), ("dtype", "int32")])
def test_config_rejects_bad_fields(field, value):
  # d_model=16 with bits=3 is the "R = d / M must be whole" case.
  with pytest.raises(ValueError, match=field):
    LngramV1Config(**{"d_model": 16, field: value})


def test_param_count_matches_the_module_and_spec_section_10():
  c = LngramV1Config(d_model=D, bits=BITS, mem_dim=DM, conv_kernel=3)
  branch = LngramV1(c, rngs=nnx.Rngs(0))
  sizes = {k: v.size for k, v in nnx.to_flat_state(nnx.state(branch, nnx.Param))}
  counts = param_count(c)
  assert counts["total"] == sum(sizes.values())
  table_sizes = sum(v for k, v in sizes.items() if "tables" in k)
  assert counts["tables"] == table_sizes
  assert counts["active"] == counts["total"] - table_sizes + c.routes * len(c.orders) * DM
  # The paper's v1 setting (d = 1024, M = 4, orders 2/3, Dm = 144): spec §10 gives
  # tables 160.43M, W_K + W_V 75.50M, W_q 1.05M, 236.99M per layer, 473.97M for two.
  paper = param_count(LngramV1Config(d_model=1024, mem_dim=144))
  assert paper["tables"] == 256 * 144 * (16**2 + 16**3) == 160_432_128
  assert paper["readout"] == 75_497_472
  d = 1024  # the authors' estimator, plus the conv norm it leaves out
  assert paper["total"] == d * d + paper["tables"] + 2 * (256 * 144 * d + d) + 6 * d + d
  assert round(paper["total"] / 1e6, 2) == 236.99
  assert round(2 * paper["total"] / 1e6, 2) == 473.97


def test_registered_builds_an_lm_that_decodes_and_round_trips_json():
  """LMConfig JSON round trip, eval metrics, and the LM's cached decoding (the block
  hands the branch its attention-norm weight in every mode) == its parallel forward."""
  from experiments.jobs import metrics as memory_metrics
  from experiments.models.config import LMConfig
  from experiments.models.lm import DecoderLM

  c = LngramV1Config(d_model=D, bits=BITS, mem_dim=DM, surrogate="exact", orders=[1, 3])
  lm = LMConfig(d_model=D, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, ffn_dim=32,
                max_len=32, memory=c, memory_layers=(0,))
  again = LMConfig.from_dict(json.loads(json.dumps(lm.to_dict())))
  assert again == lm and again.memory == c and lm.to_dict()["memory"]["kind"] == "lngram_v1"
  model = DecoderLM(lm, rngs=nnx.Rngs(0))
  assert isinstance(model.blocks[0].memory, LngramV1)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 256, (B, T), np.int32))
  forward = nnx.jit(lambda m, t, v: m(t, valid=v, return_aux=True))
  valid = jnp.ones((B, T), bool)
  _, aux = forward(model, tokens, valid)
  assert aux["memory/0/router_codes"].shape == (B, T, c.routes)
  sums = memory_metrics.accumulate(model, aux, valid)
  out = memory_metrics.summarise(lm.memory, memory_metrics.merge(None, sums))
  assert out["lngram_v1/0/gate/3"] == pytest.approx(0.5)  # zero tables: k̂ = 0, α = ½
  assert 1.0 <= out["lngram_v1/0/effective_codes"] <= 2**BITS

  for i in lm.memory_layers:  # make the branches matter, then decode
    live = live_branch(c, seed=10 + i)
    nnx.update(model.blocks[i].memory, nnx.state(live))
    norm = model.blocks[i].attn_norm.scale  # the router's norm weight, not all ones
    norm[...] = jnp.asarray(1.0 + 0.3 * rng.standard_normal(norm.shape, np.float32))
  lengths, new = jnp.array([3, 5]), 3
  prompt_logits, cache = nnx.jit(lambda m, t, n: m.prefill(t, lengths=n, cache_len=5 + new))(
      model, tokens[:, :5], lengths)
  step = nnx.jit(lambda m, t, cache: m.decode_step(t, cache))
  seq = tokens.at[0, 3:3 + new].set(tokens[0, 5:5 + new])  # row 0 continues after 3
  steps = []
  for i in range(new):
    logits, cache = step(model, jnp.stack([seq[0, 3 + i], seq[1, 5 + i]])[:, None], cache)
    steps.append(logits)
  ref = forward(model, seq, valid)[0]
  for b, L in enumerate([3, 5]):
    np.testing.assert_allclose(prompt_logits[b, :L], ref[b, :L], rtol=1e-5, atol=1e-5)
    for i in range(new):
      np.testing.assert_allclose(steps[i][b], ref[b, L + i], rtol=1e-5, atol=1e-5)


def test_config_file_args():
  from experiments.configs import load_config
  from experiments.models.config import LMConfig, lm_config

  path = "experiments/configs/lm_lngram_v1.py"
  for arg, want in (("", dict(mem_dim=16, surrogate="onebit", bits=4)),
                    ("smoke", dict(mem_dim=4, bits=2)),
                    ("exact,mem8", dict(mem_dim=8, surrogate="exact")),
                    ("none,smoke", dict(surrogate="none", bits=2)),
                    ("r16,mem9", dict(n_routes=16, routes=16, mem_dim=9)),
                    ("zerotable", dict(table_init_std=0.0, mem_dim=16))):
    config = load_config(f"{path}:{arg}" if arg else path)
    lm = lm_config(config)
    assert isinstance(lm.memory, LngramV1Config) and lm.memory.d_model == lm.d_model
    assert lm.memory_layers == ((1,) if "smoke" in arg else (1, 2))
    assert {k: getattr(lm.memory, k) for k in want} == want
    assert LMConfig.from_dict(json.loads(json.dumps(lm.to_dict()))) == lm
  assert load_config(f"{path}:zerotable").optim.freeze == ("tables",)
  with pytest.raises(ValueError, match="lm_lngram_v1: unknown config arg 'k16'"):
    load_config(f"{path}:k16")
