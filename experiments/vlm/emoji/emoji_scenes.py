"""Emoji scenes: k objects on a grid, captions of controllable length, counting questions.

A scene is a rows × cols grid (at most 4 × 4) with k objects in distinct
cells; each object is one of the 40 classes of `emoji_classes` (a class may
repeat). Cells are numbered in reading order, cell = row·cols + col.

Captions name every object in reading order, "position: name.", e.g.
"top-left: dog. center: banana. bottom-right: harp." With
`filler_per_item = f`, f neutral sentences (they name no object and no
position) follow each item but the last: the answer grows while the image
content needed later stays the same, which is how the length analyses
stretch outputs. The question variant asks for a count by category,
"How many animals are in the picture?", answered as "<answer>N</answer>"
(optionally after the caption as reasoning); `rewards` scores it.

Splits (deterministic, documented):
  * the i-th scene of the stream with seed s is drawn from
    np.random.default_rng([s, i]) (k uniform in [min_objects, max_objects],
    the cells uniform without replacement, each class and the asked category
    uniform);
  * its split is a function of its IMAGE CONTENT only: the blake2b hash of
    (rows, cols, the sorted (cell, class name) pairs) modulo 100 puts it in
    train (0-79), validation (80-89) or test (90-99). The same image can
    therefore never sit in two splits, whatever the seeds, stream indices
    or asked category;
  * `make_split(config, split, n, seed)` walks the stream i = 0, 1, 2, ...
    and keeps the first n scenes that fall in `split`, dropping repeats of an
    image already kept, so a split holds no duplicate image either.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from experiments.vlm.emoji.emoji_classes import CATEGORIES, CLASS_CATEGORY, CLASS_NAMES, PLURALS

SPLITS = {"train": (0, 80), "validation": (80, 90), "test": (90, 100)}
MAX_GRID = 4
_ROW_NAMES = {1: ("",), 2: ("top", "bottom"), 3: ("top", "middle", "bottom"),
              4: ("top", "upper", "lower", "bottom")}
_COL_NAMES = {1: ("",), 2: ("left", "right"), 3: ("left", "center", "right"),
              4: ("far-left", "left", "right", "far-right")}
FILLERS = (
    "I keep looking at the picture.",
    "Let me move on to the next cell.",
    "The picture is still in front of me.",
    "Now I look further along the grid.",
    "That one is clear enough.",
    "I check the image once more.",
    "Then I continue in reading order.",
    "Nothing else is in that cell.",
)
CAPTION_PROMPT = "Describe the picture: name every object with its position, in reading order."


@dataclasses.dataclass(frozen=True)
class SceneConfig:
  """Layout of the scenes; k (objects per scene) controls the caption length."""

  rows: int = 3
  cols: int = 3
  min_objects: int = 1
  max_objects: int | None = None   # None: every cell may be filled
  glyph_size: int = 16

  def __post_init__(self):
    for name in ("rows", "cols"):
      value = getattr(self, name)
      if not isinstance(value, int) or not 1 <= value <= MAX_GRID:
        raise ValueError(f"SceneConfig: {name}={value!r} must be an int in [1, {MAX_GRID}].")
    if not 1 <= self.min_objects <= self.k_max:
      raise ValueError(
          f"SceneConfig: min_objects={self.min_objects} must be in [1, max_objects="
          f"{self.k_max}].")
    if self.k_max > self.rows * self.cols:
      raise ValueError(
          f"SceneConfig: max_objects={self.max_objects} exceeds rows*cols = "
          f"{self.rows * self.cols} cells.")
    if not isinstance(self.glyph_size, int) or self.glyph_size < 4:
      raise ValueError(f"SceneConfig: glyph_size={self.glyph_size!r} must be an int >= 4.")

  @property
  def k_max(self) -> int:
    return self.rows * self.cols if self.max_objects is None else self.max_objects

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return (self.rows * self.glyph_size, self.cols * self.glyph_size, 3)


@dataclasses.dataclass(frozen=True)
class Scene:
  """One scene: objects in reading order and the category its question asks about."""

  rows: int
  cols: int
  cells: tuple[int, ...]      # ascending
  classes: tuple[int, ...]    # class id of the object in cells[i]
  category: int               # index into CATEGORIES

  @property
  def k(self) -> int:
    return len(self.cells)

  @property
  def image_key(self) -> str:
    """Canonical text of the image content (what the split hash reads)."""
    items = ",".join(f"{c}:{CLASS_NAMES[k]}" for c, k in zip(self.cells, self.classes,
                                                              strict=True))
    return f"{self.rows}x{self.cols}|{items}"


def _digest(text: str) -> int:
  return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def split_of(scene: Scene) -> str:
  bucket = _digest(scene.image_key) % 100
  return next(name for name, (lo, hi) in SPLITS.items() if lo <= bucket < hi)


def sample_scene(config: SceneConfig, seed: int, index: int) -> Scene:
  """The index-th scene of the stream with this seed."""
  rng = np.random.default_rng([seed, index])
  k = int(rng.integers(config.min_objects, config.k_max + 1))
  cells = np.sort(rng.choice(config.rows * config.cols, size=k, replace=False))
  classes = rng.integers(0, len(CLASS_NAMES), size=k)
  category = int(rng.integers(0, len(CATEGORIES)))
  return Scene(rows=config.rows, cols=config.cols, cells=tuple(int(c) for c in cells),
               classes=tuple(int(c) for c in classes), category=category)


def make_split(config: SceneConfig, split: str, n: int, seed: int = 0) -> list[Scene]:
  """The first n distinct scenes of `split` in the stream of `seed` (see module doc)."""
  if split not in SPLITS:
    raise ValueError(f"split={split!r} is not one of {tuple(SPLITS)}.")
  if n < 0:
    raise ValueError(f"n={n} must be >= 0.")
  lo, hi = SPLITS[split]
  max_draws = 20 * n * 100 // (hi - lo) + 1000   # 20x the expected number of draws
  scenes, seen = [], set()
  for index in range(max_draws):
    if len(scenes) == n:
      return scenes
    scene = sample_scene(config, seed, index)
    key = scene.image_key
    if key in seen or split_of(scene) != split:
      continue
    seen.add(key)
    scenes.append(scene)
  if len(scenes) == n:
    return scenes
  raise ValueError(
      f"make_split: found only {len(scenes)} distinct {split} scenes in {max_draws} draws "
      f"(n={n}); the scene space of {config} is too small.")


def position_name(cell: int, rows: int, cols: int) -> str:
  """E.g. "top-left", "center" (the middle of a 3×3 grid), "upper-far-right"."""
  r, c = divmod(int(cell), cols)
  row, col = _ROW_NAMES[rows][r], _COL_NAMES[cols][c]
  if row == "middle" and col == "center":
    return "center"
  return "-".join(part for part in (row, col) if part)


def caption_items(scene: Scene) -> list[str]:
  """"position: name." for every object, in reading order."""
  return [f"{position_name(cell, scene.rows, scene.cols)}: {CLASS_NAMES[cls]}."
          for cell, cls in zip(scene.cells, scene.classes, strict=True)]


def caption(scene: Scene, filler_per_item: int = 0) -> str:
  """The caption; fillers are drawn from a stream seeded by the image key."""
  if filler_per_item < 0:
    raise ValueError(f"filler_per_item={filler_per_item} must be >= 0.")
  items = caption_items(scene)
  rng = np.random.default_rng(_digest("filler|" + scene.image_key))
  parts = []
  for i, item in enumerate(items):
    parts.append(item)
    if i < len(items) - 1:
      # Without replacement inside one gap (no sentence twice in a row), as
      # long as there are enough sentences.
      picks = rng.choice(len(FILLERS), size=filler_per_item,
                         replace=filler_per_item > len(FILLERS))
      parts.extend(FILLERS[j] for j in picks)
  return " ".join(parts)


def count(scene: Scene, category: int | None = None) -> int:
  """How many objects of `category` (default: the scene's asked category)."""
  category = scene.category if category is None else category
  return sum(CLASS_CATEGORY[cls] == category for cls in scene.classes)


def question(scene: Scene) -> str:
  return (f"How many {PLURALS[CATEGORIES[scene.category]]} are in the picture? "
          "Answer as <answer>N</answer>.")


def answer_text(n: int) -> str:
  return f"<answer>{int(n)}</answer>"


def question_target(scene: Scene, *, reasoning: bool = True, filler_per_item: int = 0) -> str:
  """The reference completion: the caption as reasoning (optional), then the answer."""
  tag = answer_text(count(scene))
  return f"{caption(scene, filler_per_item)} {tag}" if reasoning else tag
