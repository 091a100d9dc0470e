"""The checks every memory-slot arm passes, over the branch protocol alone.

An arm is a module with `forward(x, ctx)`, `prefill(x, ctx)`,
`decode_step(x_Bx1xD, state, ctx)` and `init_decode_state(batch, ctx)`
(experiments/models/branches.py). These helpers feed it random inputs and
token ids through a `BranchContext`, as the decoder's memory slot does.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.branches import BranchContext


def random_inputs(d_model, *, batch=2, length=12, seed=0, vocab=256):
  """x [B, T, D] float32 and token ids [B, T] int32."""
  kx, kt = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(kx, (batch, length, d_model), jnp.float32)
  tokens = jax.random.randint(kt, (batch, length), 0, vocab, dtype=jnp.int32)
  return x, tokens


def run(branch, x, tokens, *, segment_ids=None, valid=None):
  """The branch's parallel output y [B, T, D]."""
  ctx = BranchContext(tokens_BxT=tokens, segment_ids_BxT=segment_ids, valid_BxT=valid)
  return branch.forward(x, ctx)[0]


def assert_causal(branch, x, tokens, *, atol=0.0):
  """d y[:, t] / d x[:, s] == 0 for every s > t, and y[:, :t] ignores tokens after t."""
  T = x.shape[1]
  # One compiled gradient for every t (t is traced): eagerly, each would run op by op.
  grad_at = jax.jit(jax.grad(lambda x_, t: run(branch, x_, tokens)[:, t].sum()))
  for t in (0, T // 2, T - 2):
    g_later = grad_at(x, t)[:, t + 1:]
    chex.assert_trees_all_close(g_later, jnp.zeros_like(g_later), rtol=0, atol=atol,
                                custom_message=f"output at {t} depends on later inputs")
    changed = tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 7) % 256)
    np.testing.assert_allclose(np.asarray(run(branch, x, changed)[:, :t + 1]),
                               np.asarray(run(branch, x, tokens)[:, :t + 1]), rtol=0, atol=atol,
                               err_msg=f"output up to {t} depends on later token ids")


def assert_segments_independent(branch, x, tokens, *, split, rtol=1e-5, atol=1e-6):
  """A row packing [0, split) and [split, T) as two segments equals each run alone."""
  T = x.shape[1]
  seg = jnp.broadcast_to((jnp.arange(T) >= split).astype(jnp.int32) + 1, tokens.shape)
  packed = run(branch, x, tokens, segment_ids=seg)
  first = run(branch, x[:, :split], tokens[:, :split])
  second = run(branch, x[:, split:], tokens[:, split:])
  np.testing.assert_allclose(np.asarray(packed[:, :split]), np.asarray(first), rtol=rtol,
                             atol=atol, err_msg="first segment differs when packed")
  np.testing.assert_allclose(np.asarray(packed[:, split:]), np.asarray(second), rtol=rtol,
                             atol=atol, err_msg="second segment reads the first")


def assert_decode_matches_forward(branch, x, tokens, *, prompt, rtol=1e-5, atol=1e-6):
  """prefill over x[:, :prompt] then one decode_step per later position == forward."""
  full = run(branch, x, tokens)
  B = x.shape[0]
  lengths = jnp.full((B,), prompt, jnp.int32)
  valid = jnp.ones((B, prompt), bool)
  ctx = BranchContext(tokens_BxT=tokens[:, :prompt], lengths_B=lengths, valid_BxT=valid)
  y_prompt, state = branch.prefill(x[:, :prompt], ctx)
  np.testing.assert_allclose(np.asarray(y_prompt), np.asarray(full[:, :prompt]), rtol=rtol,
                             atol=atol, err_msg="prefill output differs from forward")
  step = nnx.jit(lambda b, xt, s, tok: b.decode_step(xt, s, BranchContext(tokens_BxT=tok)))
  for t in range(prompt, x.shape[1]):
    y_t, state = step(branch, x[:, t:t + 1], state, tokens[:, t:t + 1])
    np.testing.assert_allclose(np.asarray(y_t[:, 0]), np.asarray(full[:, t]), rtol=rtol,
                               atol=atol, err_msg=f"decode step at position {t}")


def assert_decode_from_empty_state(branch, x, tokens, *, rtol=1e-5, atol=1e-6):
  """init_decode_state then decode_step from position 0 == forward."""
  full = run(branch, x, tokens)
  state = branch.init_decode_state(x.shape[0], BranchContext())
  for t in range(x.shape[1]):
    ctx_t = BranchContext(tokens_BxT=tokens[:, t:t + 1])
    y_t, state = branch.decode_step(x[:, t:t + 1], state, ctx_t)
    np.testing.assert_allclose(np.asarray(y_t[:, 0]), np.asarray(full[:, t]), rtol=rtol,
                               atol=atol, err_msg=f"decode from empty state at {t}")


def assert_zero_at_init(branch, x, tokens):
  """The branch adds exactly nothing before training."""
  np.testing.assert_array_equal(np.asarray(run(branch, x, tokens)), 0.0)


def liven(branch, *, seed=3, std=0.5):
  """Every parameter redrawn nonzero (zero-init tables, conv taps, W_o ...), so a
  mask that leaks shows up in the output."""
  rng = np.random.default_rng(seed)
  for _, param in nnx.to_flat_state(nnx.state(branch, nnx.Param)):
    param[...] = jnp.asarray(std * rng.standard_normal(param.shape), param[...].dtype)
  return branch


def assert_nan_at_padding_is_ignored(branch, x, tokens, *, lengths=(5, 12)):
  """NaN at padding positions: the outputs (all finite, zero at padding), the
  aux loss and every gradient equal those of a zero padding."""
  B, T = tokens.shape
  valid = jnp.arange(T)[None] < jnp.asarray(lengths)[:, None]
  x_nan = jnp.where(valid[..., None], x, jnp.nan)
  x_zero = jnp.where(valid[..., None], x, 0.0)
  w = jax.random.normal(jax.random.key(11), x.shape)

  def loss(branch, x_):
    y, aux = branch.forward(x_, BranchContext(tokens_BxT=tokens, valid_BxT=valid))
    return jnp.sum(y * w) + aux.get("aux_loss", 0.0), y

  grads = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  (l_nan, y_nan), (g_nan, gx_nan) = grads(branch, x_nan)
  (l_zero, y_zero), (g_zero, gx_zero) = grads(branch, x_zero)
  chex.assert_tree_all_finite((l_nan, y_nan, g_nan, gx_nan))
  np.testing.assert_array_equal(np.asarray(y_nan)[~np.asarray(valid)], 0.0)
  # Loss, output and every gradient bit-identical (the trees' structures too).
  chex.assert_trees_all_equal((l_nan, y_nan, g_nan, gx_nan), (l_zero, y_zero, g_zero, gx_zero))


def assert_valid_of_twos_is_refused(branch, x, tokens):
  """A mask selects, it never scales: a concrete valid holding a 2 is an error."""
  import pytest
  twos = jnp.full(tokens.shape, 2, jnp.int32)
  with pytest.raises(ValueError, match=r"valid must be bool or hold only 0 and 1"):
    branch.forward(x, BranchContext(tokens_BxT=tokens, valid_BxT=twos))
