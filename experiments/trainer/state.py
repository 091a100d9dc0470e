"""`init_train_state`: the one place a run's train state is set up, on its mesh.

The module arrives initialised (its random draws are the task's, so the same
seed gives the same parameters with or without a mesh). Here it is split into
a graph definition, its parameters and the rest of its state (pure dicts, what
the jitted step and orbax see), every array is put into its shards
(experiments/trainer/placement.py), and the optimiser state is created directly
in the parameters' shards (`jit(tx.init, out_shardings=...)` over the abstract
shapes), one optimiser per phase. The training loop, the benchmarks and the
reproduction tools all build state through it; `abstract_train_state` builds the same
state from shapes alone (every array a ShapeDtypeStruct with the sharding it would get),
what `lngram-exp plan` compiles the step on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from experiments.trainer import optimizer as optim_lib
from experiments.trainer import step as step_lib
from experiments.trainer.placement import Placement, like_params


@dataclasses.dataclass
class TrainState:
  """A run's state on its mesh.

  graphdef: the module's structure (`nnx.merge(graphdef, state["params"], rest)`).
  state: {"params", "opt_state", "step"} (what the step donates and returns).
  rest: the module's non-parameter state, replicated, passed through the step.
  placement: where every array lives (`Placement`).
  txs: one optimiser per phase (`optimizer.make_optimizer`).
  frozen: True at each parameter that never trains (`optimizer.frozen_mask`), or None:
    the step differentiates the trained ones only.
  """

  graphdef: Any
  state: dict
  rest: dict
  placement: Placement
  txs: list[optax.GradientTransformation]
  frozen: Any = None

  def module(self) -> nnx.Module:
    """The module with the current parameters."""
    return nnx.merge(self.graphdef, self.state["params"], self.rest)

  def step_fn(self, phase: int, loss_fn, lr_fn, *, phase_start: int = 0, grad_accum: int = 1):
    """The jitted train step of `phase` (`step.make_train_step`), keeping the state's layout."""
    return step_lib.make_train_step(
        self.graphdef, self.txs[phase], lr_fn, loss_fn, phase_start=phase_start,
        grad_accum=grad_accum, out_shardings=self.placement.step_out_shardings(self.state),
        frozen=self.frozen)


def init_train_state(module: nnx.Module, optim, phases: Sequence[int], mesh: Mesh, *,
                     trainable: Callable[[str], bool] | None = None,
                     rules=None) -> TrainState:
  """The train state of `module` on `mesh`.

  Args:
    module: the initialised nnx module to train.
    optim: the `optim` config block (`optimizer.make_optimizer`).
    phases: steps per phase; each phase gets its own optimiser (schedule).
    mesh: the device mesh (a one-device mesh for a plain run).
    trainable: `path -> bool`, or None (all train).
    rules: the parameters' placement rule (`placement.param_spec`), or None.
  """
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  placed = Placement(mesh, params, rules=rules)
  params, rest = placed.put_params(params), placed.put_replicated(rest)
  txs = [optim_lib.make_optimizer(optim, params, steps, trainable=trainable)
         for steps in phases]
  state = {"params": params, "opt_state": placed.init_opt_state(txs[0], params),
           "step": placed.put_replicated(jnp.zeros((), jnp.int32))}
  return TrainState(graphdef, state, rest, placed, txs,
                    frozen=optim_lib.frozen_mask(params, trainable, optim))


def abstract_train_state(module: nnx.Module, optim, steps: int, mesh: Mesh, *,
                         trainable: Callable[[str], bool] | None = None,
                         rules=None) -> TrainState:
  """`init_train_state` of an abstract `module` (`nnx.eval_shape`) for one phase of
  `steps`, from shapes alone: every array a ShapeDtypeStruct carrying the sharding
  `init_train_state` gives it; nothing is allocated."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  placed = Placement(mesh, params, rules=rules)

  def shaped(tree, sharding):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, sharding)

  params = shaped(params, placed.params)
  rest = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=placed.replicated), rest)
  tx = optim_lib.make_optimizer(optim, params, steps, trainable=trainable)
  opt = jax.eval_shape(tx.init, params)
  state = {"params": params, "opt_state": shaped(opt, like_params(opt, placed.params, mesh)),
           "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=placed.replicated)}
  return TrainState(graphdef, state, rest, placed, [tx],
                    frozen=optim_lib.frozen_mask(params, trainable, optim))


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) that tell orbax how to restore `tree`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree)
