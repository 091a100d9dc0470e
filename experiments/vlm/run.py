"""VLM stages as tasks of the one training loop, and the analyses of a finished run.

    vlm_task(config, workdir)    stage 0 "pretrain", Stage I "sft" or Stage II "grpo"
    run_stage(config, workdir)   trains (or resumes) that stage: experiments.train.train
    analyze(workdir, ...)        the analyses of experiments.vlm.analysis on a finished run

A VLM run directory is a run directory like any other (orbax checkpoints with
the data state, metrics.jsonl, loss_curve.png; resumable after a kill) plus
data/ (the rendered scenes, cached unless vlm.scenes.data_dir says where),
accuracy_by_length.json/.png and metrics.json (stage, history, timings,
evaluation, branch) once the stage has finished. Stages I and II start from
the checkpoint of the run in `vlm.stage.init_from`; parameters the earlier
stage lacks (the new branch) keep their init, so Stage I starts exactly at
the base model.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import jax
import ml_collections
from flax import nnx

from experiments.train import writers
from experiments.train.task import Task, saved_config
from experiments.vlm import analysis
from experiments.vlm import train as train_lib
from experiments.vlm.config import vlm_config
from experiments.vlm.data import SceneData, SceneSampler
from experiments.vlm.grounding import grounding_probe
from experiments.vlm.grpo import grpo_hooks
from experiments.vlm.model import VLM
from pvm_jax.data import SceneConfig
from pvm_jax.data.emoji_classes import CLASS_NAMES

log = logging.getLogger("experiments")
STAGES = ("pretrain", "sft", "grpo")
ANALYSES = ("attention", "accuracy", "logit_lens", "grounding")


def scene_config(config, max_objects: int | None = None) -> SceneConfig:
  sc = config.vlm.scenes
  k = sc.max_objects if max_objects is None else max_objects
  return SceneConfig(rows=sc.rows, cols=sc.cols, min_objects=sc.min_objects,
                     max_objects=k or None, glyph_size=sc.glyph_size)


def split_data(config, workdir, split: str, n: int, task: str | None = None,
               max_objects: int | None = None) -> SceneData:
  sc = config.vlm.scenes
  # Scenes are rendered once into data_dir (default <workdir>/data) and reused.
  cache_dir = Path(sc.data_dir) if sc.data_dir else Path(workdir) / "data"
  # Training scenes may come from another draw than the evaluation scenes, so a later
  # stage can train on scenes the earlier one never saw (vlm.scenes.train_scene_seed).
  seed = sc.scene_seed
  if split == "train" and sc.train_scene_seed >= 0:
    seed = sc.train_scene_seed
  return SceneData(cache_dir, scene_config(config, max_objects), split, n, seed=seed,
                   task=task or sc.task, filler_per_item=sc.filler_per_item)


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


def _check_stage(config) -> list[tuple[int, int | None]]:
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


def build_model(config):
  """The VLM with the earlier stage's parameters loaded (if init_from is set)."""
  model = VLM(vlm_config(config), rngs=nnx.Rngs(config.train.seed))
  missing = []
  if config.vlm.stage.init_from:
    missing = train_lib.load_params(model, config.vlm.stage.init_from)
  return model, missing


def vlm_task(config, workdir) -> Task:
  """The task of one VLM stage (experiments/configs/vlm_*.py) for the one loop."""
  v, st = config.vlm, config.vlm.stage
  phases = _check_stage(config)
  workdir = Path(workdir)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=1))
  model, missing = build_model(config)
  optim = ml_collections.ConfigDict(config.optim.to_dict())
  trained, loss, prepare, prefix, wrapper = model, train_lib.vlm_loss, None, "", {}
  if st.name == "grpo":
    data = split_data(config, workdir, "train", v.scenes.n_train, task="count")
    g = v.grpo
    ref = build_model(config)[0] if g.kl_coef else None   # the policy at the start
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
      from experiments.vlm.cell_loss import CellPretrainer
      trained = CellPretrainer(model, len(CLASS_NAMES), st.cell_loss_weight,
                               rngs=nnx.Rngs(config.train.seed + 1))
      loss, prefix = train_lib.cell_pretrainer_loss, "model/"
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
  return Task(
      kind="vlm", module=trained,
      saved_config=saved_config("vlm", config, vcfg, wrapper),
      batches=batches, loss=loss, optim=optim, phases=tuple(s for s, _ in phases),
      trainable=train_lib.trainable_mask(st.trainable, prefix=prefix), prepare=prepare,
      # The cell head restarts at its init each phase, as it did when every
      # phase built its own CellPretrainer (keeps RESULTS comparable).
      phase_reset=(lambda path: not path.startswith("model/")) if wrapper else None,
      finish=lambda module, summary: _finish(config, workdir, phases,
                                             module.model if wrapper else module, summary),
      tokens_per_step=tokens_per_step,
      description=(f"vlm {st.name}, branch {vcfg.branch} at {vcfg.branch_layers}, "
                   f"{len(missing)} params left at init, trainable {st.trainable}"))


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


def run_stage(config, workdir, *, callback=None) -> dict:
  """Trains (or resumes) one stage and evaluates it: the loop's result (metrics in "final")."""
  from experiments.train.loop import train
  return train(config, workdir, callback=callback)


def analyze(workdir, *, which=ANALYSES, n: int = 16, max_new_tokens: int | None = None) -> dict:
  """Runs the analyses on a finished run; writes <name>.json/.png into it."""
  unknown = set(which) - set(ANALYSES)
  if unknown:
    raise ValueError(f"analyze: unknown analyses {sorted(unknown)}.")
  from experiments.checkpoint.restore import restore_module

  workdir = Path(workdir).absolute()
  model, saved, _ = restore_module(workdir)
  if saved.get("kind") != "vlm":
    raise ValueError(f"analyze: {workdir} is not a VLM run (lngram-exp eval reads LM runs).")
  config = ml_collections.ConfigDict(saved["experiment"])
  sc = config.vlm.scenes
  val = split_data(config, workdir, "validation", max(n, config.vlm.eval.n),
                   task="caption" if sc.task == "caption" else "count")
  N = max_new_tokens or config.vlm.eval.max_new_tokens
  out = {}
  if "attention" in which:
    out["attention_decay"] = analysis.attention_decay(model, val, n=n, max_new_tokens=N)
  if "accuracy" in which:
    out["accuracy_by_length"] = analysis.accuracy_by_length(model, val, n=n, max_new_tokens=N)
  if "logit_lens" in which:
    out["logit_lens"] = analysis.logit_lens(model, val, n=n, max_new_tokens=N)
  if "grounding" in which:
    out["grounding"] = grounding_probe(model, val, n=n)
  for name, result in out.items():
    analysis.write_json_png(workdir, name, result)
  return out
