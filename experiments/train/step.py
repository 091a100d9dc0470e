"""The jitted training step over a pure-dict train state, for any task's loss hook.

State: {"params": the trained module's Params as a pure dict, "opt_state":
optax state, "step": int32 steps taken}. The module is rebuilt inside the
trace with `nnx.merge(graphdef, params, rest)` (`rest`: its non-Param state,
passed through unchanged), so the step is an ordinary jax function of arrays:
it is jitted with the state donated and checkpointed with orbax as plain trees.

The loss hook is `loss_fn(module, batch) -> (loss, metrics)`; the step adds
train/loss, train/grad_norm, train/param_norm and train/lr.
"""

from __future__ import annotations

import jax
import optax
from flax import nnx


def make_train_step(graphdef, tx, lr_fn, loss_fn, *, phase_start: int = 0):
  """step(state, rest, batch) -> (state, metrics); jitted with the state donated.

  `lr_fn` is the phase's base schedule, read at the phase-local step
  (`state["step"] - phase_start`, which is also the optimiser's own count).
  """

  def step(state, rest, batch):
    def objective(params):
      return loss_fn(nnx.merge(graphdef, params, rest), batch)

    (loss, extra), grads = jax.value_and_grad(objective, has_aux=True)(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {
        "train/loss": loss,
        **extra,
        "train/grad_norm": optax.tree.norm(grads),
        "train/param_norm": optax.tree.norm(params),
        "train/lr": lr_fn(state["step"] - phase_start),
    }
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

  return jax.jit(step, donate_argnums=0)
