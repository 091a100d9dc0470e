"""Qwen3-VL image preprocessing in PIL + numpy: smart resize, normalise, patchify.

    config = ImageConfig.from_preprocessor_config(json.load(open("preprocessor_config.json")))
    pixel_values_NxP, grid_thw_Ix3 = preprocess_images([load_image("a.png")], config)

The steps and their order are those of transformers' Qwen2-VL image processor
(PIL backend), which Qwen3-VL uses: RGB (transparency composited on white),
resize with PIL to `smart_resize`'s size (both sides multiples of
patch·merge, pixel count inside [min_pixels, max_pixels], aspect kept),
rescale in float64 then cast to float32, normalise per channel in float32,
then cut into patches. One image is one frame, repeated `temporal_patch_size`
times along time (the vision tower's patch embedding is a 3-D conv).

Shape legend: N patches of all images, P = C·Tp·p·p values of one patch,
I images; grid_thw [t, h, w] counts patches (t = 1 for an image).
Patch order inside an image: merge windows in reading order, then the
merge² patches of a window in reading order (what the patch merger groups);
values inside a patch: channel, time, row, column.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

# transformers' defaults for a preprocessor_config.json that leaves a field out
# (Qwen2-VL's image processor class attributes; OpenAI CLIP mean / std).
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT = 200      # transformers refuses a longer side over 200x the shorter


@dataclasses.dataclass(frozen=True)
class ImageConfig:
  """The fields of a checkpoint's preprocessor_config.json that define pixel_values."""

  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  image_mean: tuple[float, ...] = _CLIP_MEAN
  image_std: tuple[float, ...] = _CLIP_STD
  rescale_factor: float = 1 / 255
  resample: int = 3               # PIL.Image.Resampling.BICUBIC
  do_resize: bool = True
  do_rescale: bool = True
  do_normalize: bool = True

  def __post_init__(self):
    for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels",
                 "max_pixels"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ImageConfig: {name}={value!r} must be an int >= 1.")
    if self.min_pixels > self.max_pixels:
      raise ValueError(f"ImageConfig: min_pixels={self.min_pixels} exceeds "
                       f"max_pixels={self.max_pixels}.")
    if len(self.image_mean) != 3 or len(self.image_std) != 3:
      raise ValueError(f"ImageConfig: image_mean={self.image_mean} and image_std="
                       f"{self.image_std} need one value per RGB channel.")
    if any(s == 0 for s in self.image_std):
      raise ValueError(f"ImageConfig: image_std={self.image_std} has a zero.")

  @property
  def factor(self) -> int:
    """Both sides of a resized image are multiples of this (one merge window)."""
    return self.patch_size * self.merge_size

  @property
  def patch_dim(self) -> int:
    return 3 * self.temporal_patch_size * self.patch_size ** 2

  @classmethod
  def from_preprocessor_config(cls, d: dict) -> ImageConfig:
    """As transformers reads it: `size` {shortest_edge, longest_edge}, then min/max_pixels."""
    size = d.get("size") or {}
    kw = dict(min_pixels=size.get("shortest_edge", cls.min_pixels),
              max_pixels=size.get("longest_edge", cls.max_pixels))
    if d.get("min_pixels") is not None:
      kw["min_pixels"] = d["min_pixels"]
    if d.get("max_pixels") is not None:
      kw["max_pixels"] = d["max_pixels"]
    for name in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor",
                 "resample", "do_resize", "do_rescale", "do_normalize"):
      if d.get(name) is not None:
        kw[name] = d[name]
    for name in ("image_mean", "image_std"):
      if d.get(name) is not None:
        value = d[name]
        kw[name] = tuple(value) if isinstance(value, (list, tuple)) else (value,) * 3
    return cls(**kw)


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
  """(h, w): multiples of `factor`, h·w in [min_pixels, max_pixels], aspect ratio kept.

  Each side is rounded to the nearest multiple; past the budget both are
  scaled by one factor beta and floored (above max) or ceiled (below min).
  """
  if min(height, width) < 1:
    raise ValueError(f"image of {height}x{width} pixels is empty.")
  if max(height, width) / min(height, width) > MAX_ASPECT:
    raise ValueError(f"image of {height}x{width} pixels: aspect ratio over {MAX_ASPECT}.")
  h_bar = round(height / factor) * factor
  w_bar = round(width / factor) * factor
  if h_bar * w_bar > max_pixels:
    beta = math.sqrt((height * width) / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


def load_image(path):
  """A PIL image read fully from `path`; a missing or unreadable file is one ValueError line."""
  from PIL import Image, UnidentifiedImageError
  path = Path(path)
  if not path.is_file():
    raise ValueError(f"image {path}: no such file.")
  try:
    with Image.open(path) as image:
      image.load()
      return image.copy()
  except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError,
          ValueError) as e:
    reason = " ".join(str(e).split()) or type(e).__name__
    raise ValueError(f"image {path}: not a readable image ({reason}).") from None


