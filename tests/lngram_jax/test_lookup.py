"""The hard lookup and its surrogate gradients against the brute-force references.

The references (`lngram_jax.reference`) are built from the definitions by
enumerating windows, routes, slots and codes in plain Python; none reuses the
code under test. The gradient identities run in float64 so they can be held to
rtol 1e-10.

A window is named by its batch row b and last position t; slot u of an order-n
window holds the symbol at t-n+1+u and weighs C^u in the row
r·C^n + Σ_u a_u·C^u.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from lngram_jax import reference
from lngram_jax.lookup import ngram_lookup

MODES = ("exact", "onebit", "ste", "none")
DM = 3  # memory width: tiny, but > 1 so ⟨g, E⟩ is a real dot product


# --------------------------------------------------------------------------
# Problem builder; the references are `lngram_jax.reference`.


def make_case(seed, *, B, T, R, M, n, packed=False, padded=False, dtype=np.float64):
  rng = np.random.default_rng(seed)
  C = 2**M
  case = dict(
      table=rng.normal(size=(R * C**n, DM)).astype(dtype),
      z=rng.normal(size=(B, T, R, M)).astype(dtype),
      g=rng.normal(size=(B, T, R, DM)).astype(dtype),
      segment_ids=None,
      valid=None,
  )
  if packed:
    # Position 0 is always a segment of length 1; other cuts are random.
    cuts = rng.random((B, T)) < 0.35
    cuts[:, 0] = False
    cuts[:, 1] = True
    case["segment_ids"] = np.cumsum(cuts, axis=1).astype(np.int32)
  if padded:
    valid = np.ones((B, T), bool)
    valid[0, -1] = False  # right padding
    valid[-1, T // 2] = False  # a hole inside a row
    case["valid"] = valid
  return case


def reference_logit_grad(case, *, n, tau, scale, mode):
  """The closed-form router gradient of `mode` for `case` (lngram_jax.reference, §2.7)."""
  return reference.surrogate_logit_grad(
      case["table"], case["z"], case["g"], surrogate=mode, order=n, bits=case["z"].shape[-1],
      segment_ids=case["segment_ids"], valid=case["valid"], tau=tau, scale=scale)


def reference_lookup(case, *, n, surrogate="none", tau=1.0, scale=1.0):
  """`reference.lookup` over the case's masks, as a function of (table, z)."""
  return functools.partial(reference.lookup, order=n, bits=case["z"].shape[-1],
                           segment_ids=case["segment_ids"], valid=case["valid"],
                           surrogate=surrogate, tau=tau, scale=scale)


def lookup_vjp(table, z, g, segment_ids, valid, *, order, bits, surrogate, tau, scale):
  def f(table, z):
    return ngram_lookup(table, z, order=order, bits=bits, segment_ids=segment_ids,
                        valid=valid, surrogate=surrogate, tau=tau, scale=scale)
  mem, pull = jax.vjp(f, table, z)
  d_table, d_z = pull(g)
  return mem, d_table, d_z


def run_lookup(fn_wrap, case, *, n, surrogate, tau=1.0, scale=1.0, g=None):
  M = case["z"].shape[-1]
  fn = fn_wrap(functools.partial(lookup_vjp, order=n, bits=M, surrogate=surrogate,
                                 tau=tau, scale=scale))
  seg = None if case["segment_ids"] is None else jnp.asarray(case["segment_ids"])
  valid = None if case["valid"] is None else jnp.asarray(case["valid"])
  g = case["g"] if g is None else g
  return fn(jnp.asarray(case["table"]), jnp.asarray(case["z"]), jnp.asarray(g), seg, valid)


