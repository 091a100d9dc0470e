"""Expert parallelism (experiments/models/moe/parallel.py): on meshes of host devices the
all-to-all dispatch equals the per-token loop in values and gradients under uneven loads
(one expert takes every token, one none); the CPU emulation of the ragged all-to-all
follows its contract; a capacity drops exactly the slots its rule names and counts them;
TPU and GPU programs hold the ragged all-to-all, CPU programs the dense one."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from lowering import lower_text
from test_moe import _values_and_grads

from experiments.models import moe
from experiments.models.moe import MoEConfig, MoEFFN
from experiments.models.moe import reference as moe_reference
from experiments.models.moe.exchange import (
  dense_ragged_all_to_all,
  inverse_permutation,
  permute_rows,
  ragged_exchange,
)
from experiments.models.moe.parallel import buffer_rows
from experiments.trainer.placement import make_train_mesh

needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
D, E, K = 8, 8, 2


def _module(dtype=jnp.float32, **fields):
  config = MoEConfig(d_model=D, n_experts=E, top_k=K, expert_ffn_dim=6, n_shared_experts=1,
                     norm_topk_prob=True, bias_update_rate=0.01, **fields)
  module = MoEFFN(config, dtype=dtype, param_dtype=dtype, init_std=0.5, rngs=nnx.Rngs(3))
  # Uneven loads: every token picks expert 3 (its bias outweighs any probability), no
  # token picks expert 5; the other slot spreads over the rest.
  module.expert_bias[...] = jnp.zeros(E, jnp.float32).at[3].set(2.0).at[5].set(-2.0)
  return module


def _x(dtype=jnp.float32, shape=(8, 6, D)):
  return jax.random.normal(jax.random.key(1), shape, dtype)


def _loads(module, x):
  _, experts, _ = moe.route(x.reshape(-1, D), module.router[...], module.expert_bias[...],
                            top_k=K, norm_topk_prob=True)
  return np.bincount(np.asarray(experts).ravel(), minlength=E)


@needs_8
@pytest.mark.parametrize("mesh", [dict(expert=4), dict(data=2, expert=2), dict(expert=8),
                                  dict(fsdp=2, expert=4), dict(seq=2, expert=2),
                                  dict(table=2, expert=2), dict(data=4)])
def test_the_all_to_all_dispatch_equals_the_per_token_loop(mesh):
  module, x = _module(), _x()
  loads = _loads(module, x)
  assert loads[3] == 48 and loads[5] == 0   # every token's first choice; nobody's
  mesh = make_train_mesh(mesh)
  y, grads = _values_and_grads(lambda m, x: m(x, mesh=mesh)[0], module, x)
  y_ref, grads_ref = _values_and_grads(moe_reference.moe_forward_loop, module, x)
  chex.assert_trees_all_close(y, y_ref, rtol=2e-5, atol=2e-5)
  chex.assert_trees_all_close(grads, grads_ref, rtol=2e-4, atol=2e-5)
  assert float(jnp.abs(grads[0]["w_up"][3]).max()) > 0 and not np.asarray(grads[0]["w_up"][5]).any()


@needs_8
def test_float64_stays_float64_on_an_expert_mesh():
  with jax.enable_x64(True):
    module, x = _module(jnp.float64), _x(jnp.float64)
    mesh = make_train_mesh(dict(expert=4))
    y, grads = _values_and_grads(lambda m, x: m(x, mesh=mesh)[0], module, x)
    y_ref, grads_ref = _values_and_grads(moe_reference.moe_forward_loop, module, x)
    chex.assert_type(y, jnp.float64)
    chex.assert_trees_all_equal_dtypes(grads, grads_ref)
    chex.assert_trees_all_close(y, y_ref, rtol=1e-12, atol=1e-12)
    chex.assert_trees_all_close(grads, grads_ref, rtol=1e-10, atol=1e-12)


def _ragged_model(operands, outputs, in_off, send, out_off, recv):
  """`ragged_all_to_all`'s documented contract, device by device, in numpy."""
  n = len(operands)
  outs = [o.copy() for o in outputs]
  for i in range(n):
    for j in range(n):
      assert send[i][j] == recv[j][i]
      rows = operands[i][in_off[i][j]:in_off[i][j] + send[i][j]]
      outs[j][out_off[i][j]:out_off[i][j] + send[i][j]] = rows
  return outs


