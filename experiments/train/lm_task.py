"""The byte LM as a training task: packed corpus batches, cross entropy, bits per byte.

Loss: mean cross entropy in nats over tokens whose target lies in the same
document (`loss_mask`); bits per byte = nats / ln 2, since a token is a byte.
Evaluation: validation bits per byte over fixed batches, plus the diagnostics
of every memory layer (experiments/train/lngram_metrics.py for Lngram v2,
experiments/train/memory_metrics.py for the comparison arms). With
`init_from` the model starts from another run's backbone
(experiments/train/insertion.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from experiments.data import load_corpus, write_manifest
from experiments.data.corpus import corpus_spec
from experiments.models import DecoderLM, layout
from experiments.models.config import lm_config
from experiments.train import lngram_metrics, memory_metrics
from experiments.train.insertion import insert_into
from experiments.train.step import WEIGHT
from experiments.train.task import Task, saved_config

LN2 = math.log(2.0)


def token_losses(logits_BxTxV, targets_BxT):
  """Cross entropy per token in nats, float32."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits_BxTxV.astype(jnp.float32), targets_BxT)


def _forward(model, batch, *, return_aux=False):
  return model(batch["inputs"], segment_ids=batch["segment_ids"],
               positions=batch["positions"], return_aux=return_aux)


def lm_loss(model, batch):
  """The loss hook: (mean nats over loss_mask + the memory branches' aux losses,
  {"train/bits_per_byte", their metrics}).

  bits per byte is the cross entropy alone; an arm's weighted auxiliary loss
  (the sparse FFN's balance loss) is added to what is optimised and logged as
  `train/memory/<layer>/aux_loss` (experiments/train/memory_metrics.py).
  """
  logits_BxTxV, aux = _forward(model, batch, return_aux=True)
  mask_BxT = batch["loss_mask"].astype(jnp.float32)
  loss_sum = (token_losses(logits_BxTxV, batch["targets"]) * mask_BxT).sum()
  loss = loss_sum / jnp.maximum(mask_BxT.sum(), 1.0)
  extra_loss, metrics = memory_metrics.loss_terms(aux)
  # WEIGHT: the tokens averaged over, so gradient accumulation weighs micro-batches
  # by them and reproduces the full batch's mean (experiments/train/step.py).
  return loss + extra_loss, {"train/bits_per_byte": loss / LN2, **metrics,
                             WEIGHT: mask_BxT.sum()}


def make_eval_step(graphdef, memory_config):
  """eval(params, batch) -> sums: loss (nats), tokens, and Lngram statistics."""

  @jax.jit
  def evaluate(params, batch):
    model = nnx.merge(graphdef, params)
    logits_BxTxV, aux = _forward(model, batch, return_aux=True)
    mask_BxT = batch["loss_mask"].astype(jnp.float32)
    sums = {"loss_sum": (token_losses(logits_BxTxV, batch["targets"]) * mask_BxT).sum(),
            "tokens": mask_BxT.sum()}
    # Padding rows of the last eval batch have segment id 0.
    valid_BxT = batch["segment_ids"] > 0
    if lngram_metrics.lngram_layers(aux):
      sums["lngram"] = lngram_metrics.accumulate_stats(
          aux, memory_config, batch["segment_ids"], valid_BxT)
    arm_sums = memory_metrics.accumulate(model, aux, valid_BxT)
    if arm_sums:
      sums["arms"] = arm_sums
    return sums

  return evaluate


def evaluate_batches(eval_step, params, batches, memory_config=None) -> dict[str, float]:
  """Validation loss (nats and bits per byte) and memory-branch metrics over `batches`."""
  loss_sum = tokens = 0.0
  lngram_stats = arm_stats = None
  mesh = layout.active()
  for batch in batches:
    if mesh is not None:   # during training on a mesh: the batch in its shards
      from experiments.train.mesh import put_batch
      batch = put_batch(batch, mesh)
    sums = eval_step(params, batch)
    if jax.process_count() > 1:   # sums may live on other processes' devices too
      from jax.experimental import multihost_utils
      sums = multihost_utils.process_allgather(sums, tiled=True)
    sums = jax.device_get(sums)
    loss_sum += float(sums["loss_sum"])
    tokens += float(sums["tokens"])
    if "lngram" in sums:
      lngram_stats = lngram_metrics.merge_stats(lngram_stats, sums["lngram"])
    if "arms" in sums:
      arm_stats = memory_metrics.merge(arm_stats, sums["arms"])
  loss = loss_sum / max(tokens, 1.0)
  out = {"eval/loss": loss, "eval/bits_per_byte": loss / LN2, "eval/tokens": tokens}
  if lngram_stats is not None:
    out |= lngram_metrics.summarise(lngram_stats)
  if arm_stats is not None:
    out |= memory_metrics.summarise(memory_config, arm_stats)
  return out


def evaluate_model(model, batches) -> dict[str, float]:
  """`evaluate_batches` for a DecoderLM (one compiled eval step per model structure)."""
  graphdef, params = nnx.split(model, nnx.Param)
  step = make_eval_step(graphdef, model.config.memory)
  return evaluate_batches(step, nnx.to_pure_dict(params), batches, model.config.memory)


def lm_task(config, workdir) -> Task:
  """The LM run an experiment config describes (experiments/configs/lm_*.py)."""
  # grain is imported here, not at module level: notebooks and machines
  # without grain still import this package (restore, evaluate, metrics).
  from experiments.data.pipeline import TrainIterator, eval_batches

  dc = config.data
  model_cfg = lm_config(config)
  corpus = load_corpus(corpus_spec(config))
  if jax.process_index() == 0:
    write_manifest(corpus, workdir)
  # Several processes: each reads only the rows of every global batch its devices hold.
  rows = None
  mesh = layout.current()
  if jax.process_count() > 1 and mesh is not None:
    from experiments.train.mesh import process_rows
    rows = (*process_rows(mesh, dc.batch_size), dc.batch_size)
  batches = TrainIterator(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size, seed=dc.seed,
                          rows=None if rows is None else rows[:2])
  val_batches = eval_batches(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size,
                             max_batches=dc.eval_batches)
  model = DecoderLM(model_cfg, rngs=nnx.Rngs(params=config.train.seed))
  inserted = ""
  if config.get("init_from", ""):
    info = insert_into(model, config.init_from)
    inserted = (f"; backbone from {info['source']} step {info['step']} ({info['copied']} "
                f"arrays), {info['fresh']} new arrays at init")
  graphdef, _ = nnx.split(model, nnx.Param)
  eval_step = make_eval_step(graphdef, model_cfg.memory)

  def check_mesh(mesh):
    from experiments.train.evaluate import _lngram_halo
    from experiments.train.mesh import check_fits
    check_fits(mesh, batch_size=dc.batch_size, seq_len=dc.seq_len, memory=model_cfg.memory,
               lngram_halo=_lngram_halo(model_cfg.memory))

  def evaluate(module):
    return evaluate_batches(eval_step, nnx.to_pure_dict(nnx.state(module, nnx.Param)),
                            val_batches, model_cfg.memory)

  return Task(
      kind="lm", module=model, saved_config=saved_config("lm", config, model_cfg),
      batches=batches, loss=lm_loss, optim=config.optim, phases=(config.train.steps,),
      evaluate=evaluate, tokens_per_step=dc.batch_size * dc.seq_len, check_mesh=check_mesh,
      batch_rows=rows,
      description=(f"corpus {corpus.train_bytes} train / {corpus.val_bytes} validation "
                   f"bytes{inserted}"))
