"""VLM stages as tasks of the trainer: stage 0 "pretrain", Stage I "sft", Stage II "grpo".

    vlm_task(config, workdir, mesh)   the task of the stage `vlm.stage.name` names
                                      (trained by `experiments.jobs.run_train`)

Stages I and II start from the checkpoint of the run in `vlm.stage.init_from`
(experiments/jobs/init_from.py); parameters the earlier stage lacks (the new
branch) keep their init, so Stage I starts exactly at the base model. On a
device mesh the VLM's forward is partitioned by XLA from the shardings of its
parameters and batch (its configs hold no Lngram layer).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import jax
import ml_collections
from flax import nnx

from experiments.analysis import vlm as analysis
from experiments.jobs.init_from import init_from
from experiments.jobs.saved import resume_check, saved_config
from experiments.jobs.vlm import loss as vlm_loss
from experiments.jobs.vlm.grpo import grpo_hooks
from experiments.trainer import Task, durable, writers
from experiments.vlm.emoji.emoji_classes import CLASS_NAMES
from experiments.vlm.tiny.config import vlm_config
from experiments.vlm.tiny.data import SceneSampler
from experiments.vlm.tiny.model import VLM
from experiments.vlm.tiny.scenes import scene_config, split_data

log = logging.getLogger("experiments")
STAGES = ("pretrain", "sft", "grpo")


def parse_curriculum(text: str) -> list[tuple[int, int]]:
  """"1800:2,1500:0" -> [(1800, 2), (1500, 0)]: phases of (steps, max objects; 0 = all).

  Stage 0 runs the phases in order, each a fresh optimiser state with its own
  warmup + cosine schedule over its steps, on scenes of at most that many
  objects. Few objects first is what makes the tiny LM learn to read the cell
  a caption names (experiments/RESULTS.md); the full range straight away
  never did.
  """
  phases = []
  for part in filter(None, (p.strip() for p in (text or "").split(","))):
    steps, sep, k = part.partition(":")
    if not sep or not steps.isdigit() or not k.isdigit() or int(steps) < 1:
      raise ValueError(f"vlm.stage.curriculum: phase {part!r} must be STEPS:MAX_OBJECTS with "
                       "STEPS >= 1 and MAX_OBJECTS >= 0 (0 = every count up to rows*cols).")
    phases.append((int(steps), int(k)))
  return phases


def check_stage(config) -> list[tuple[int, int | None]]:
  st = config.vlm.stage
  if st.name not in STAGES:
    raise ValueError(f"vlm.stage.name={st.name!r} is not one of {STAGES}.")
  if st.name != "pretrain" and not st.init_from:
    raise ValueError(f"vlm.stage.name={st.name!r} needs vlm.stage.init_from (the earlier "
                     "stage's run directory).")
  phases = parse_curriculum(st.curriculum)
  if phases and st.name != "pretrain":
    raise ValueError(f"vlm.stage.curriculum={st.curriculum!r} applies to stage 0 only "
                     f"(vlm.stage.name={st.name!r}).")
  return phases or [(config.train.steps, None)]


def build_model(config, model_config=None):
  """(the VLM with the earlier stage's parameters loaded if init_from is set, the
  parameter paths left at their init); `model_config`: vlm_config(config), if built."""
  model = VLM(model_config or vlm_config(config), rngs=nnx.Rngs(config.train.seed))
  missing = []
  if config.vlm.stage.init_from:
    missing = init_from(model, config.vlm.stage.init_from, kind="vlm")["missing"]
  return model, missing


def vlm_task(config, workdir, mesh=None, *, model_config=None) -> Task:
  """The task of one VLM stage (experiments/configs/vlm_*.py) for the trainer;
  `model_config`: vlm_config(config) when the job's check built it."""
  del mesh   # XLA partitions the VLM (module docstring)
  v, st = config.vlm, config.vlm.stage
  phases = check_stage(config)
  workdir = Path(workdir)
  durable.write_text(workdir / "config.json", config.to_json_best_effort(indent=1))
  model, missing = build_model(config, model_config)
  optim = ml_collections.ConfigDict(config.optim.to_dict())
  trained, loss, prepare, prefix, wrapper = model, vlm_loss.vlm_loss, None, "", {}
  if st.name == "grpo":
    data = split_data(config, workdir, "train", v.scenes.n_train, task="count")
    g = v.grpo
    ref = build_model(config, model_config)[0] if g.kl_coef else None   # the policy at the start
    prepare, loss = grpo_hooks(data, g, seed=config.train.seed, ref_model=ref)
    # Constant learning rate, no weight decay (the paper's Stage II).
    optim.update(lr=g.lr, weight_decay=0.0, warmup_steps=0, warmup_frac=0.0, min_lr_ratio=1.0)
    batches = SceneSampler([data], [config.train.steps], batch_size=g.prompts_per_step,
                           seed=config.train.seed, mode="prompts", group_size=g.group_size)
    # Sampled tokens per step (the forward over the prompts is not counted).
    tokens_per_step = g.prompts_per_step * g.group_size * g.max_new_tokens
  else:
    if st.name == "pretrain" and st.cell_loss_weight > 0:
      if st.trainable != "all":
        raise ValueError(f"vlm.stage.cell_loss_weight={st.cell_loss_weight} needs "
                         f"vlm.stage.trainable='all', got {st.trainable!r}.")
      from experiments.vlm.tiny.cell_loss import CellPretrainer, check_cell_geometry
      check_cell_geometry(v.scenes.glyph_size, v.encoder.patch_size)
      trained = CellPretrainer(model, len(CLASS_NAMES), st.cell_loss_weight,
                               rngs=nnx.Rngs(config.train.seed + 1))
      loss, prefix = vlm_loss.cell_pretrainer_loss, "model/"
      wrapper = {"wrapper": "cell_head", "n_classes": len(CLASS_NAMES),
                 "weight": st.cell_loss_weight}
    # The VLM recipe warms up over 10% of each phase unless optim.warmup_frac says otherwise.
    optim.warmup_frac = float(optim.get("warmup_frac", 0.1))
    loaders = [lambda k=k: split_data(config, workdir, "train", v.scenes.n_train, max_objects=k)
               for _, k in phases]
    batches = SceneSampler(loaders, [s for s, _ in phases], batch_size=config.data.batch_size,
                           seed=config.train.seed)
    # Visual + text positions per step, as the first phase's rows are padded.
    tokens_per_step = config.data.batch_size * (model.config.n_visual
                                                + batches.data(0).max_text)
  vcfg = model.config
  saved = saved_config("vlm", config, vcfg, wrapper)
  return Task(
      module=trained, saved_config=saved, check_resume=resume_check(config, saved),
      check_mesh=_check_mesh,
      batches=batches, loss=loss, optim=optim, phases=tuple(s for s, _ in phases),
      trainable=vlm_loss.trainable_mask(st.trainable, prefix=prefix), prepare=prepare,
      # The cell head restarts at its init each phase, as it did when every
      # phase built its own CellPretrainer (keeps RESULTS comparable).
      phase_reset=(lambda path: not path.startswith("model/")) if wrapper else None,
      finish=lambda module, summary: _finish(config, workdir, phases,
                                             module.model if wrapper else module, summary),
      tokens_per_step=tokens_per_step,
      description=(f"vlm {st.name}, branch {vcfg.branch} at {vcfg.branch_layers}, "
                   f"{len(missing)} params left at init, trainable {st.trainable}"))