@needs_8
def test_the_dense_emulation_keeps_the_ragged_all_to_all_contract():
  n, S, R, W = 4, 6, 9, 3
  rng = np.random.default_rng(0)
  send = np.array([[2, 0, 3, 1], [0, 0, 0, 6], [1, 1, 1, 1], [0, 2, 0, 0]])
  in_off = np.array([np.concatenate([[0], np.cumsum(s)[:-1]]) for s in send])
  # Each receiver stacks its senders in order, starting at row 1 (row 0 keeps its value).
  out_off = 1 + np.concatenate([np.zeros((1, n), int), np.cumsum(send, 0)[:-1]], 0)
  recv = send.T
  operands = rng.normal(size=(n, S, W)).astype(np.float32)
  outputs = rng.normal(size=(n, R, W)).astype(np.float32)
  want = _ragged_model(operands, outputs, in_off, send, out_off, recv)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("expert",))
  fn = jax.jit(jax.shard_map(
      lambda a, b, c, d, e, f: dense_ragged_all_to_all(a[0], b[0], c[0], d[0], e[0], f[0],
                                                       axis_name="expert")[None],
      mesh=mesh, in_specs=(P("expert"),) * 6, out_specs=P("expert")))
  args = [jnp.asarray(a) for a in (operands, outputs, in_off, send, out_off, recv)]
  args = [jax.device_put(a, NamedSharding(mesh, P("expert"))) for a in args]
  np.testing.assert_array_equal(np.asarray(fn(*args)), np.stack(want))


@needs_8
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_exchange_gradient_is_the_dense_emulation_gradient(dtype):
  """`ragged_exchange`'s own backward (the reverse exchange into a counted zero buffer,
  a row mask for the output) gives the operand and the output buffer the cotangents
  jax's autodiff of the dense emulation gives, float64 staying float64."""
  n, S, R, W = 4, 6, 9, 3
  rng = np.random.default_rng(1)
  send = np.array([[2, 0, 3, 1], [0, 0, 0, 6], [1, 1, 1, 1], [0, 2, 0, 0]])
  in_off = np.array([np.concatenate([[0], np.cumsum(s)[:-1]]) for s in send])
  out_off = 1 + np.concatenate([np.zeros((1, n), int), np.cumsum(send, 0)[:-1]], 0)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("expert",))

  def vjp_of(exchange):
    def body(a, b, c, d, e, f, t):
      out, pull = jax.vjp(lambda a, b: exchange(a, b, c[0], d[0], e[0], f[0],
                                                axis_name="expert"), a[0], b[0])
      return (out[None], *(g[None] for g in pull(t[0])))
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("expert"),) * 7,
                                 out_specs=(P("expert"),) * 3))

  with jax.enable_x64(dtype == np.float64):
    args = [rng.normal(size=(n, S, W)).astype(dtype), rng.normal(size=(n, R, W)).astype(dtype),
            in_off, send, out_off, send.T, rng.normal(size=(n, R, W)).astype(dtype)]
    args = [jax.device_put(jnp.asarray(a), NamedSharding(mesh, P("expert"))) for a in args]
    got = vjp_of(ragged_exchange)(*args)
    want = vjp_of(dense_ragged_all_to_all)(*args)
  for g, w in zip(got, want, strict=True):
    assert g.dtype == dtype
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_permuted_rows_differentiate_as_the_gather_they_are():
  """`permute_rows` (backward: the gather by the inverse permutation) against jax's own
  gradient of x[order], float64."""
  with jax.enable_x64(True):
    x_RxD = jnp.asarray(np.random.default_rng(2).normal(size=(7, 3)))
    order_R = jnp.asarray([3, 0, 6, 1, 5, 2, 4])
    t_RxD = jnp.asarray(np.random.default_rng(3).normal(size=(7, 3)))
    got_y, pull = jax.vjp(lambda x: permute_rows(x, order_R), x_RxD)
    want_y, want_pull = jax.vjp(lambda x: x[order_R], x_RxD)
    (got_t,), (want_t,) = pull(t_RxD), want_pull(t_RxD)
    assert got_t.dtype == jnp.float64
  np.testing.assert_array_equal(got_y, want_y)
  np.testing.assert_array_equal(got_t, want_t)
  np.testing.assert_array_equal(inverse_permutation(order_R)[order_R], np.arange(7))


