"""Rematerialisation whose recomputation waits for the backward to reach it.

    f_remat = recompute_after_cotangent(f)     f(*args) -> out, pytrees of arrays

`f_remat` computes f(*args) and keeps only `args` for the backward, like
`jax.checkpoint(f)`; its backward recomputes f's forward from `args` and pulls the
cotangent back through it. The difference is when its parts may run. Under
`jax.checkpoint` a block's recomputed forward depends only on its saved `args`,
and its weight gradients are off the path to the block below, so a compiler may
run either whenever it likes, and XLA does: in an unrolled 36-block decoder
(Qwen3-VL-8B, PVM Stage II, one 16,646-token row per device) XLA:GPU and XLA:TPU
let the input cotangent run ahead through ~17 blocks while postponing each
block's weight-gradient products, whose SwiGLU operands (390 MiB each) stayed
alive meanwhile: 53 GiB a GPU, 97 GiB a v5p chip. Here `args` and the incoming
cotangent pass through one `lax.optimization_barrier` before the recomputation
(block i is recomputed only once block i + 1's backward produced its cotangent),
and everything the backward returns passes through another (the input's
cotangent, which the block below waits for, is released only with the weights').
One block's recomputed activations are live at a time, as the reverse sweep
intends: 22.4 GiB a GPU, 28.4 GiB a chip (DESIGN.md §6.8).

Values and gradients equal `f`'s (tests/experiments/models/test_remat.py, float64,
against the plain function and `jax.checkpoint`). Reverse mode only: the wrapper is a
`jax.custom_vjp`, so forward-mode derivatives of it (jax.jvp, jax.hessian) are refused
by JAX. JAX re-binds a custom_vjp's backward under the call's source line, so the
recomputed and backward operations carry the wrapper's call line, not their own; their
name stacks keep the operations' names and scopes (the decoder block names its parts:
experiments/models/lm.py), which is how the plan's buffer listing tells them apart.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _is_float(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


def _tied(tree):
  """`tree` with its float leaves passed through one optimization barrier: none of them
  is available before all of them are computed."""
  leaves, treedef = jax.tree.flatten(tree)
  at = [i for i, x in enumerate(leaves) if _is_float(x)]
  tied = jax.lax.optimization_barrier([leaves[i] for i in at])
  for i, x in zip(at, tied, strict=True):
    leaves[i] = x
  return jax.tree.unflatten(treedef, leaves)


def recompute_after_cotangent(f):
  """f, rematerialised in the backward once the cotangent of its output has arrived
  (module docstring). `f`'s arguments and result: pytrees of arrays (None leaves and
  static pytree fields are fine; integer and boolean leaves get no cotangent)."""

  @jax.custom_vjp
  def remat_f(*args):
    return f(*args)

  def forward(*args):
    return f(*args), args

  def backward(args, cotangent):
    # The recomputation starts once this block's output cotangent exists ...
    args, cotangent = _tied((args, cotangent))
    _, pullback = jax.vjp(f, *args)
    # ... and no input cotangent leaves before every one is computed: the weight
    # gradients (off the path to the block below) cannot be deferred past it.
    return _tied(pullback(cotangent))

  remat_f.defvjp(forward, backward)
  return remat_f
