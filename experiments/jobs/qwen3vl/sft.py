"""Stage I on Qwen3-VL: the supervised loss over the assistant tokens of a conversation batch.

    loss = sft_loss(grid_thw, images_per_row=1, mesh=mesh)
                                     (model, batch) -> (mean CE over targets, {weight})

batch (experiments/jobs/qwen3vl/data.py, "sft" mode): input_ids,
attention_mask, loss_mask [B, T], position_ids [B, 3, T] (host-built rope
index), pixel_values [n, P]. Token t + 1 is predicted from position t and
counts where loss_mask[t + 1] (the assistant's content and its <|im_end|>).
`grid_thw` [images, 3] is static (a fixed image size per batch): the vision
tower's patch layout is a shape, not a value. Under gradient accumulation a
micro-batch holds the first rows' share of the pixels; `micro_grid` takes the
matching leading images (every image has the same grid there).

The cross entropy is taken from the decoder's hidden states chunk by chunk
(`DecoderLM.token_nll`): the [B, T, V] float32 logits (2.5 GB a 4,096-token row
at Qwen3-VL's vocabulary) never exist. With `images_per_row` (every row holds
that many images, as the conversation batches do) each row's PVM memory holds
its own images' tokens only, not min(T, the batch's visual tokens).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

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


def visual_per_row(grid_thw, rows: int, images_per_row: int | None, merge: int) -> int | None:
  """Visual tokens of one row when every row holds `images_per_row` images of the
  batch's grid (`micro_grid`'s images), else None (the model's default width)."""
  if not images_per_row:
    return None
  tokens = np.asarray(grid_thw).prod(1) // merge ** 2
  if len(tokens) != rows * images_per_row:
    raise ValueError(f"{len(tokens)} images for {rows} rows of {images_per_row} image(s) "
                     "each.")
  return int(tokens.reshape(rows, images_per_row).sum(1).max())


def forward_rows(model, input_ids_BxT, attention_mask_BxT, position_ids_Bx3xT, pixel_values,
                 grid_thw, *, images_per_row=None, mesh=None, return_hidden=False):
  """Qwen3-VL over rows of batch-built inputs (position ids [B, 3, T] from the host), each
  row's PVM memory its own images' when `images_per_row` is given: logits [B, T, V], or
  with `return_hidden` the decoder's output [B, T, D] (Stage I and Stage II both). Under
  gradient accumulation the rows are a micro-batch: `grid_thw` is cut to its images."""
  grid_thw = micro_grid(grid_thw, pixel_values.shape[0])
  n_visual = visual_per_row(grid_thw, input_ids_BxT.shape[0], images_per_row,
                            model.config.vision.spatial_merge_size)
  out, _ = model(input_ids_BxT, pixel_values=pixel_values, image_grid_thw=grid_thw,
                 attention_mask_BxT=attention_mask_BxT,
                 position_ids=jnp.transpose(position_ids_Bx3xT, (1, 0, 2)),
                 return_hidden=return_hidden, n_visual=n_visual, mesh=mesh)
  return out


def _forward(model, batch, grid_thw, *, images_per_row=None, mesh=None, return_hidden=False):
  return forward_rows(model, batch["input_ids"], batch["attention_mask"],
                      batch["position_ids"], batch["pixel_values"], grid_thw,
                      images_per_row=images_per_row, mesh=mesh, return_hidden=return_hidden)


def sft_logits(model, batch, grid_thw, *, images_per_row=None, mesh=None):
  """float32 logits [B, T, V] of a Stage I batch."""
  return _forward(model, batch, grid_thw, images_per_row=images_per_row, mesh=mesh)


def sft_loss(grid_thw, *, images_per_row: int | None = None, mesh=None):
  """The loss hook of Stage I for batches whose images have grids `grid_thw`
  (`images_per_row`, `mesh`: module docstring and `Qwen3VL.__call__`)."""
  grid_thw = np.asarray(grid_thw)

  def loss(model, batch):
    hidden_BxTxD = _forward(model, batch, grid_thw, images_per_row=images_per_row,
                            mesh=mesh, return_hidden=True)
    ce_BxT = model.lm.token_nll(hidden_BxTxD[:, :-1], batch["input_ids"][:, 1:], mesh=mesh)
    mask_BxT = batch["loss_mask"][:, 1:].astype(jnp.float32)
    # WEIGHT: the targets averaged over, so accumulated micro-batches weigh by them.
    return (jnp.sum(ce_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0),
            {WEIGHT: jnp.sum(mask_BxT)})

  return loss
