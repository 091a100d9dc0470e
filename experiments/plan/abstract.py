"""A run's train step on its mesh, built from shapes alone and compiled: nothing allocated.

    run = abstract_run(config, mesh)   the LM task's model (nnx.eval_shape), its
                                       parameters and AdamW state as ShapeDtypeStructs
                                       carrying the trainer's shardings, an abstract
                                       batch, and the train step as the loop builds it

The step is `experiments.trainer.step.make_train_step` with the LM loss traced
on the mesh (`lm_loss(mesh=...)`, so Lngram runs its sharded form) and the
state's out_shardings, as `TrainState.step_fn` makes it; the shardings are the
trainer's placement (`experiments.trainer.placement`, the LM's rules from
`experiments.models.layout`). Only the compile needs devices: the mesh's devices
are this process's CPU devices (experiments/cli/commands/plan.py provides enough) or
those of a TPU topology (experiments/plan/tpu.py). Compiling for XLA:CPU with LLVM
optimisation off (`FAST_COMPILE`) keeps the HLO, its cost and memory analysis and
every collective the same; only machine code differs (experiments/plan/report.py
compiles).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from experiments.hf.backbone import with_hf_backbone
from experiments.jobs.lm.task import lm_loss
from experiments.jobs.registry import job_name
from experiments.models import DecoderLM, layout
from experiments.models.config import LMConfig, lm_config
from experiments.models.lora import lora_trainable
from experiments.trainer import optimizer as optim_lib
from experiments.trainer import placement as mesh_lib
from experiments.trainer import step as step_lib

FAST_COMPILE = {"xla_backend_optimization_level": 0}
# The LM batch (experiments/data): int32 token arrays and a float32 loss mask, [B, T].
BATCH_DTYPES = {"inputs": jnp.int32, "targets": jnp.int32, "segment_ids": jnp.int32,
                "positions": jnp.int32, "loss_mask": jnp.float32}


@dataclasses.dataclass
class AbstractRun:
  """model: the LMConfig; mesh; state {"params", "opt_state", "step"} and rest:
  ShapeDtypeStructs with shardings; batch: the abstract global batch; step: the
  jitted train step; tokens: per step (global)."""

  model: LMConfig
  mesh: Any
  state: dict
  rest: dict
  batch: dict
  step: Any
  tokens: int


def model_config(config) -> LMConfig:
  """The LM a config trains: `init_from=hf:DIR` reads DIR's config.json (no tensor);
  token data with model.vocab_size 0 takes the prepare-data directory's vocabulary."""
  if job_name(config) != "lm":
    raise ValueError(f"plan: a {job_name(config)} config's model is not an LM "
                     "(experiments/plan/jobs.py plans each job).")
  config = with_hf_backbone(config)
  model = lm_config(config)
  if (config.data.get("kind", "bytes") == "tokens"
      and not config.model.get("vocab_size")):
    from experiments.data.tokens.format import read_manifest
    from experiments.data.tokens.run import model_vocab, vocab_size
    path = config.data.get("path", "")
    if not path:
      raise ValueError("plan: model.vocab_size=0 takes the token data's vocabulary: give "
                       "--config.data.path=<a prepare-data directory> or "
                       "--config.model.vocab_size=<V>.")
    model = model_vocab(model, vocab_size(read_manifest(Path(path).expanduser()), 0, path))
  return model


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def abstract_run(config, mesh) -> AbstractRun:
  """The run's train step and abstract state on `mesh` (module docstring)."""
  model = model_config(config)
  module = nnx.eval_shape(lambda: DecoderLM(model, rngs=nnx.Rngs(params=0)))
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  rules = layout.placement_rules(module)
  param_sh = mesh_lib.shardings(mesh_lib.param_specs(params, mesh, rules=rules), mesh)
  replicated = NamedSharding(mesh, P())
  params = _abstract(params, param_sh)
  rest = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                      rest)
  steps = int(config.train.steps)
  # LoRA: the backbone frozen, as the LM task trains it (only what trains has AdamW state).
  trainable = lora_trainable if model.lora is not None else None
  tx = optim_lib.make_optimizer(config.optim, params, steps, trainable=trainable)
  opt = jax.eval_shape(tx.init, params)
  opt_sh = mesh_lib.like_params(opt, param_sh, mesh)
  state = {"params": params, "opt_state": _abstract(opt, opt_sh),
           "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
  lr_fn = optim_lib.learning_rate_schedule(config.optim, steps)
  step = step_lib.make_train_step(
      graphdef, tx, lr_fn, functools.partial(lm_loss, mesh=mesh),
      grad_accum=int(config.train.get("grad_accum", 1)),
      out_shardings=({"params": param_sh, "opt_state": opt_sh, "step": replicated},
                     replicated),
      frozen=optim_lib.frozen_mask(params, trainable, config.optim))
  B, T = int(config.data.batch_size), int(config.data.seq_len)
  batch = {name: jax.ShapeDtypeStruct(
      (B, T), dtype, sharding=mesh_lib.batch_sharding(mesh, 2, tokens=True))
      for name, dtype in BATCH_DTYPES.items()}
  return AbstractRun(model, mesh, state, rest, batch, step, B * T)


def bytes_per_device(tree) -> int:
  """Bytes one device holds of an abstract tree (each leaf's shard under its sharding;
  with uneven shards, the largest)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += jnp.dtype(leaf.dtype).itemsize * math.prod(shape)
  return total
