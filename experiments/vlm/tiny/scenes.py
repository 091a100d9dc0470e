"""The emoji scenes a VLM run reads: the scene layout of its config, and its splits.

Scenes are rendered once into `vlm.scenes.data_dir` (default `<workdir>/data`)
and reused by the stages (experiments/jobs/vlm/task.py) and the analyses
(experiments/analysis/vlm_run.py).
"""

from __future__ import annotations

from pathlib import Path

from experiments.vlm.emoji import SceneConfig
from experiments.vlm.tiny.data import SceneData


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
