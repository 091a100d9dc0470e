"""The jitted training step over a pure-dict train state, for any task's loss hook.

State: {"params": the trained module's Params as a pure dict, "opt_state":
optax state, "step": int32 steps taken}. The module is rebuilt inside the
trace with `nnx.merge(graphdef, params, rest)` (`rest`: its non-Param state,
passed through unchanged), so the step is an ordinary jax function of arrays:
it is jitted with the state donated and checkpointed with orbax as plain trees.

The loss hook is `loss_fn(module, batch) -> (loss, metrics)`; the step adds
train/loss, train/grad_norm, train/param_norm and train/lr.

Gradient accumulation (`grad_accum=k`): the batch is split along its leading
axis into k micro-batches, run one after another (`lax.scan`, so only one
micro-batch's activations are alive), and their losses, metrics and gradients
averaged with weights: a loss hook that reports `WEIGHT` (its loss's
denominator, e.g. the tokens it averaged over) gets Σ w_i·loss_i / Σ w_i, the
full batch's mean exactly (up to float reassociation); otherwise micro-batches
weigh equally. One optimiser update per step either way.

Parameters set by a rule instead of the optimiser (the MoE FFN's routing bias,
which no gradient reaches: experiments/models/moe/layer.py): a loss hook may report
`RULE_UPDATES`, a pure-dict subtree of the parameters holding their next
values, computed from the step's forward; they replace whatever the optimiser
did to those leaves. With gradient accumulation they are the micro-batches'
weighted mean, like every metric.

Frozen leaves (`frozen`: a tree like the parameters, True where a leaf never trains,
`optimizer.frozen_mask`): the gradient is taken with respect to the other leaves only, so
the backward computes no weight gradient of a frozen layer (VLM Stage I: the whole
backbone) and accumulation carries none; their gradients enter the optimiser as zeros,
which its frozen group ignores. train/grad_norm is therefore that of the trained leaves,
the norm the optimiser clips.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

WEIGHT = "weight"   # a loss hook's metric: the denominator of its mean loss
RULE_UPDATES = "rule_updates"   # a loss hook's metric: next values of rule-set parameters


def overlay(params, updates):
  """`params` with the leaves named in the pure-dict subtree `updates` replaced
  (cast to their dtypes)."""
  if not isinstance(updates, dict):
    return jnp.asarray(updates).astype(params.dtype)
  params = dict(params)
  for key, sub in updates.items():
    params[key] = overlay(params[key], sub)
  return params


def make_train_step(graphdef, tx, lr_fn, loss_fn, *, phase_start: int = 0,
                    grad_accum: int = 1, out_shardings=None, frozen=None):
  """step(state, rest, batch) -> (state, metrics); jitted with the state donated.

  `out_shardings`: (state's, metrics') shardings on a device mesh (the loop's
  `Placement.step_out_shardings`), so the state keeps its layout; None lets XLA choose.
  `lr_fn` is the phase's base schedule, read at the phase-local step
  (`state["step"] - phase_start`, which is also the optimiser's own count).
  `grad_accum` splits each batch into that many micro-batches (module docstring).
  `frozen`: a bool tree like the parameters (True: never trained), or None (module
  docstring).
  """
  if not isinstance(grad_accum, int) or grad_accum < 1:
    raise ValueError(f"train.grad_accum={grad_accum!r} must be a positive int.")
  frozen_leaves = None if frozen is None else [bool(f) for f in jax.tree.leaves(frozen)]
  grad_fn = _grad_fn(graphdef, loss_fn, frozen_leaves)

  def step(state, rest, batch):
    if grad_accum == 1:
      (loss, extra), grads = grad_fn(state["params"], rest, batch)
      extra = {k: v for k, v in extra.items() if k != WEIGHT}
    else:
      (loss, extra), grads = _accumulated(grad_fn, state["params"], rest, batch,
                                          grad_accum=grad_accum, frozen_leaves=frozen_leaves)
    grads = _with_frozen(state["params"], grads, frozen_leaves, fill=jnp.zeros_like)
    rules = extra.pop(RULE_UPDATES, None)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    if rules is not None:   # after the gradient step, outside the gradient
      params = overlay(params, jax.lax.stop_gradient(rules))
    metrics = {
        "train/loss": loss,
        **extra,
        "train/grad_norm": optax.tree.norm(grads),
        "train/param_norm": optax.tree.norm(params),
        "train/lr": lr_fn(state["step"] - phase_start),
    }
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

  if out_shardings is None:
    return jax.jit(step, donate_argnums=0)
  return jax.jit(step, donate_argnums=0, out_shardings=out_shardings)


def _trained(params, frozen_leaves):
  """The leaves the gradient is taken with respect to (all of `params` if none is frozen)."""
  if frozen_leaves is None:
    return params
  leaves = jax.tree.leaves(params)
  if len(leaves) != len(frozen_leaves):
    raise ValueError(f"make_train_step: the frozen mask has {len(frozen_leaves)} leaves, "
                     f"the parameters {len(leaves)}.")
  return [x for x, f in zip(leaves, frozen_leaves, strict=True) if not f]


def _with_frozen(params, trained_leaves, frozen_leaves, fill=None):
  """`params` with its trained leaves replaced (frozen ones kept, or `fill(x)`)."""
  if frozen_leaves is None:
    return trained_leaves
  leaves, treedef = jax.tree.flatten(params)
  new = iter(trained_leaves)
  return jax.tree.unflatten(treedef, [(x if fill is None else fill(x)) if f else next(new)
                                      for x, f in zip(leaves, frozen_leaves, strict=True)])


def _grad_fn(graphdef, loss_fn, frozen_leaves):
  """grad_fn(params, rest, batch) -> ((loss, metrics), gradients of the trained leaves):
  the loss hook on the module rebuilt from `params` and `rest`."""

  def objective(params, rest, batch):
    return loss_fn(nnx.merge(graphdef, params, rest), batch)

  def grad_fn(params, rest, batch):
    def of_trained(leaves):
      return objective(_with_frozen(params, leaves, frozen_leaves), rest, batch)
    return jax.value_and_grad(of_trained, has_aux=True)(_trained(params, frozen_leaves))

  return grad_fn


def _accumulated(grad_fn, params, rest, batch, *, grad_accum: int, frozen_leaves):
  """`grad_fn` over `grad_accum` micro-batches of `batch`, their losses, metrics and
  gradients averaged with the loss hook's `WEIGHT` (module docstring)."""
  def split(x):
    if x.shape[0] % grad_accum:
      raise ValueError(f"train.grad_accum={grad_accum} does not divide the batch of "
                       f"{x.shape[0]} rows.")
    return x.reshape(grad_accum, x.shape[0] // grad_accum, *x.shape[1:])

  def micro(carry, mb):
    (loss, extra), grads = grad_fn(params, rest, mb)
    w = extra.pop(WEIGHT, jnp.ones((), jnp.float32)).astype(jnp.float32)
    scaled = jax.tree.map(lambda a: w * a.astype(jnp.float32), (loss, extra, grads))
    total = scaled if carry is None else jax.tree.map(jnp.add, carry[0], scaled)
    return (total, (w if carry is None else carry[1] + w)), None

  # The first micro-batch seeds the carry's structure; the rest are scanned.
  micro_batches = jax.tree.map(split, batch)
  first = jax.tree.map(lambda x: x[0], micro_batches)
  rest_mb = jax.tree.map(lambda x: x[1:], micro_batches)
  carry, _ = micro(None, first)
  carry, _ = jax.lax.scan(micro, carry, rest_mb)
  (loss, extra, grads), weight = carry
  loss, extra, grads = jax.tree.map(lambda a: a / weight, (loss, extra, grads))
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, _trained(params, frozen_leaves))
  return (loss, extra), grads
