"""Running a VLM stage from an experiment config (experiments/configs/vlm_*.py).

    run_stage(config, workdir)   stage 0 "pretrain", Stage I "sft" or Stage II "grpo"
    analyze(workdir, ...)        the analyses of experiments.vlm.analysis on a finished run

A run directory holds params.npz (+ params.json, the VLMConfig), config.json
(the experiment config), metrics.json (losses/rewards, evaluation, timings)
and data/ (the rendered scenes, cached). Stages I and II start from the
params.npz of `config.vlm.init_from`; parameters the earlier stage lacks (the
new branch) keep their init, so Stage I starts exactly at the base model.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import jax
from flax import nnx

from experiments.configs.base import lm_config
from experiments.vlm import analysis
from experiments.vlm import train as train_lib
from experiments.vlm.config import VLMConfig
from experiments.vlm.data import SceneData
from experiments.vlm.grounding import grounding_probe
from experiments.vlm.grpo import grpo_train
from experiments.vlm.model import VLM
from pvm_jax.config import PVMConfig
from pvm_jax.data import SceneConfig
from pvm_jax.data.emoji_classes import CLASS_NAMES
from pvm_jax.layers import select_layers

log = logging.getLogger("experiments.vlm")
STAGES = ("pretrain", "sft", "grpo")


def vlm_config(config) -> VLMConfig:
  """The VLMConfig an experiment config describes."""
  v = config.vlm
  lm = lm_config(config)
  g = v.glyph_size
  layers = ()
  if v.branch != "none":
    visual_mass = None
    if v.layer_strategy in ("peak", "max_decay"):
      decay = json.loads(Path(v.visual_mass_from, "attention_decay.json").read_text())
      visual_mass = [decay["layers"][str(i)]["mass"] for i in range(lm.n_layers)]
    layers = select_layers(v.layer_strategy, lm.n_layers, start=v.layer_start,
                           stride=v.layer_stride or None, count=v.layer_count or None,
                           layers=tuple(v.layers) or None, visual_mass=visual_mass)
  pvm = PVMConfig(d_model=lm.d_model, latent_dim=v.latent_dim, head_dim=v.pvm_head_dim,
                  backbone_gqa_ratio=lm.n_heads // lm.n_kv_heads, backbone_ffn_dim=lm.ffn_dim)
  return VLMConfig(lm=lm, image_hw=(v.rows * g, v.cols * g), patch_size=v.patch_size,
                   vit_dim=v.vit_dim, vit_layers=v.vit_layers, vit_heads=v.vit_heads,
                   vit_ffn=v.vit_ffn, visual_pos=bool(v.get("visual_pos", False)),
                   branch=v.branch, branch_layers=layers,
                   pvm=None if v.branch == "none" else pvm, pvm_source=v.pvm_source,
                   mlp_dim=v.mlp_dim or None)


def scene_config(config, max_objects: int | None = None) -> SceneConfig:
  v = config.vlm
  k = v.max_objects if max_objects is None else max_objects
  return SceneConfig(rows=v.rows, cols=v.cols, min_objects=v.min_objects,
                     max_objects=k or None, glyph_size=v.glyph_size)


def split_data(config, workdir, split: str, n: int, task: str | None = None,
               max_objects: int | None = None) -> SceneData:
  v = config.vlm
  # Scenes are rendered once into data_dir (default <workdir>/data) and reused.
  cache_dir = Path(v.data_dir) if v.get("data_dir") else Path(workdir) / "data"
  # Training scenes may come from another draw than the evaluation scenes, so a later
  # stage can train on scenes the earlier one never saw (vlm.train_scene_seed).
  seed = v.scene_seed
  if split == "train" and v.get("train_scene_seed", -1) >= 0:
    seed = v.train_scene_seed
  return SceneData(cache_dir, scene_config(config, max_objects), split, n, seed=seed,
                   task=task or v.task, filler_per_item=v.filler_per_item)


def parse_curriculum(text: str) -> list[tuple[int, int]]:
  """"1800:2,1500:0" -> [(1800, 2), (1500, 0)]: phases of (steps, max objects; 0 = all).

  Stage 0 runs the phases in order, each a fresh optimiser with its own warmup +
  cosine schedule over its steps, on scenes of at most that many objects. Few
  objects first is what makes the tiny LM learn to read the cell a caption
  names (experiments/RESULTS.md); the full range straight away never did.
  """
  phases = []
  for part in filter(None, (p.strip() for p in (text or "").split(","))):
    steps, sep, k = part.partition(":")
    if not sep or not steps.isdigit() or not k.isdigit() or int(steps) < 1:
      raise ValueError(f"vlm.curriculum: phase {part!r} must be STEPS:MAX_OBJECTS with "
                       "STEPS >= 1 and MAX_OBJECTS >= 0 (0 = every count up to rows*cols).")
    phases.append((int(steps), int(k)))
  return phases


def build_model(config, workdir=None):
  """The VLM with the earlier stage's parameters loaded (if init_from is set)."""
  model = VLM(vlm_config(config), rngs=nnx.Rngs(config.train.seed))
  missing = []
  if config.vlm.init_from:
    missing = train_lib.load_params(model, Path(config.vlm.init_from) / "params.npz")
  return model, missing


