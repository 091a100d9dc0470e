"""Training the VLM: stage 0 (captioning), Stage I (SFT of the branch only), optimiser masks.

Parameters are trained functionally: `nnx.split(model, nnx.Param, ...)`, a
jitted step over the Param state, and an optax `multi_transform` that sends
frozen leaves to `set_to_zero`, so they come out of every step bit-for-bit
unchanged (a test checks it). Which leaves train is a predicate on the
parameter path (`TRAINABLE`):

    all         stage 0: encoder, projector, LM (and any branch)
    branch      Stage I: PVM / MLP branch parameters and their gates only
    lm          Stage I of the no-branch baseline: the LM (encoder, projector frozen)
    lm+branch   Stage II: LM and branch (vision encoder and projector frozen)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.vlm.cell_loss import CellPretrainer

TRAINABLE = {
    "all": lambda path: True,
    "branch": lambda path: path.startswith("branches/"),
    "lm": lambda path: path.startswith("lm/"),
    "lm+branch": lambda path: path.startswith(("lm/", "branches/")),
}


def path_str(path) -> str:
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.GetAttrKey):
      if k.name != "value":
        parts.append(k.name)
    elif isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(str(k.idx))
    else:
      parts.append(str(k))
  return "/".join(parts)


def flat_params(params) -> dict[str, jax.Array]:
  return {path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def param_labels(params, trainable: str):
  if trainable not in TRAINABLE:
    raise ValueError(f"trainable={trainable!r} is not one of {tuple(TRAINABLE)}.")
  keep = TRAINABLE[trainable]
  return jax.tree_util.tree_map_with_path(
      lambda p, _: "train" if keep(path_str(p)) else "freeze", params)


def make_optimizer(params, *, trainable: str, schedule, weight_decay: float = 0.0,
                   clip: float = 1.0):
  """AdamW (with global-norm clipping) on the trainable leaves, zero updates elsewhere."""
  inner = optax.chain(optax.clip_by_global_norm(clip),
                      optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay))
  return optax.multi_transform({"train": inner, "freeze": optax.set_to_zero()},
                               param_labels(params, trainable))


def cosine_schedule(lr: float, steps: int, warmup_frac: float = 0.1):
  warmup = max(1, int(round(warmup_frac * steps)))
  return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr * 0.1)


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


def make_step(graphdef, tx, loss_fn=lm_loss):
  """A jitted (params, rest, opt_state, batch) -> (params, opt_state, loss)."""

  @jax.jit
  def step(params, rest, opt_state, batch):
    def f(p):
      return loss_fn(nnx.merge(graphdef, p, rest), batch)
    loss, grads = jax.value_and_grad(f)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def fit(model, data, *, trainable: str, steps: int, batch_size: int, lr: float, seed: int = 0,
        weight_decay: float = 0.0, log_every: int = 10, log=print, cell_loss_weight: float = 0.0,
        n_classes: int = 0):
  """Supervised training (stage 0 or Stage I) in place; returns the loss history.

  cell_loss_weight > 0 (stage 0 only, trainable "all") adds the per-cell class
  loss of experiments.vlm.cell_loss; the batches must then hold "cell_labels".
  """
  trained, loss_fn = model, lm_loss
  if cell_loss_weight > 0:
    if trainable != "all":
      raise ValueError(f"fit: cell_loss_weight={cell_loss_weight} needs trainable='all', "
                       f"got {trainable!r}.")
    trained = CellPretrainer(model, n_classes, cell_loss_weight, rngs=nnx.Rngs(seed + 1))
    loss_fn = (lambda t, batch: t.loss(batch, lm_loss))
  graphdef, params, rest = nnx.split(trained, nnx.Param, ...)
  tx = make_optimizer(params, trainable=trainable, schedule=cosine_schedule(lr, steps),
                      weight_decay=weight_decay)
  opt_state = tx.init(params)
  step = make_step(graphdef, tx, loss_fn)
  rng = np.random.default_rng(seed)
  history, t0 = [], time.time()
  for i in range(steps):
    batch = data.batch(rng.choice(len(data), batch_size, replace=len(data) < batch_size))
    params, opt_state, loss = step(params, rest, opt_state, batch)
    history.append(float(loss))
    if log is not None and (i % log_every == 0 or i == steps - 1):
      log(f"step {i:5d}  loss {history[-1]:.4f}  {time.time() - t0:.1f}s")
  nnx.update(trained, params)
  return history


def save_params(model, path) -> None:
  """Param state as an .npz of path -> array, and the config beside it as JSON."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  flat = flat_params(nnx.state(model, nnx.Param))
  np.savez(path, **{k: np.asarray(v) for k, v in flat.items()})
  path.with_suffix(".json").write_text(json.dumps(model.config.to_dict(), indent=1))


def load_params(model, path, *, strict: bool = False) -> list[str]:
  """Copies the saved arrays whose paths exist in `model`; returns the paths left at init.

  Loading a base (no-branch) checkpoint into a branch model leaves exactly
  the branch parameters at their init; strict=True refuses any gap.
  """
  saved = dict(np.load(Path(path)))
  params = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  # A saved array the model has no place for means the configs disagree (e.g. a
  # base trained with vlm.visual_pos loaded into a model without it): refuse,
  # rather than drop it silently.
  unused = sorted(set(saved) - {path_str(p) for p, _ in leaves})
  if unused:
    raise ValueError(f"load_params: {path} holds {unused}, which this model lacks; "
                     "its config must match the run it starts from.")
  new, missing = [], []
  for p, v in leaves:
    key = path_str(p)
    if key in saved:
      if saved[key].shape != v.shape:
        raise ValueError(f"load_params: {key} has shape {saved[key].shape}, model {v.shape}.")
      new.append(jnp.asarray(saved[key], v.dtype))
    else:
      missing.append(key)
      new.append(v)
  if strict and missing:
    raise ValueError(f"load_params: {path} lacks {missing}.")
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return missing
