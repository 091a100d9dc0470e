"""A split of emoji scenes as arrays + texts, with images cached as .npy in a directory.

    scenes, images = load_split(run_dir / "data", SceneConfig(), "train", 2000, seed=0)
    ex = example(scenes[0], task="count", filler_per_item=2)  # prompt, target, answer

The first call renders the glyph atlas and the split's images and writes
both to `cache_dir`; later calls (any process) read the files back. Image
files are keyed by everything that defines their pixels (layout, glyph size,
split, n, seed, font/Pillow version and class list).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.vlm.emoji import emoji_render, emoji_scenes
from experiments.vlm.emoji.emoji_classes import resolve_classes
from experiments.vlm.emoji.emoji_scenes import Scene, SceneConfig

TASKS = ("caption", "count")


def scene_images(scenes: list[Scene], atlas: np.ndarray) -> np.ndarray:
  """uint8 [N, rows·S, cols·S, 3]."""
  if not scenes:
    raise ValueError("scene_images: no scenes.")
  return np.stack([emoji_render.compose_scene(s.cells, s.classes, atlas, s.rows, s.cols)
                   for s in scenes])


def split_cache_name(config: SceneConfig, split: str, n: int, seed: int, atlas_name: str) -> str:
  c = config
  return (f"scenes-{split}-{c.rows}x{c.cols}-k{c.min_objects}-{c.k_max}-n{n}-seed{seed}-"
          f"{Path(atlas_name).stem}.npy")


def load_split(cache_dir: str | Path, config: SceneConfig, split: str, n: int,
               seed: int = 0) -> tuple[list[Scene], np.ndarray]:
  """The scenes of a split and their images, rendered once and cached in `cache_dir`."""
  cache_dir = Path(cache_dir)
  scenes = emoji_scenes.make_split(config, split, n, seed)
  classes = resolve_classes()
  atlas_name = emoji_render.atlas_cache_name(classes, config.glyph_size)
  path = cache_dir / split_cache_name(config, split, n, seed, atlas_name)
  shape = (n, *config.image_shape)
  if path.exists():
    images = np.load(path)
    if images.shape == shape and images.dtype == np.uint8:
      return scenes, images
  atlas = emoji_render.glyph_atlas(classes, config.glyph_size, cache_dir)
  images = scene_images(scenes, atlas)
  emoji_render.save_npy(path, images)
  return scenes, images


def example(scene: Scene, task: str = "caption", *, filler_per_item: int = 0,
            reasoning: bool = True) -> dict:
  """prompt / target texts of one scene; `answer` is the count (count task) or None."""
  if task == "caption":
    return {"prompt": emoji_scenes.CAPTION_PROMPT,
            "target": emoji_scenes.caption(scene, filler_per_item), "answer": None}
  if task == "count":
    return {"prompt": emoji_scenes.question(scene),
            "target": emoji_scenes.question_target(scene, reasoning=reasoning,
                                                   filler_per_item=filler_per_item),
            "answer": emoji_scenes.count(scene)}
  raise ValueError(f"task={task!r} is not one of {TASKS}.")
