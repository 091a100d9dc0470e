"""Stage-0 auxiliary loss: classify each grid cell's object from its patch feature.

With one ViT patch per grid cell (patch_size == glyph_size), patch n shows
exactly the object of cell n, or nothing. Byte-level captions alone teach
the from-scratch encoder the 40 classes too slowly on this scale (the
captions' gradient reaches a class only through the whole LM), so stage 0
can add a linear head on the encoder's patch features that predicts each
cell's class, with "empty" as class `n_classes`:

    loss = caption CE + weight · mean_{b, n} CE(head(encoder(image)_bn), label_bn)

The head is used for training only: it lives in `CellPretrainer` beside the
VLM, and only the VLM's parameters are saved, so later stages never see it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.models.layers import normal


def cell_labels(scenes, n_classes: int) -> np.ndarray:
  """[B, rows·cols] int32: the class of each cell's object, n_classes where empty."""
  labels = np.full((len(scenes), scenes[0].rows * scenes[0].cols), n_classes, np.int32)
  for b, s in enumerate(scenes):
    labels[b, list(s.cells)] = s.classes
  return labels


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
    if labels_BxN.shape[1] != self.model.config.n_visual:
      raise ValueError(f"CellPretrainer: {labels_BxN.shape[1]} grid cells but "
                       f"{self.model.config.n_visual} patches; the cell loss needs one patch "
                       "per cell (patch_size == glyph_size).")
    feats_BxNxE = self.model.encoder(batch["images"])
    aux = cell_class_loss(feats_BxNxE, self.w_head[...], self.b_head[...], labels_BxN)
    return lm_loss(self.model, batch) + self.weight * aux