class X64TestCase(chex.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(jax.enable_x64(True))


# (M, n, R, T, packed, padded, tau, scale): every M in 1..4 with every n in 1..3.
_EXACT_CASES = [
    (1, 1, 1, 4, False, False, 1.0, 1.0),
    (1, 2, 3, 5, True, False, 0.7, 1.3),
    (1, 3, 2, 6, False, True, 2.0, 0.5),
    (2, 1, 2, 5, True, True, 1.5, 2.0),
    (2, 2, 1, 6, False, False, 0.5, 1.0),
    (2, 3, 2, 7, True, False, 1.0, 0.25),
    (3, 1, 1, 5, False, True, 0.8, 1.7),
    (3, 2, 2, 6, True, True, 1.2, 1.0),
    (3, 3, 1, 5, True, False, 0.6, 3.0),
    (4, 1, 2, 4, True, False, 1.0, 0.9),
    (4, 2, 1, 5, False, True, 1.8, 1.1),
    (4, 3, 1, 4, False, False, 0.9, 1.4),
]


def _named(cases):
  return [dict(testcase_name=f"M{c[0]}_n{c[1]}_R{c[2]}_T{c[3]}"
               + ("_packed" if c[4] else "") + ("_padded" if c[5] else ""),
               M=c[0], n=c[1], R=c[2], T=c[3], packed=c[4], padded=c[5], tau=c[6], scale=c[7])
          for c in cases]


_PER_BIT_CASES = [
    (3, 1, 2, 5, True, True, 1.4, 0.8),
    (2, 2, 2, 6, False, True, 0.5, 1.0),
    (4, 2, 1, 5, True, False, 1.8, 1.1),
    (2, 3, 2, 7, True, True, 1.0, 0.25),
]


def _named_modes(cases):
  return [dict(d, testcase_name=f"{mode}_{d['testcase_name']}", mode=mode)
          for mode in ("onebit", "ste") for d in _named(cases)]


class SurrogateGradTest(X64TestCase):

  @chex.variants(with_jit=True)
  @parameterized.named_parameters(*_named(_EXACT_CASES))
  def test_exact_equals_enumeration(self, M, n, R, T, packed, padded, tau, scale):
    self._check_exact(M, n, R, T, packed, padded, tau, scale)

  # Op-by-op execution compiles every primitive anew, so the un-jitted path
  # (the same code) runs on one case here and in the `none` test below.
  @chex.variants(without_jit=True)
  @parameterized.named_parameters(*_named(_EXACT_CASES[1:2]))
  def test_exact_equals_enumeration_eager(self, M, n, R, T, packed, padded, tau, scale):
    self._check_exact(M, n, R, T, packed, padded, tau, scale)

  def _check_exact(self, M, n, R, T, packed, padded, tau, scale):
    case = make_case(M * 100 + n * 10 + R, B=2, T=T, R=R, M=M, n=n,
                     packed=packed, padded=padded)
    _, _, d_z = run_lookup(self.variant, case, n=n, surrogate="exact", tau=tau, scale=scale)
    want = reference_logit_grad(case, n=n, tau=tau, scale=scale, mode="exact")
    self.assertEqual(d_z.dtype, jnp.float64)
    self.assertGreater(float(jnp.max(jnp.abs(want))), 1e-3)  # not a vacuous case
    chex.assert_trees_all_close(d_z, want, rtol=1e-10, atol=1e-13)

  @chex.variants(with_jit=True)
  @parameterized.named_parameters(*_named_modes(_PER_BIT_CASES))
  def test_per_bit_modes(self, mode, M, n, R, T, packed, padded, tau, scale):
    """onebit against its per-bit brute force; ste against its docstring."""
    case = make_case(7 + M * 100 + n * 10 + R, B=2, T=T, R=R, M=M, n=n,
                     packed=packed, padded=padded)
    _, _, d_z = run_lookup(self.variant, case, n=n, surrogate=mode, tau=tau, scale=scale)
    want = reference_logit_grad(case, n=n, tau=tau, scale=scale, mode=mode)
    self.assertGreater(float(np.max(np.abs(want))), 1e-3)
    chex.assert_trees_all_close(d_z, want, rtol=1e-10, atol=1e-13)

  @parameterized.parameters("exact", "onebit", "ste")
  def test_reference_lookup_gradient_is_the_closed_form(self, mode):
    """The two references agree: autodiff of `reference.lookup` (value + S - sg(S))
    gives the closed-form surrogate of `reference.*_logit_grad`."""
    case = make_case(11, B=2, T=6, R=2, M=2, n=2, packed=True, padded=True)
    fn = jax.jit(reference_lookup(case, n=2, surrogate=mode, tau=0.9, scale=1.3))
    _, pull = jax.vjp(fn, jnp.asarray(case["table"]), jnp.asarray(case["z"]))
    _, d_z = pull(jnp.asarray(case["g"]))
    want = reference_logit_grad(case, n=2, tau=0.9, scale=1.3, mode=mode)
    self.assertGreater(float(np.max(np.abs(want))), 1e-3)
    chex.assert_trees_all_close(d_z, want, rtol=1e-12, atol=1e-14)

  def test_exact_is_onebit_for_one_bit(self):
    # With C = 2, Σ_c P_c(β_c - p)s_c = p(1-p)(s_1 - s_0): the two modes agree.
    case = make_case(3, B=2, T=6, R=2, M=1, n=3, packed=True)
    _, _, exact = run_lookup(jax.jit, case, n=3, surrogate="exact", tau=1.3, scale=0.7)
    _, _, onebit = run_lookup(jax.jit, case, n=3, surrogate="onebit", tau=1.3, scale=0.7)
    chex.assert_trees_all_close(exact, onebit, rtol=1e-12, atol=1e-14)

  @chex.variants(with_jit=True, without_jit=True)
  def test_none_gives_zero_logit_gradient(self):
    case = make_case(5, B=2, T=5, R=2, M=2, n=2, packed=True)
    _, d_table, d_z = run_lookup(self.variant, case, n=2, surrogate="none")
    np.testing.assert_array_equal(np.asarray(d_z), np.zeros_like(case["z"]))
    self.assertGreater(float(jnp.max(jnp.abs(d_table))), 0.0)


class ForwardAndTableGradTest(X64TestCase):

  @chex.variants(with_jit=True)
  @parameterized.named_parameters(
      dict(testcase_name="n1_padded", M=3, n=1, packed=False, padded=True),
      dict(testcase_name="n2_packed", M=2, n=2, packed=True, padded=False),
      dict(testcase_name="n3_packed_padded", M=2, n=3, packed=True, padded=True),
  )
  def test_forward_and_table_gradient(self, M, n, packed, padded):
    case = make_case(20 + n, B=2, T=7, R=2, M=M, n=n, packed=packed, padded=padded)
    take_fn = functools.partial(reference_lookup(case, n=n), logits_BxTxRxM=case["z"])
    mem_want, pull = jax.vjp(take_fn, jnp.asarray(case["table"]))
    (d_table_want,) = pull(jnp.asarray(case["g"]))
    rows, ok = reference.rows(reference.codes(case["z"]), order=n, bits=M,
                              segment_ids=case["segment_ids"], valid=case["valid"])
    read = np.zeros(case["table"].shape[0], bool)
    read[rows[ok].reshape(-1)] = True
    self.assertTrue(0 < read.sum() < read.size)

    mems = {}
    for mode in MODES:
      mem, d_table, _ = run_lookup(self.variant, case, n=n, surrogate=mode)
      mems[mode] = np.asarray(mem)
      np.testing.assert_array_equal(mems[mode], np.asarray(mem_want))
      chex.assert_trees_all_close(d_table, d_table_want, rtol=1e-13, atol=0)
      # Counterfactual rows are read by the surrogate but receive nothing.
      np.testing.assert_array_equal(np.asarray(d_table)[~read], 0.0)
    for mode in MODES[1:]:
      np.testing.assert_array_equal(mems[mode], mems["exact"])  # bit-identical

  @chex.variants(with_jit=True)
  @parameterized.parameters(*MODES)
  def test_invalid_windows_are_inert(self, mode):
    case = make_case(31, B=2, T=7, R=2, M=2, n=3, packed=True, padded=True)
    ok = reference.window_valid((2, 7), order=3, segment_ids=case["segment_ids"],
                                valid=case["valid"])
    self.assertTrue(0 < ok.sum() < ok.size)
    noise = np.random.default_rng(0).normal(size=case["g"].shape) * 1e3
    g_noisy = case["g"] + np.where(ok[:, :, None, None], 0.0, noise)
    mem, d_table, d_z = run_lookup(self.variant, case, n=3, surrogate=mode)
    _, d_table2, d_z2 = run_lookup(self.variant, case, n=3, surrogate=mode, g=g_noisy)
    np.testing.assert_array_equal(np.asarray(mem)[~ok], 0.0)
    np.testing.assert_array_equal(np.asarray(d_table2), np.asarray(d_table))
    np.testing.assert_array_equal(np.asarray(d_z2), np.asarray(d_z))


  def test_sequence_shorter_than_order_reads_nothing(self):
    case = make_case(32, B=1, T=2, R=2, M=2, n=3)
    for mode in MODES:
      mem, d_table, d_z = run_lookup(jax.jit, case, n=3, surrogate=mode)
      np.testing.assert_array_equal(np.asarray(mem), 0.0)
      np.testing.assert_array_equal(np.asarray(d_table), 0.0)
      np.testing.assert_array_equal(np.asarray(d_z), 0.0)


def two_order_loss(z, tables, gs, segment_ids, surrogate):
  """⟨g2, lookup_2⟩ + ⟨g3, lookup_3⟩: one position feeds windows of both orders."""
  total = 0.0
  for n in (2, 3):
    mem = ngram_lookup(tables[n], z, order=n, bits=z.shape[-1], segment_ids=segment_ids,
                       surrogate=surrogate, tau=0.8, scale=1.2)
    total += jnp.sum(mem * gs[n])
  return total


class MultiOrderTest(X64TestCase):

  @parameterized.parameters("exact", "onebit")
  def test_orders_sum_and_segments_stay_apart(self, surrogate):
    B, T, R, M = 2, 8, 2, 2
    # Segment lengths 1 and 3 only, so the solo runs compile two shapes.
    segment_ids = np.array([[0, 1, 1, 1, 2, 2, 2, 3], [4, 4, 4, 5, 6, 6, 6, 7]], np.int32)
    cases = {n: make_case(40 + n, B=B, T=T, R=R, M=M, n=n) for n in (2, 3)}
    z = jnp.asarray(cases[2]["z"])
    tables = {n: jnp.asarray(cases[n]["table"]) for n in (2, 3)}
    gs = {n: jnp.asarray(cases[n]["g"]) for n in (2, 3)}
    grad_fn = jax.jit(jax.grad(two_order_loss), static_argnums=4)
    d_z = np.asarray(grad_fn(z, tables, gs, jnp.asarray(segment_ids), surrogate))

    # The sum of the per-order brute-force references.
    want = np.zeros_like(d_z)
    for n in (2, 3):
      case = dict(cases[n], z=cases[2]["z"], segment_ids=segment_ids)
      want += reference_logit_grad(case, n=n, tau=0.8, scale=1.2, mode=surrogate)
    chex.assert_trees_all_close(d_z, want, rtol=1e-10, atol=1e-13)

    # Each segment run alone gives the same gradient on its positions: no
    # contribution crosses a boundary, in either direction.
    for b in range(B):
      for seg in np.unique(segment_ids[b]):
        span = np.flatnonzero(segment_ids[b] == seg)
        sl = slice(span[0], span[-1] + 1)
        alone = grad_fn(
            z[b:b + 1, sl], tables, {n: gs[n][b:b + 1, sl] for n in (2, 3)}, None,
            surrogate)
        chex.assert_trees_all_close(d_z[b:b + 1, sl], alone, rtol=1e-12, atol=1e-14,
                                    custom_message=f"row {b} segment {seg}")


class BadInputTest(chex.TestCase):

  def _raises(self, err, match, table, z, **kw):
    kw = dict(dict(order=2, bits=2), **kw)
    f = lambda table, z: ngram_lookup(table, z, **kw)
    with pytest.raises(err, match=match):
      f(table, z)
    with pytest.raises(err, match=match):
      jax.jit(f).trace(table, z)  # raised while tracing, before any compilation

  def test_bad_inputs(self):
    table = jnp.zeros((2 * 16, 4), jnp.float32)
    z = jnp.zeros((1, 3, 2, 2), jnp.float32)
    self._raises(ValueError, r"logits must have rank 4 \(\[B, T, R, M\]\)", table, z[0])
    self._raises(ValueError, "logits last dim M=3 must equal bits=2", table,
                 jnp.zeros((1, 3, 2, 3), jnp.float32))
    self._raises(ValueError, r"table has 31 rows; order=2, R=2, bits=2 need R\*C\^n = 32",
                 table[:31], z)
    self._raises(ValueError, r"table must have rank 2 \(\[E, Dm\]\)", table[None], z)
    self._raises(ValueError, "surrogate='straight' is not one of", table, z,
                 surrogate="straight")
    self._raises(TypeError, "logits must be a floating array", table,
                 jnp.zeros((1, 3, 2, 2), jnp.int32))
    self._raises(TypeError, "table must be a floating array", table.astype(jnp.int32), z)


class LowPrecisionTest(chex.TestCase):

  @chex.variants(with_jit=True)
  @parameterized.parameters(*MODES)
  def test_bf16_table_f32_logits(self, mode):
    case = make_case(50, B=2, T=6, R=2, M=3, n=2, packed=True, dtype=np.float32)
    case16 = dict(case, table=case["table"].astype(jnp.bfloat16),
                  g=case["g"].astype(jnp.bfloat16))
    mem, d_table, d_z = run_lookup(self.variant, case16, n=2, surrogate=mode)
    self.assertEqual(mem.dtype, jnp.bfloat16)
    self.assertEqual(d_table.dtype, jnp.bfloat16)
    self.assertEqual(d_z.dtype, jnp.float32)
    self.assertTrue(bool(jnp.all(jnp.isfinite(d_table.astype(jnp.float32)))))
    self.assertTrue(bool(jnp.all(jnp.isfinite(d_z))))
    # Same values in float32: the backward accumulates in float32 either way.
    case32 = dict(case, table=np.asarray(case16["table"], np.float32),
                  g=np.asarray(case16["g"], np.float32))
    mem32, d_table32, d_z32 = run_lookup(self.variant, case32, n=2, surrogate=mode)
    np.testing.assert_array_equal(np.asarray(mem, np.float32), np.asarray(mem32))
    chex.assert_trees_all_close(d_z, d_z32, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(d_table.astype(jnp.float32), d_table32, rtol=1e-2, atol=1e-2)
