"""The VLM's supervised stages as loss hooks of the trainer: stage 0 and Stage I.

What is VLM-specific about the supervised stages (the task is experiments/jobs/vlm/task.py):

  * the trainable masks (`TRAINABLE`), predicates on the VLM's parameter
    paths. The one optimiser sends the other leaves to `optax.set_to_zero`, so
    they come out of every step bit-for-bit unchanged (a test checks it):

        all         stage 0: encoder, projector, LM (and any branch)
        branch      Stage I: the beside-FFN branches (`.../ffn_branch/...`) only
        lm          Stage I of the no-branch baseline: the LM (encoder, projector frozen)
        lm+branch   Stage II: LM and branch (vision encoder and projector frozen)
        lora        LoRA-SFT: the decoder's LoRA factors (experiments/models/lora.py)
        lora+branch the LoRA factors and the beside-FFN branches

  * the caption / counting loss (`lm_loss`) and its loss hook `vlm_loss`;
    stage 0 may train the per-cell class head beside it (`CellPretrainer`).
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

TRAINABLE = {
    "all": lambda path: True,
    "branch": lambda path: "/ffn_branch/" in path,
    "lm": lambda path: path.startswith("lm/") and "/ffn_branch/" not in path,
    "lm+branch": lambda path: path.startswith("lm/"),
    # LoRA-SFT (the PVM paper's baseline): the decoder's LoRA factors only.
    "lora": lambda path: path.startswith("lm/") and path.endswith(("_lora_a", "_lora_b")),
    "lora+branch": lambda path: path.startswith("lm/") and (
        path.endswith(("_lora_a", "_lora_b")) or "/ffn_branch/" in path),
}


def trainable_mask(name: str, *, prefix: str = ""):
  """The predicate `TRAINABLE[name]` on paths of a trained module that holds the VLM
  under `prefix` (e.g. "model/" for the stage-0 CellPretrainer)."""
  if name not in TRAINABLE:
    raise ValueError(f"vlm.stage.trainable={name!r} is not one of {tuple(TRAINABLE)}.")
  if name == "all":
    return None
  keep = TRAINABLE[name]
  return lambda path: path.startswith(prefix) and keep(path[len(prefix):])


def text_logits(model, logits_BxSxV):
  """Logits that predict text token j: positions Nv - 1 + j, [B, T, V]."""
  Nv = model.config.n_visual
  return logits_BxSxV[:, Nv - 1:-1]


def lm_loss(model, batch):
  """Mean cross-entropy over the target tokens (loss_mask)."""
  logits_BxSxV = model(batch["images"], batch["tokens"], valid=batch["valid"])
  pred_BxTxV = text_logits(model, logits_BxSxV)
  ce_BxT = optax.softmax_cross_entropy_with_integer_labels(pred_BxTxV, batch["tokens"])
  mask_BxT = batch["loss_mask"].astype(jnp.float32)
  return jnp.sum(ce_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


def vlm_loss(model, batch):
  """The loss hook of stage 0 / Stage I: (caption CE, {})."""
  return lm_loss(model, batch), {}


def cell_pretrainer_loss(trained, batch):
  """The loss hook of stage 0 with the cell head: caption CE + weight · cell CE."""
  return trained.loss(batch, lm_loss), {}