def run_stage(config, workdir) -> dict:
  """Trains one stage, evaluates it on the validation split and writes the run directory."""
  v = config.vlm
  if v.stage not in STAGES:
    raise ValueError(f"vlm.stage={v.stage!r} is not one of {STAGES}.")
  if v.stage != "pretrain" and not v.init_from:
    raise ValueError(f"vlm.stage={v.stage!r} needs vlm.init_from (the earlier stage's run).")
  phases = parse_curriculum(v.get("curriculum", ""))
  if phases and v.stage != "pretrain":
    raise ValueError(f"vlm.curriculum={v.curriculum!r} applies to stage 0 only "
                     f"(vlm.stage={v.stage!r}).")
  workdir = Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(config.to_json(indent=1))
  model, missing = build_model(config, workdir)
  log.info("vlm %s: %s, branch %s at %s; %d params left at init", v.stage, workdir.name,
           model.config.branch, model.config.branch_layers, len(missing))
  t0 = time.time()
  say = (lambda s: log.info("%s", s))
  if v.stage == "grpo":
    data = split_data(config, workdir, "train", v.n_train, task="count")
    g = v.grpo
    history = {"reward": grpo_train(
        model, data, steps=config.train.steps, prompts_per_step=g.prompts_per_step,
        group_size=g.group_size, max_new_tokens=g.max_new_tokens, lr=g.lr, clip_eps=g.clip_eps,
        kl_coef=g.kl_coef, temperature=g.temperature, trainable=v.trainable,
        seed=config.train.seed, log=say)}
  else:
    history = {"loss": [], "phases": []}
    for steps, k in phases or [(config.train.steps, None)]:
      data = split_data(config, workdir, "train", v.n_train, max_objects=k)
      say(f"phase: {steps} steps, scenes of {data.scene_config.min_objects}-"
          f"{data.scene_config.k_max} objects")
      history["loss"] += train_lib.fit(
          model, data, trainable=v.trainable, steps=steps,
          batch_size=config.data.batch_size, lr=config.optim.lr,
          weight_decay=config.optim.weight_decay, seed=config.train.seed,
          log_every=config.train.log_every, log=say,
          cell_loss_weight=v.get("cell_loss_weight", 0.0) if v.stage == "pretrain" else 0.0,
          n_classes=len(CLASS_NAMES))
      history["phases"].append({"steps": steps, "max_objects": data.scene_config.k_max})
  train_s = time.time() - t0
  train_lib.save_params(model, workdir / "params.npz")
  eval_task = "caption" if v.task == "caption" else "count"
  val = split_data(config, workdir, "validation", v.eval_n, task=eval_task)
  t1 = time.time()
  result = analysis.accuracy_by_length(model, val, n=v.eval_n,
                                       max_new_tokens=v.eval_max_new_tokens)
  analysis.write_json_png(workdir, "accuracy_by_length", result)
  metrics = {"stage": v.stage, "history": history, "train_seconds": train_s,
             "eval_seconds": time.time() - t1, "eval": result, "jax": jax.__version__,
             "branch": model.config.branch, "branch_layers": list(model.config.branch_layers)}
  (workdir / "metrics.json").write_text(json.dumps(metrics, indent=1))
  log.info("vlm %s done in %.0fs: eval %s", v.stage, train_s, result["overall"])
  return metrics


def analyze(workdir, *, which=("attention", "accuracy", "logit_lens", "grounding"), n: int = 16,
            max_new_tokens: int | None = None) -> dict:
  """Runs the analyses on a finished run; writes <name>.json/.png into it."""
  unknown = set(which) - {"attention", "accuracy", "logit_lens", "grounding"}
  if unknown:
    raise ValueError(f"analyze: unknown analyses {sorted(unknown)}.")
  import ml_collections

  workdir = Path(workdir).absolute()
  config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
  config.vlm.init_from = str(workdir)
  model, missing = build_model(config)
  if missing:
    raise ValueError(f"analyze: {workdir}/params.npz lacks {missing}.")
  val = split_data(config, workdir, "validation", max(n, config.vlm.eval_n), task="count"
                   if config.vlm.task != "caption" else "caption")
  N = max_new_tokens or config.vlm.eval_max_new_tokens
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