def _dropped_slots(experts_NxK, n, capacity_factor):
  """The capacity rule of moe/parallel.py in numpy: {(token, j)} dropped, for tokens
  split in n equal blocks over `expert`."""
  N = experts_NxK.shape[0]
  blocks = np.split(np.arange(N), n)
  L = E // n
  S = len(blocks[0]) * K
  R = buffer_rows(S, n, capacity_factor)
  runs = []   # runs[i][j]: sender i's slots for device j, in sorted (expert, slot) order
  for rows in blocks:
    slots = [(int(experts_NxK[t, j]), t, j) for t in rows for j in range(K)]
    order = sorted(range(len(slots)), key=lambda s: (slots[s][0], s))
    runs.append([[slots[s][1:] for s in order if slots[s][0] // L == d] for d in range(n)])
  dropped = set()
  for j in range(n):
    room = R
    for i in range(n):
      run = runs[i][j]
      dropped |= set(run[max(room, 0):])
      room -= len(run)
  return dropped


@needs_8
@pytest.mark.parametrize("capacity_factor", [1.0, 1.5])
def test_a_capacity_drops_the_slots_its_rule_names_and_counts_them(capacity_factor):
  module, x = _module(capacity_factor=capacity_factor), _x()
  mesh = make_train_mesh(dict(expert=4))
  y, aux = jax.jit(lambda x: module(x, mesh=mesh))(x)
  x_NxD = x.reshape(-1, D)
  _, experts, gates = moe.route(x_NxD, module.router[...], module.expert_bias[...], top_k=K,
                                norm_topk_prob=True)
  dropped = _dropped_slots(np.asarray(experts), 4, capacity_factor)
  assert int(aux["dropped"]) == len(dropped) > 0
  keep = np.ones(experts.shape, bool)
  for t, j in dropped:
    keep[t, j] = False
  s = module.shared
  want = (moe_reference.experts_loop(x_NxD, experts, jnp.where(keep, gates, 0),
                                     module.w_gate[...], module.w_up[...], module.w_down[...])
          + s(x_NxD[None])[0])
  np.testing.assert_allclose(y.reshape(-1, D), want, rtol=2e-5, atol=2e-5)
  # One device (or a roomy capacity) drops nothing and reports 0.
  assert int(module(x)[1]["dropped"]) == 0
  roomy = _module(capacity_factor=4.0)
  assert int(jax.jit(lambda x: roomy(x, mesh=mesh))(x)[1]["dropped"]) == 0


def test_buffer_rows():
  assert buffer_rows(64, 4, 0.0) == 256            # dropless: every slot of every sender
  assert buffer_rows(64, 4, 1.25) == 80            # ceil(1.25 · 64), a multiple of 8
  assert buffer_rows(10, 4, 1.0) == 16
  assert buffer_rows(64, 4, 9.0) == 256            # never more than dropless


def test_tpu_and_gpu_programs_hold_the_ragged_all_to_all():
  module = _module()
  mesh = jax.sharding.AbstractMesh((1, 1, 1, 1, 4), ("data", "fsdp", "seq", "table", "expert"),
                                   axis_types=(jax.sharding.AxisType.Auto,) * 5)
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)

  def loss(params, x):
    return jnp.sum(nnx.merge(graphdef, params, rest)(x, mesh=mesh)[0])

  avals = (jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params),
           jax.ShapeDtypeStruct((8, 6, D), jnp.float32))
  grad = functools.partial(jax.grad(loss))
  for platform in ("tpu", "cuda"):
    text = lower_text(grad, avals, platform)
    assert "ragged_all_to_all" in text, platform
  cpu = lower_text(grad, avals, "cpu")
  assert "ragged_all_to_all" not in cpu and "all_to_all" in cpu


def test_the_dropped_count_is_a_train_metric():
  from experiments.jobs import metrics
  aux = {"moe/0/balance_loss": jnp.ones(()), "moe/0/expert_load": jnp.full((E,), 1 / E),
         "moe/0/dropped": jnp.asarray(7, jnp.int32)}
  _, logged = metrics.moe_loss_terms(aux, MoEConfig(d_model=D, capacity_factor=1.0))
  assert float(logged["train/moe/0/dropped"]) == 7.0
  del aux["moe/0/dropped"]   # dropless: no such metric
  assert "train/moe/0/dropped" not in metrics.moe_loss_terms(aux, MoEConfig(d_model=D))[1]
