"""The LM job's plan hooks (`lngram-exp plan`, experiments/plan; the job's `planner()`).

    check_mesh(config, sizes)        refuses a mesh the config cannot use, in one line
    abstract_run(config, mesh)       (AbstractRun, None, None): the LM task's model
                                     (nnx.eval_shape), its parameters and AdamW state as
                                     ShapeDtypeStructs carrying the trainer's shardings,
                                     an abstract batch, and the train step as the loop
                                     builds it
    counts(config, run, mc, geo, devices, token_shards)   parameters and FLOPs by
                                     formula, the activation estimate, the step's rows
    model_config(config)             the LMConfig a config trains, from shapes alone

The state is `experiments.trainer.state.abstract_train_state` (the trainer's placement,
the LM's rules from `experiments.models.layout`); the step is its `step_fn`, with the LM
loss traced on the mesh (`lm_loss(mesh=...)`, so Lngram runs its sharded form). Only
the compile needs devices (experiments/plan).
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax.numpy as jnp

from experiments.jobs.abstract import AbstractRun
from experiments.jobs.registry import job_name
from experiments.models.config import LMConfig

# The LM batch (experiments/data): int32 token arrays and a float32 loss mask, [B, T].
BATCH_DTYPES = {"inputs": jnp.int32, "targets": jnp.int32, "segment_ids": jnp.int32,
                "positions": jnp.int32, "loss_mask": jnp.float32}


def model_config(config) -> LMConfig:
  """The LM a config trains: `init_from=hf:DIR` reads DIR's config.json (no tensor);
  token data with model.vocab_size 0 takes the prepare-data directory's vocabulary."""
  from experiments.hf.backbone import with_hf_backbone
  from experiments.models.config import lm_config
  if job_name(config) != "lm":
    raise ValueError(f"plan: a {job_name(config)} config's model is not an LM "
                     "(each job's planner() plans its own).")
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


def check_mesh(config, sizes: dict) -> None:
  """One-line refusals of a mesh the LM cannot be split over."""
  from jax.sharding import AbstractMesh

  from experiments.jobs import checks
  from experiments.models.layout import check_expert_axis
  from experiments.trainer.placement import AXES
  checks.check_blocks(config)
  mesh = AbstractMesh(tuple(sizes[a] for a in AXES), tuple(AXES))
  model = model_config(config)
  if getattr(model, "moe_layers", ()):   # each `expert` device holds whole experts
    check_expert_axis(model.moe.n_experts, mesh)
  checks.check_fits(mesh, batch_size=int(config.data.batch_size),
                    seq_len=int(config.data.seq_len), memory=model.memory)


def abstract_run(config, mesh) -> tuple[AbstractRun, None, None]:
  """The run's train step and abstract state on `mesh` (module docstring)."""
  import jax
  from flax import nnx

  from experiments.jobs.lm.task import lm_loss
  from experiments.models import DecoderLM, layout
  from experiments.models.lora import lora_trainable
  from experiments.trainer import optimizer as optim_lib
  from experiments.trainer import placement as mesh_lib
  from experiments.trainer.state import abstract_train_state
  model = model_config(config)
  module = nnx.eval_shape(lambda: DecoderLM(model, rngs=nnx.Rngs(params=0)))
  steps = int(config.train.steps)
  # LoRA: the backbone frozen, as the LM task trains it (only what trains has AdamW state).
  trainable = lora_trainable if model.lora is not None else None
  train = abstract_train_state(module, config.optim, steps, mesh, trainable=trainable,
                               rules=layout.placement_rules(module))
  step = train.step_fn(0, functools.partial(lm_loss, mesh=mesh),
                       optim_lib.learning_rate_schedule(config.optim, steps),
                       grad_accum=int(config.train.get("grad_accum", 1)))
  B, T = int(config.data.batch_size), int(config.data.seq_len)
  batch = {name: jax.ShapeDtypeStruct(
      (B, T), dtype, sharding=mesh_lib.batch_sharding(mesh, 2, tokens=True))
      for name, dtype in BATCH_DTYPES.items()}
  return AbstractRun(model, mesh, train.state, train.rest, batch, step, B * T), None, None


def counts(config, run, mc, geo, devices: int, token_shards: int) -> dict:
  """Parameters and FLOPs by formula (experiments/models/counts.py), the activation
  estimate (`experiments.jobs.checks.memory_plan`), the step's rows and length."""
  del mc, geo
  from experiments.jobs import checks
  from experiments.models.counts import param_count, train_flops
  B, T = int(config.data.batch_size), int(config.data.seq_len)
  return {"counts": param_count(run.model), "batch": B, "seq_len": T, "vl": None,
          "estimate": checks.memory_plan(config, devices, token_shards=token_shards),
          "formula": train_flops(run.model, batch=B, seq_len=T)}
