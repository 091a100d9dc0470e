"""The sink readout's values and gradients, compared with its XLA reference: what the
per-token and token-block kernel tests share.

    got = compare_with_reference(kernel, reference, (q, mem, dout, dlse), sink_logit, tol)

checks out, lse and the cotangents of q, mem and a traced b0 for cotangents (dout, dlse)
on both outputs, each against its own scale, and returns the kernel's five arrays.
"""

import functools

import chex
import jax
import jax.numpy as jnp
from tree_checks import relative_to_reference

OUTPUTS = ("out", "lse", "dq", "dmem", "d_sink")


def readout_inputs(N, Hq, R, D, dtype, seed=0):
  """q [N, Hq, D], mem [N, R, D] and the cotangents dout [N, Hq, D], dlse [N, Hq] (float32)."""
  kq, km, ko, kl = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(kq, (N, Hq, D), jnp.float32).astype(dtype)
  mem = jax.random.normal(km, (N, R, D), jnp.float32).astype(dtype)
  dout = jax.random.normal(ko, (N, Hq, D), jnp.float32).astype(dtype)
  dlse = jax.random.normal(kl, (N, Hq), jnp.float32)
  return q, mem, dout, dlse


@functools.partial(jax.jit, static_argnums=(0,))
def values_and_grads(readout, q, mem, sink_logit, dout, dlse):
  """out, lse and the cotangents of q, mem and b0 for (dout, dlse)."""
  (out, lse), vjp = jax.vjp(lambda q, m, b0: readout(q, m, sink_logit=b0), q, mem, sink_logit)
  return (out, lse, *vjp((dout, dlse)))


def compare_with_reference(readout, reference, args, sink_logit, tol):
  """The readout's five outputs against the reference's at relative tolerance `tol`."""
  q, mem, dout, dlse = args
  args = (q, mem, jnp.float32(sink_logit), dout, dlse)
  result = values_and_grads(readout, *args)
  got = dict(zip(OUTPUTS, result, strict=True))
  want = dict(zip(OUTPUTS, values_and_grads(reference, *args), strict=True))
  chex.assert_trees_all_equal_shapes_and_dtypes(got, want)
  chex.assert_tree_all_finite(got)
  # d_sink: a sum over N·Hq terms that largely cancel: absolute scale.
  d_sink, d_sink_ref = got.pop("d_sink"), want.pop("d_sink")
  assert abs(float(d_sink) - float(d_sink_ref)) < tol * float(jnp.sum(jnp.abs(dlse)) + 1.0), (
      d_sink, d_sink_ref)
  # The others against each one's own scale: max|got - want| <= tol·max|want|.
  chex.assert_trees_all_close(*relative_to_reference(got, want, floor=1e-30), rtol=0, atol=tol)
  return result
