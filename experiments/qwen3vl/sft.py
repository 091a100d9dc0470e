"""Stage I on Qwen3-VL: the supervised loss over the assistant tokens of a conversation batch.

    loss = sft_loss(grid_thw)        (model, batch) -> (mean CE over targets, {weight})

batch (experiments/tasks/qwen3vl_data.py, "sft" mode): input_ids,
attention_mask, loss_mask [B, T], position_ids [B, 3, T] (host-built rope
index), pixel_values [n, P]. Token t + 1 is predicted from position t and
counts where loss_mask[t + 1] (the assistant's content and its <|im_end|>).
`grid_thw` [images, 3] is static (a fixed image size per batch): the vision
tower's patch layout is a shape, not a value. Under gradient accumulation a
micro-batch holds the first rows' share of the pixels; `micro_grid` takes the
matching leading images (every image has the same grid there).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from experiments.trainer.step import WEIGHT


def micro_grid(grid_thw, n_patches: int) -> np.ndarray:
  """The grids of the leading images holding `n_patches` patches (a micro-batch's)."""
  grid_thw = np.asarray(grid_thw)
  per_image = grid_thw.prod(1)
  ends = np.cumsum(per_image)
  if n_patches == ends[-1]:
    return grid_thw
  if n_patches not in ends:
    raise ValueError(f"pixel_values holds {n_patches} patches, which no leading run of the "
                     f"batch's images {grid_thw.tolist()} fills; train.grad_accum must "
                     "split the batch between images.")
  return grid_thw[:int(np.flatnonzero(ends == n_patches)[0]) + 1]


def sft_logits(model, batch, grid_thw):
  """float32 logits [B, T, V] of a Stage I batch."""
  grid_thw = micro_grid(grid_thw, batch["pixel_values"].shape[0])
  logits_BxTxV, _ = model(batch["input_ids"], pixel_values=batch["pixel_values"],
                          image_grid_thw=grid_thw, attention_mask_BxT=batch["attention_mask"],
                          position_ids=jnp.transpose(batch["position_ids"], (1, 0, 2)))
  return logits_BxTxV


def sft_loss(grid_thw):
  """The loss hook of Stage I for batches whose images have grids `grid_thw`."""
  grid_thw = np.asarray(grid_thw)

  def loss(model, batch):
    logits_BxTxV = sft_logits(model, batch, grid_thw)
    ce_BxT = optax.softmax_cross_entropy_with_integer_labels(
        logits_BxTxV[:, :-1].astype(jnp.float32), batch["input_ids"][:, 1:])
    mask_BxT = batch["loss_mask"][:, 1:].astype(jnp.float32)
    # WEIGHT: the targets averaged over, so accumulated micro-batches weigh by them.
    return (jnp.sum(ce_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0),
            {WEIGHT: jnp.sum(mask_BxT)})

  return loss
