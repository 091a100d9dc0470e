"""Qwen3-VL's multimodal position ids [3, B, T] (t, h, w), exactly as transformers computes them.

transformers `Qwen3VLModel.get_rope_index` (5.x): per row, over the real
tokens only (attention_mask), consecutive runs of one modality (text 0, image
1, video 2; `mm_token_type_ids`) get

    text run of n tokens  t = h = w = p, p+1, ..., p+n-1;      p += n
    image of grid (g_t, g_h, g_w), m = spatial_merge_size, in merged tokens
          t = p + i,  h = p + j,  w = p + k   (i < g_t, j < g_h/m, k < g_w/m,
          row-major over (i, j, k));          p += max(g_h, g_w) / m

Padding positions stay 0. `deltas_B` = 1 + the largest position - the row's
real length: decoding continues at position length + delta. Videos are not
supported by the model (a video token is refused in `token_types`). Host-side
numpy: the grids decide the shapes.
"""

from __future__ import annotations

import numpy as np

from experiments.vlm.qwen3vl.config import Qwen3VLConfig


def token_types(input_ids_BxT, config: Qwen3VLConfig) -> np.ndarray:
  """mm_token_type_ids from the ids: 1 at image tokens, else 0 (int32 [B, T])."""
  ids = np.asarray(input_ids_BxT)
  if (ids == config.video_token_id).any():
    raise ValueError("input_ids hold video tokens; Qwen3VL here takes images only.")
  return (ids == config.image_token_id).astype(np.int32)


def rope_index(input_ids, image_grid_thw, attention_mask, config: Qwen3VLConfig, *,
               mm_token_type_ids=None) -> tuple[np.ndarray, np.ndarray]:
  """(position_ids int64 [3, B, T], deltas int64 [B]); see the module docstring.

  image_grid_thw: [n_images, 3] over the batch's images in reading order (None:
  no images). attention_mask: [B, T] (None: every token real).
  """
  ids_BxT = np.asarray(input_ids)
  B, T = ids_BxT.shape
  types_BxT = (token_types(ids_BxT, config) if mm_token_type_ids is None
               else np.asarray(mm_token_type_ids))
  mask_BxT = (np.ones((B, T), bool) if attention_mask is None
              else np.asarray(attention_mask).astype(bool))
  grids = iter(np.zeros((0, 3), np.int64) if image_grid_thw is None
               else np.asarray(image_grid_thw, np.int64).reshape(-1, 3))
  merge = config.vision.spatial_merge_size
  position_3xBxT = np.zeros((3, B, T), np.int64)
  deltas_B = np.zeros((B,), np.int64)
  for b in range(B):
    types = types_BxT[b][mask_BxT[b]]
    pieces, pos, start = [], 0, 0
    while start < len(types):
      stop = start
      while stop < len(types) and types[stop] == types[start]:
        stop += 1
      if types[start] == 0:
        n = stop - start
        pieces.append(np.broadcast_to(np.arange(n) + pos, (3, n)))
        pos += n
      elif types[start] == 1:
        try:
          g_t, g_h, g_w = next(grids)
        except StopIteration:
          raise ValueError("input_ids hold more images than image_grid_thw has rows."
                           ) from None
        t, h, w = np.meshgrid(np.arange(g_t), np.arange(g_h // merge),
                              np.arange(g_w // merge), indexing="ij")
        # A run of image tokens may hold several images back to back.
        vision = np.stack([t.ravel(), h.ravel(), w.ravel()]) + pos
        pieces.append(vision)
        pos += max(g_h, g_w) // merge
        stop = start + vision.shape[1]
      else:
        raise ValueError("mm_token_type_ids hold video tokens (2); Qwen3VL here takes "
                         "images only.")
      start = stop
    if pieces:
      row = np.concatenate(pieces, axis=1)
      if row.shape[1] != len(types):
        raise ValueError(f"row {b}: image tokens do not match image_grid_thw "
                         f"({len(types)} real tokens, the grids imply {row.shape[1]}).")
      position_3xBxT[:, b, mask_BxT[b]] = row
      deltas_B[b] = row.max() + 1 - len(types)
  return position_3xBxT, deltas_B
