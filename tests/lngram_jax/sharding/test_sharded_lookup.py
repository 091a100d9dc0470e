"""sharded_ngram_lookup == ngram_lookup on 8 host devices: values, table and
logit gradients, every surrogate mode, packed segments and padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sharding_cases import assert_close, assert_nonzero, mesh

from lngram_jax import ngram_lookup
from lngram_jax.config import SURROGATES
from lngram_jax.sharding import sharded_ngram_lookup

R, M, DM, B, T = 8, 2, 4, 2, 12
ORDERS = (2, 3)


def _problem():
  rng = np.random.default_rng(0)
  tables = tuple(jnp.asarray(rng.standard_normal((R * 2 ** (M * n), DM)), jnp.float32)
                 for n in ORDERS)
  segment_ids = np.zeros((B, T), np.int32)
  segment_ids[0, 5:] = 1
  segment_ids[1, T // 2:] = 1  # a boundary where a seq=2 split cuts
  valid = np.ones((B, T), bool)
  valid[1, T - 2:] = False
  return {
      "tables": tables,
      "logits": jnp.asarray(rng.standard_normal((B, T, R, M)), jnp.float32),
      "segment_ids": jnp.asarray(segment_ids),
      "valid": jnp.asarray(valid),
      "w": jnp.asarray(rng.standard_normal((B, T, R, DM)), jnp.float32),
  }


def _value_and_grads(lookup, problem, surrogate):
  def loss(tables, logits):
    total = 0.0
    for n, table in zip(ORDERS, tables, strict=True):
      mem = lookup(table, logits, order=n, bits=M, segment_ids=problem["segment_ids"],
                   valid=problem["valid"], surrogate=surrogate, tau=1.3, scale=0.7)
      total += jnp.sum(mem * problem["w"] * n)
    return total

  value, (g_tables, g_logits) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(
      problem["tables"], problem["logits"])
  out = {"value": np.asarray(value), "grad_logits": np.asarray(g_logits)}
  out.update({f"grad_table{n}": np.asarray(g) for n, g in zip(ORDERS, g_tables, strict=True)})
  return out


@pytest.fixture(scope="module")
def problem():
  return _problem()


@pytest.mark.parametrize("surrogate", SURROGATES)
def test_sharded_lookup_equals_unsharded(problem, surrogate):
  m = mesh(data=2, table=4)
  want = _value_and_grads(ngram_lookup, problem, surrogate)
  got = _value_and_grads(lambda *a, **k: sharded_ngram_lookup(*a, mesh=m, **k),
                         problem, surrogate)
  assert_close(got, want)
  assert_nonzero(want, ["grad_table2", "grad_table3"])
  if surrogate != "none":
    assert_nonzero(want, ["grad_logits"])


@pytest.mark.parametrize("surrogate,packed", [("exact", True), ("onebit", False)])
def test_context_parallel_lookup_equals_unsharded(problem, surrogate, packed):
  # Windows that straddle the seq split read their older symbols from the left
  # shard and send surrogate gradient back to it; unpacked, only the halo's
  # padding mark keeps the first shard's windows from reaching before t = 0.
  if not packed:
    problem = dict(problem, segment_ids=None, valid=None)
  m = mesh(data=2, seq=2, table=2)
  want = _value_and_grads(ngram_lookup, problem, surrogate)
  got = _value_and_grads(lambda *a, **k: sharded_ngram_lookup(*a, mesh=m, **k),
                         problem, surrogate)
  assert_close(got, want)


def test_routes_must_split_evenly(problem):
  m = mesh(table=8)
  logits = problem["logits"][:, :, :6]
  table = jnp.zeros((6 * 2 ** (M * 2), DM))
  with pytest.raises(ValueError, match="routes R=6 must be a multiple of the 'table' axis size 8"):
    sharded_ngram_lookup(table, logits, mesh=m, order=2, bits=M)
