"""The VLM's supervised stages as loss hooks of the one loop: stage 0 and Stage I.

The loop (experiments/train/loop.py) trains every stage; this module holds
what is VLM-specific about the supervised ones:

  * the trainable masks (`TRAINABLE`), predicates on the VLM's parameter
    paths. The one optimiser sends the other leaves to `optax.set_to_zero`, so
    they come out of every step bit-for-bit unchanged (a test checks it):

        all         stage 0: encoder, projector, LM (and any branch)
        branch      Stage I: the beside-FFN branches (`.../ffn_branch/...`) only
        lm          Stage I of the no-branch baseline: the LM (encoder, projector frozen)
        lm+branch   Stage II: LM and branch (vision encoder and projector frozen)

  * the caption / counting loss (`lm_loss`) and its loss hook `vlm_loss`;
    stage 0 may train the per-cell class head beside it (`CellPretrainer`);
  * `load_params`: Stage I/II start from an earlier run's checkpoint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.train.optimizer import path_str

TRAINABLE = {
    "all": lambda path: True,
    "branch": lambda path: "/ffn_branch/" in path,
    "lm": lambda path: path.startswith("lm/") and "/ffn_branch/" not in path,
    "lm+branch": lambda path: path.startswith("lm/"),
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


def flat_params(params) -> dict[str, jax.Array]:
  """{'lm/blocks/1/ffn_branch/gate': array, ...} of a param state or pure dict."""
  return {path_str(_strip_value(p)): v
          for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def _strip_value(path):
  # nnx.State leaves are Variables whose key path ends in `.value`.
  return tuple(k for k in path
               if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))


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


def load_params(model, run_dir) -> list[str]:
  """Copies the parameters of the run in `run_dir` into `model` by path.

  Returns the paths left at their init: loading a base (no-branch) run into a
  branch model leaves exactly the branch parameters at init, so Stage I starts
  at the base model. A saved array the model has no place for means the
  configs disagree (e.g. a base trained with a visual position embedding
  loaded into a model without it): an error, rather than dropped silently.
  """
  from experiments.checkpoint.restore import restore_module

  source, _, step = restore_module(run_dir)
  saved = {k: np.asarray(v) for k, v in flat_params(nnx.state(source, nnx.Param)).items()}
  params = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  unused = sorted(set(saved) - {path_str(_strip_value(p)) for p, _ in leaves})
  if unused:
    raise ValueError(f"load_params: {run_dir} (step {step}) holds {unused}, which this model "
                     "lacks; its config must match the run it starts from.")
  new, missing = [], []
  for p, v in leaves:
    key = path_str(_strip_value(p))
    if key in saved:
      if saved[key].shape != v.shape:
        raise ValueError(f"load_params: {key} has shape {saved[key].shape}, model {v.shape}.")
      new.append(jnp.asarray(saved[key], v.dtype))
    else:
      missing.append(key)
      new.append(v)
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return missing
