"""The block surrogate backward ("blocks") against its gather twin ("gather").

Both compute DESIGN.md §2.7 with the same maths; only the order of the table
reads (and so the float round-off) differs. The brute-force references of
`lngram_jax.reference` check the block form with several window chunks.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_lookup import make_case

from lngram_jax import LngramConfig, LngramV2, lookup, reference, surrogate_blocks
from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.layer import set_surrogate_impl
from lngram_jax.lookup import ngram_lookup, surrogate_logit_grad
from lngram_jax.sharding import make_mesh, shard_layer

MODES = ("exact", "onebit", "ste", "none")


@pytest.fixture
def tiny_chunks(monkeypatch):
  """A chunk budget of a few rows, so every lookup runs several window chunks."""
  monkeypatch.setattr(surrogate_blocks, "_CHUNK_BYTES", {jax.default_backend(): 512})


def _problem(seed, *, orders, M=3, R=2, B=2, T=9, Dm=5, packed=True, padded=True,
             dtype=np.float32):
  rng = np.random.default_rng(seed)
  C = 2**M
  tables = [jnp.asarray(rng.normal(size=(R * C**n, Dm)), dtype) for n in orders]
  z = jnp.asarray(rng.normal(size=(B, T, R, M)), np.float32)
  gs = [jnp.asarray(rng.normal(size=(B, T, R, Dm)), dtype) for _ in orders]
  seg = valid = None
  if packed:
    seg = jnp.asarray(np.cumsum(rng.random((B, T)) < 0.2, axis=1), jnp.int32)
  if padded:
    valid_np = np.ones((B, T), bool)
    valid_np[0, -2:] = False
    valid_np[-1, T // 2] = False
    valid = jnp.asarray(valid_np)
  return tables, z, gs, seg, valid


def _value_and_grads(impl, surrogate, orders, tables, z, gs, seg, valid):
  """Σ_n ⟨g_n, lookup_n⟩ with its gradients to every table and to z."""
  def loss(tables, z):
    total = 0.0
    mems = []
    for n, table, g in zip(orders, tables, gs, strict=True):
      mem = ngram_lookup(table, z, order=n, bits=z.shape[-1], segment_ids=seg, valid=valid,
                         surrogate=surrogate, tau=0.9, scale=1.3, surrogate_impl=impl)
      mems.append(mem)
      total += jnp.sum(mem.astype(jnp.float32) * g.astype(jnp.float32))
    return total, mems

  (_, mems), (d_tables, d_z) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1),
                                                          has_aux=True))(tables, z)
  return mems, d_tables, d_z


# exact and onebit have two implementations: every order set and dtype. ste and
# none share one code path, checked here only so that every mode is covered.
_EQUAL_CASES = [(s, o, d) for s in ("exact", "onebit") for o in ((2, 3), (1, 2, 3))
                for d in (np.float32, jnp.bfloat16)]
_EQUAL_CASES += [("ste", (2, 3), np.float32), ("none", (1, 2, 3), jnp.bfloat16)]


@pytest.mark.parametrize(
    "surrogate, orders, dtype", _EQUAL_CASES,
    ids=[f"{s}-o{''.join(map(str, o))}-{jnp.dtype(d).name}" for s, o, d in _EQUAL_CASES])
def test_blocks_equal_gather(surrogate, orders, dtype, tiny_chunks):
  problem = _problem(len(orders) * 10 + MODES.index(surrogate), orders=orders, dtype=dtype)
  mems_g, d_tables_g, d_z_g = _value_and_grads("gather", surrogate, orders, *problem)
  mems_b, d_tables_b, d_z_b = _value_and_grads("blocks", surrogate, orders, *problem)
  chex.assert_trees_all_equal_dtypes(mems_b, d_tables_b, [jnp.zeros((), dtype)] * len(orders))
  # Bit-identical values; the table gradient is one code path for both implementations.
  chex.assert_trees_all_equal((mems_b, d_tables_b), (mems_g, d_tables_g))
  assert d_z_b.dtype == jnp.float32
  if surrogate != "none":
    assert float(jnp.max(jnp.abs(d_z_g))) > 1e-2  # not a vacuous comparison
  # Same sums in another order: float32 round-off of the largest entries.
  chex.assert_trees_all_close(d_z_b, d_z_g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strided", [False, True], ids=["runs", "strided"])
@pytest.mark.parametrize("surrogate", ["exact", "onebit"])
@pytest.mark.parametrize("chunk_bytes", [1, 700])
def test_chunking_is_invisible(surrogate, chunk_bytes, strided):
  """One window per chunk, or chunks that do not divide B·T·R, chunks of contiguous
  windows (CPU) or of every n-th window (other platforms): the same answer."""
  bits = 2
  tables, z, gs, seg, valid = _problem(3, orders=(3,), M=bits, T=5, packed=True)
  codes = codes_from_logits(z)
  rows, ok = ngram_rows(codes, order=3, bits=bits, segment_ids=seg, valid=valid)
  g = gs[0] * ok[:, :, None, None]
  kw = dict(order=3, bits=bits, surrogate=surrogate, tau=1.1, scale=0.7)
  want = jax.jit(functools.partial(surrogate_logit_grad, impl="gather", **kw))(
      tables[0], z, codes, rows, g)
  got = jax.jit(functools.partial(surrogate_blocks._surrogate_logit_grad_blocks,
                                  chunk_bytes=chunk_bytes, strided=strided, **kw))(
      tables[0], z, rows, g, None)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-6)


def test_chunk_windows():
  assert surrogate_blocks.chunk_windows(1000, 4, 256, budget=4 * 256 * 100) == 64
  assert surrogate_blocks.chunk_windows(1000, 4, 256, budget=1) == 1
  assert surrogate_blocks.chunk_windows(5, 4, 256, budget=1 << 30) == 8  # one chunk


# The brute-force references, against the block form with
# several chunks (the default implementation may be either).
@pytest.mark.parametrize("M, n, R, T, packed, padded, tau, scale", [
    (2, 3, 2, 7, True, False, 1.0, 0.25),
    (3, 2, 2, 6, True, True, 1.2, 1.0),
    (4, 1, 2, 4, True, False, 1.0, 0.9),
])
@pytest.mark.parametrize("mode", ["exact", "onebit"])
def test_blocks_equal_brute_force(mode, M, n, R, T, packed, padded, tau, scale, tiny_chunks):
  with jax.enable_x64(True):
    case = make_case(M * 100 + n * 10 + R, B=2, T=T, R=R, M=M, n=n, packed=packed,
                     padded=padded)
    seg = None if case["segment_ids"] is None else jnp.asarray(case["segment_ids"])
    valid = None if case["valid"] is None else jnp.asarray(case["valid"])

    def f(table, z):
      return ngram_lookup(table, z, order=n, bits=M, segment_ids=seg, valid=valid,
                          surrogate=mode, tau=tau, scale=scale, surrogate_impl="blocks")

    _, pull = jax.vjp(jax.jit(f), jnp.asarray(case["table"]), jnp.asarray(case["z"]))
    _, d_z = pull(jnp.asarray(case["g"]))
    want = reference.surrogate_logit_grad(
        case["table"], case["z"], case["g"], surrogate=mode, order=n, bits=M,
        segment_ids=case["segment_ids"], valid=case["valid"], tau=tau, scale=scale)
    assert d_z.dtype == jnp.float64 and float(np.max(np.abs(want))) > 1e-3
    chex.assert_trees_all_close(d_z, want, rtol=1e-10, atol=1e-13)


def test_auto_and_explicit_impls():
  # "auto": what the layer benchmark measured faster (BENCHMARKS.md).
  assert lookup.resolve_surrogate_impl("auto", "onebit") == "blocks"
  assert lookup.resolve_surrogate_impl("auto", "exact") == "blocks"
  assert lookup.resolve_surrogate_impl("auto", "ste") == "gather"  # one form only
  assert lookup.resolve_surrogate_impl("gather", "exact") == "gather"
  assert lookup.resolve_surrogate_impl("blocks", "onebit") == "blocks"
  with pytest.raises(ValueError, match="surrogate_impl='fast' is not one of"):
    ngram_lookup(jnp.zeros((2 * 16, 4)), jnp.zeros((1, 3, 2, 2)), order=2, bits=2,
                 surrogate_impl="fast")
  with pytest.raises(ValueError, match="surrogate_impl=None is not one of"):
    lookup.resolve_surrogate_impl(None, "onebit")   # no hidden default to fall back on
  config = LngramConfig(d_model=8, routes=2, bits=2, orders=(2,), mem_dim=4, q_heads=2,
                        kv_heads=1, head_dim=4)
  with pytest.raises(ValueError, match="surrogate_impl='fast' is not one of"):
    LngramV2(config, rngs=nnx.Rngs(0), surrogate_impl="fast")
  layer = LngramV2(config, rngs=nnx.Rngs(0))
  assert layer.surrogate_impl == "auto"
  with pytest.raises(ValueError, match="surrogate_impl='fast' is not one of"):
    set_surrogate_impl(layer, "fast")


@pytest.mark.parametrize("sharded", [False, True], ids=["layer", "sharded"])
@pytest.mark.parametrize("impl", ["gather", "blocks"])
def test_the_layer_attribute_chooses_the_backward(impl, sharded, monkeypatch):
  """The layer's `surrogate_impl` reaches the lookups' backward when the gradient is
  traced (the sharded layer's too, copied by `shard_layer`): only "blocks" calls the
  block form."""
  calls = []
  blocks = lookup.surrogate_logit_grad_blocks
  monkeypatch.setattr(lookup, "surrogate_logit_grad_blocks",
                      lambda *a, **k: calls.append(1) or blocks(*a, **k))
  config = LngramConfig(d_model=8, routes=2, bits=2, orders=(2, 3), mem_dim=4, q_heads=2,
                        kv_heads=1, head_dim=4)
  layer = LngramV2(config, rngs=nnx.Rngs(0))
  assert set_surrogate_impl(layer, impl) == 1
  if sharded:
    layer = shard_layer(layer, mesh=make_mesh(table=2, devices=jax.devices()[:2]))
    assert layer.surrogate_impl == impl
  graphdef, state = nnx.split(layer)

  def loss(state, h):
    return jnp.sum(nnx.merge(graphdef, state)(h))

  jax.eval_shape(jax.grad(loss), state, jnp.ones((2, 6, 8)))
  assert len(calls) == (len(config.orders) if impl == "blocks" else 0)


@pytest.mark.parametrize("surrogate", ["exact", "onebit"])
def test_blocks_lower_for_tpu(surrogate):
  """The block backward lowers for TPU (on CPU, DESIGN.md §7.2), in bfloat16."""
  B, T, R, M, Dm = 2, 16, 4, 4, 8
  avals = (jax.ShapeDtypeStruct((R * 16**3, Dm), jnp.bfloat16),
           jax.ShapeDtypeStruct((B, T, R, M), jnp.float32))

  def loss(table, z):
    mem = ngram_lookup(table, z, order=3, bits=M, surrogate=surrogate,
                       surrogate_impl="blocks")
    return jnp.sum(mem.astype(jnp.float32))

  text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(*avals).lower(
      lowering_platforms=("tpu",)).as_text()
  assert "gather" in text


@pytest.mark.parametrize("bits, order", [(2, 3), (3, 2), (4, 1)])
def test_slot_block_scores_read_the_slot_candidates(bits, order):
  """One gather index per window and slot fetches the rows base_u + c·C^u, c < C."""
  rng = np.random.default_rng(bits)
  R, Dm, windows = 3, 5, 16
  C = 2**bits
  table = jnp.asarray(rng.normal(size=(R * C**order, Dm)), jnp.float32)
  rows = jnp.asarray(rng.integers(0, R * C**order, windows), jnp.int32)
  g = jnp.asarray(rng.normal(size=(windows, Dm)), jnp.float32)
  want = surrogate_blocks.block_scores(table, surrogate_blocks._exact_rows(rows, order, bits),
                                       g, chunk=4).reshape(windows, order, C)
  for slot in range(order):
    got = surrogate_blocks.slot_block_scores(table, rows, g, slot=slot, bits=bits, chunk=4)
    digit = (np.asarray(rows) // C**slot) % C
    base = np.asarray(rows) - digit * C**slot
    brute = np.einsum("wcd,wd->wc", np.asarray(table)[base[:, None] + np.arange(C) * C**slot],
                      np.asarray(g))
    np.testing.assert_allclose(np.asarray(got), brute, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want[:, slot]), rtol=1e-5, atol=1e-6)


def test_onebit_with_the_hard_scores_given_equals_reading_them():
  """The lookup's backward hands the one-bit blocks the forward's ⟨g, E[hard row]⟩; the
  flipped rows are then all it reads, and the gradient is the same."""
  bits = 3
  tables, z, gs, seg, valid = _problem(5, orders=(2,), M=bits, T=7)
  codes = codes_from_logits(z)
  rows, ok = ngram_rows(codes, order=2, bits=bits, segment_ids=seg, valid=valid)
  g = gs[0] * ok[:, :, None, None]
  hard = jnp.einsum("btrd,btrd->btr", jnp.take(tables[0], rows, axis=0), g)
  kw = dict(order=2, bits=bits, surrogate="onebit", tau=1.1, scale=0.7, chunk_bytes=300)
  read = surrogate_blocks.surrogate_logit_grad_blocks(tables[0], z, rows, g, **kw)
  given = surrogate_blocks.surrogate_logit_grad_blocks(tables[0], z, rows, g, **kw,
                                                       hard_scores_BxTxR=hard)
  assert float(jnp.max(jnp.abs(read))) > 1e-2
  chex.assert_trees_all_close(given, read, rtol=1e-6, atol=1e-6)
  assert lookup._hard_from_forward("onebit", "blocks") and lookup._hard_from_forward("ste", "gather")
  assert not lookup._hard_from_forward("onebit", "gather")
  assert not lookup._hard_from_forward("exact", "blocks")