def to_rgb(image):
  """PIL RGB image; a transparent image is composited on white first (as transformers)."""
  from PIL import Image
  if isinstance(image, np.ndarray):
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (3, 4):
      raise ValueError(f"image array of shape {image.shape} and dtype {image.dtype}: "
                       "expected uint8 [H, W, 3 or 4].")
    if image.shape[-1] == 4:   # transformers' array path: rounded blend onto white
      alpha = image[..., 3:4] / 255
      image = np.round(alpha * image[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return Image.fromarray(image[..., :3])
  if not isinstance(image, Image.Image):
    raise ValueError(f"image of type {type(image).__name__}: expected a PIL image or a "
                     "uint8 array.")
  if "A" in image.getbands() or image.info.get("transparency") is not None:
    rgba = image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")
  return image.convert("RGB")


def target_size(height: int, width: int, config: ImageConfig,
                fixed_size: tuple[int, int] | None = None) -> tuple[int, int]:
  """The (h, w) an image is resized to; without resizing, checks the image fits as it is."""
  f = config.factor
  if fixed_size is not None:
    h, w = fixed_size
    if h % f or w % f or h < f or w < f:
      raise ValueError(f"fixed image size {h}x{w} is not a multiple of patch_size·merge_size "
                       f"= {f} on both sides.")
    return h, w
  if config.do_resize:
    return smart_resize(height, width, f, config.min_pixels, config.max_pixels)
  if height * width > config.max_pixels:
    raise ValueError(f"image of {height}x{width} = {height * width} pixels is beyond the "
                     f"pixel budget max_pixels={config.max_pixels} and resizing is off.")
  if height % f or width % f:
    raise ValueError(f"image of {height}x{width} pixels is not a multiple of patch_size·"
                     f"merge_size = {f} on both sides and resizing is off.")
  return height, width


def normalize_CxHxW(image_HxWx3: np.ndarray, config: ImageConfig) -> np.ndarray:
  """float32 [3, H, W]: rescale (float64 product, cast once), then (x - mean) / std."""
  x_CxHxW = np.moveaxis(np.asarray(image_HxWx3), -1, 0)
  if config.do_rescale:
    x_CxHxW = (x_CxHxW.astype(np.float64) * config.rescale_factor).astype(np.float32)
  x_CxHxW = x_CxHxW.astype(np.float32)
  if config.do_normalize:
    mean = np.asarray(config.image_mean, np.float32)[:, None, None]
    std = np.asarray(config.image_std, np.float32)[:, None, None]
    x_CxHxW = (x_CxHxW - mean) / std
  return x_CxHxW


def patchify(x_CxHxW: np.ndarray, patch_size: int, merge_size: int,
             temporal_patch_size: int) -> tuple[np.ndarray, int, int]:
  """(patches [gh·gw, C·Tp·p·p], gh, gw); the frame is repeated Tp times along time."""
  C, H, W = x_CxHxW.shape
  p, m = patch_size, merge_size
  gh, gw = H // p, W // p
  x = x_CxHxW.reshape(C, gh // m, m, p, gw // m, m, p)
  x = np.transpose(x, (1, 4, 2, 5, 0, 3, 6))            # [gh/m, gw/m, m, m, C, p, p]
  x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], temporal_patch_size, p, p))
  return np.ascontiguousarray(x).reshape(gh * gw, C * temporal_patch_size * p * p), gh, gw


def preprocess_image(image, config: ImageConfig,
                     fixed_size: tuple[int, int] | None = None) -> tuple[np.ndarray, tuple]:
  """(patches [n, P] float32, (1, gh, gw)) of one image (PIL, uint8 array or path)."""
  from PIL import Image
  if isinstance(image, (str, Path)):
    image = load_image(image)
  rgb = to_rgb(image)
  h, w = target_size(rgb.height, rgb.width, config, fixed_size)
  if (h, w) != (rgb.height, rgb.width):   # PIL returns a copy at the same size anyway
    rgb = rgb.resize((w, h), resample=Image.Resampling(config.resample))
  x_CxHxW = normalize_CxHxW(np.asarray(rgb), config)
  patches, gh, gw = patchify(x_CxHxW, config.patch_size, config.merge_size,
                             config.temporal_patch_size)
  return patches, (1, gh, gw)


def preprocess_images(images, config: ImageConfig, fixed_size: tuple[int, int] | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
  """(pixel_values [N, P] float32, image_grid_thw [I, 3] int64) of a flat list of images."""
  patches, grids = [], []
  for image in images:
    x, thw = preprocess_image(image, config, fixed_size)
    patches.append(x)
    grids.append(thw)
  if not patches:
    return (np.zeros((0, config.patch_dim), np.float32), np.zeros((0, 3), np.int64))
  return np.concatenate(patches, axis=0), np.asarray(grids, np.int64)


def image_tokens(grid_thw, merge_size: int) -> int:
  """Placeholder tokens of one image: t·h·w / merge² (one per merged window)."""
  t, h, w = (int(v) for v in grid_thw)
  return t * h * w // merge_size ** 2