def _check_mesh(mesh) -> None:
  if mesh.shape["seq"] > 1:
    raise ValueError(f"mesh.seq={mesh.shape['seq']}: only the byte LM splits time over "
                     "devices (context parallelism); use mesh.seq=1 for this run.")


def _finish(config, workdir, phases, model, summary) -> dict:
  """Evaluates the finished stage on the validation split; writes metrics.json."""
  v = config.vlm
  eval_task = "caption" if v.scenes.task == "caption" else "count"
  val = split_data(config, workdir, "validation", v.eval.n, task=eval_task)
  t1 = time.time()
  result = analysis.accuracy_by_length(model, val, n=v.eval.n,
                                       max_new_tokens=v.eval.max_new_tokens)
  analysis.write_json_png(workdir, "accuracy_by_length", result)
  rows = [r for r in writers.read_metrics(workdir) if "train/loss" in r]
  if v.stage.name == "grpo":
    history = {"reward": [r["train/reward"] for r in rows], "steps": [r["step"] for r in rows]}
  else:
    history = {"loss": [r["train/loss"] for r in rows], "steps": [r["step"] for r in rows],
               "phases": [{"steps": s, "max_objects": scene_config(config, k).k_max}
                          for s, k in phases]}
  metrics = {"stage": v.stage.name, "history": history,
             "train_seconds": summary["train_seconds"], "eval_seconds": time.time() - t1,
             "eval": result, "jax": jax.__version__, "branch": model.config.branch,
             "branch_layers": list(model.config.branch_layers)}
  (Path(workdir) / "metrics.json").write_text(json.dumps(metrics, indent=1))
  log.info("vlm %s done: eval %s", v.stage.name, result["overall"])
  return metrics
