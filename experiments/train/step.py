"""The jitted training and evaluation steps over a pure-dict train state.

State: {"params": model Params as a pure dict, "opt_state": optax state,
"step": int32 steps taken}.
The model is rebuilt inside the trace with `nnx.merge(graphdef, params)`, so
the step is an ordinary jax function of arrays: it can be jitted with the
state donated, and checkpointed with orbax as plain trees.

Loss: mean cross entropy in nats over tokens whose target lies in the same
document (`loss_mask`); bits per byte = nats / ln 2, since a token is a byte.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from experiments.train import lngram_metrics

LN2 = math.log(2.0)


def _forward(graphdef, params, batch, *, return_aux=False):
  model = nnx.merge(graphdef, params)
  return model(batch["inputs"], segment_ids=batch["segment_ids"],
               positions=batch["positions"], return_aux=return_aux)


def token_losses(logits_BxTxV, targets_BxT):
  """Cross entropy per token in nats, float32."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits_BxTxV.astype(jnp.float32), targets_BxT)


def loss_fn(params, graphdef, batch):
  logits_BxTxV = _forward(graphdef, params, batch)
  mask_BxT = batch["loss_mask"].astype(jnp.float32)
  loss_sum = (token_losses(logits_BxTxV, batch["targets"]) * mask_BxT).sum()
  return loss_sum / jnp.maximum(mask_BxT.sum(), 1.0)


def make_train_step(graphdef, tx, lr_fn):
  """step(state, batch) -> (state, metrics); jitted with the state donated."""

  def step(state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], graphdef, batch)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {
        "train/loss": loss,
        "train/bits_per_byte": loss / LN2,
        "train/grad_norm": optax.tree.norm(grads),
        "train/param_norm": optax.tree.norm(params),
        "train/lr": lr_fn(state["step"]),
    }
    return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

  return jax.jit(step, donate_argnums=0)


def make_eval_step(graphdef, lngram_config):
  """eval(params, batch) -> sums: loss (nats), tokens, and Lngram statistics."""

  @jax.jit
  def evaluate(params, batch):
    logits_BxTxV, aux = _forward(graphdef, params, batch, return_aux=True)
    mask_BxT = batch["loss_mask"].astype(jnp.float32)
    sums = {"loss_sum": (token_losses(logits_BxTxV, batch["targets"]) * mask_BxT).sum(),
            "tokens": mask_BxT.sum()}
    if aux:
      # Padding rows of the last eval batch have segment id 0.
      valid_BxT = batch["segment_ids"] > 0
      sums["lngram"] = lngram_metrics.accumulate_stats(
          aux, lngram_config, batch["segment_ids"], valid_BxT)
    return sums

  return evaluate


def evaluate(eval_step, params, batches) -> dict[str, float]:
  """Validation loss (nats and bits per byte) and Lngram metrics over `batches`."""
  loss_sum = tokens = 0.0
  lngram_stats = None
  for batch in batches:
    sums = jax.device_get(eval_step(params, batch))
    loss_sum += float(sums["loss_sum"])
    tokens += float(sums["tokens"])
    if "lngram" in sums:
      lngram_stats = lngram_metrics.merge_stats(lngram_stats, sums["lngram"])
  loss = loss_sum / max(tokens, 1.0)
  out = {"eval/loss": loss, "eval/bits_per_byte": loss / LN2, "eval/tokens": tokens}
  if lngram_stats is not None:
    out |= lngram_metrics.summarise(lngram_stats)
  return out
