"""Stage-0 auxiliary loss: classify each grid cell's object from its patch feature.

With one ViT patch per grid cell (patch_size == glyph_size), patch n shows
exactly the object of cell n, or nothing; with k x k patches per cell
(glyph_size = k · patch_size, e.g. the long-answer design's 16-pixel glyphs in
8-pixel patches), the cell's feature is the mean of its k² patch features.
Byte-level captions alone teach the from-scratch encoder the 40 classes too
slowly on this scale (the captions' gradient reaches a class only through the
whole LM), so stage 0 can add a linear head on the encoder's cell features
that predicts each cell's class, with "empty" as class `n_classes`:

    loss = caption CE + weight · mean_{b, n} CE(head(cell_feature_bn), label_bn)

The head is used for training only: it lives in `CellPretrainer` beside the
VLM, and only the VLM's parameters are saved, so later stages never see it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.models.layers import normal


def check_cell_geometry(glyph_size: int, patch_size: int) -> int:
  """Patches per cell side k (glyph_size = k · patch_size); refuses any other pair, at
  config time, before scenes are rendered."""
  if patch_size <= 0 or glyph_size % patch_size:
    raise ValueError(f"the stage-0 cell loss needs glyph_size ({glyph_size}) to be a whole "
                     f"multiple of the encoder's patch_size ({patch_size}): each cell must "
                     "cover k x k whole patches (or set vlm.stage.cell_loss_weight=0).")
  return glyph_size // patch_size


def cell_labels(scenes, n_classes: int) -> np.ndarray:
  """[B, rows·cols] int32: the class of each cell's object, n_classes where empty."""
  labels = np.full((len(scenes), scenes[0].rows * scenes[0].cols), n_classes, np.int32)
  for b, s in enumerate(scenes):
    labels[b, list(s.cells)] = s.classes
  return labels


def cell_features(feats_BxNxE, grid_hw: tuple[int, int], cells_hw: tuple[int, int]):
  """[B, rows·cols, E]: each grid cell's patch features averaged (row-major cells).

  `feats_BxNxE` holds the patches in reading order over a `grid_hw` patch grid;
  each of the `cells_hw` cells covers an equal block of whole patches.
  """
  (gh, gw), (rows, cols) = grid_hw, cells_hw
  B, N, E = feats_BxNxE.shape
  if N != gh * gw or gh % rows or gw % cols:
    raise ValueError(f"cell_features: {N} patches on a {gh}x{gw} grid cannot be split into "
                     f"{rows}x{cols} cells of whole patches.")
  kh, kw = gh // rows, gw // cols
  if kh == kw == 1:
    return feats_BxNxE
  blocks = feats_BxNxE.reshape(B, rows, kh, cols, kw, E)
  return blocks.mean(axis=(2, 4)).reshape(B, rows * cols, E)


def cell_class_loss(feats_BxNxE, w_ExC, b_C, labels_BxN):
  """Mean softmax cross-entropy of the linear head over every (image, cell)."""
  logits_BxNxC = jnp.einsum("bne,ec->bnc", feats_BxNxE.astype(jnp.float32), w_ExC) + b_C
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits_BxNxC, labels_BxN))


class CellPretrainer(nnx.Module):
  """The VLM and the training-only cell head; `loss` is the stage-0 objective."""

  def __init__(self, model, n_classes: int, weight: float, *, rngs: nnx.Rngs):
    c = model.config
    if weight <= 0:
      raise ValueError(f"CellPretrainer: weight={weight} must be > 0.")
    self.model = model
    self.weight = weight
    self.w_head = nnx.Param(normal(0.02)(rngs.params(), (c.vit_dim, n_classes + 1)))
    self.b_head = nnx.Param(jnp.zeros((n_classes + 1,), jnp.float32))

  def loss(self, batch, lm_loss):
    labels_BxN = batch["cell_labels"]
    images = batch["images"]
    patch = self.model.config.patch_size
    grid_hw = (images.shape[1] // patch, images.shape[2] // patch)
    cells = labels_BxN.shape[1]
    per_cell = grid_hw[0] * grid_hw[1] // max(cells, 1)
    k = int(round(per_cell ** 0.5))
    if cells == 0 or k * k * cells != grid_hw[0] * grid_hw[1]:
      raise ValueError(f"CellPretrainer: {cells} grid cells but {grid_hw[0] * grid_hw[1]} "
                       "patches; the cell loss needs square cells of k x k whole patches "
                       "(glyph_size a multiple of patch_size).")
    feats_BxNxE = cell_features(self.model.encoder(images), grid_hw,
                                (grid_hw[0] // k, grid_hw[1] // k))
    aux = cell_class_loss(feats_BxNxE, self.w_head[...], self.b_head[...], labels_BxN)
    return lm_loss(self.model, batch) + self.weight * aux
