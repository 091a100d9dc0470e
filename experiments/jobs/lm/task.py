"""The LM as a training task: packed corpus batches, cross entropy, bits per unit.

Loss: mean cross entropy in nats over tokens whose target lies in the same
document (`loss_mask`); bits = nats / ln 2 per unit of the data: per byte on a byte
corpus (a token is a byte), logged as `train/bits_per_byte` and `eval/bits_per_byte`,
per token on token data (`data.kind="tokens"`), logged as `train/bits_per_token` and
`eval/bits_per_token` (`bits_key`; runs before that name logged bits per token under
`bits_per_byte`: readers take either, experiments/trainer/writers.py `bits_value`).
Evaluation: validation bits per unit over fixed batches, plus the metrics of
every memory layer and every MoE layer's expert load (experiments/jobs/metrics.py;
MoE layers add their weighted balance losses to the training loss). With `init_from` the model
starts from another run's backbone (experiments/jobs/init_from.py). On a
device mesh the forward is traced with `BranchContext(mesh=mesh)`, so Lngram
layers run their sharded form (experiments/models/layout.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.data import load_corpus, validation
from experiments.data.corpus import corpus_spec, record_manifest
from experiments.data.tokens import run as token_run
from experiments.hf.backbone import with_hf_backbone
from experiments.jobs import checks, metrics
from experiments.jobs.init_from import insert_into
from experiments.jobs.saved import resume_check, saved_config
from experiments.models import DecoderLM, layout, moe
from experiments.models.branches import BranchContext
from experiments.models.config import lm_config
from experiments.models.layout import check_expert_axis
from experiments.models.lora import lora_trainable
from experiments.trainer import Task
from experiments.trainer.placement import process_rows, put_batch
from experiments.trainer.step import RULE_UPDATES, WEIGHT

LN2 = math.log(2.0)
UNITS = ("byte", "token")   # what one position of the data is: a byte, or a token id


def bits_key(split: str, unit: str) -> str:
  """The metric name of bits per `unit` ("byte" or "token") of `split` ("train", "eval")."""
  if unit not in UNITS:
    raise ValueError(f"bits_key: unit={unit!r} is not one of {UNITS}.")
  return f"{split}/bits_per_{unit}"


def _forward(model, batch, *, return_aux=False, mesh=None, return_hidden=False):
  context = None if layout.sharded(mesh) is None else BranchContext(mesh=mesh)
  return model(batch["inputs"], segment_ids=batch["segment_ids"],
               positions=batch["positions"], return_aux=return_aux, context=context,
               return_hidden=return_hidden)


def lm_loss(model, batch, *, mesh=None, unit: str = "byte"):
  """The loss hook: (mean nats over loss_mask + the memory branches' aux losses,
  {"train/bits_per_<unit>", their metrics}); `mesh`: the mesh the step is traced on;
  `unit`: "byte" (byte corpora) or "token" (token data).

  bits per unit is the cross entropy alone; an arm's weighted auxiliary loss
  (the sparse FFN's balance loss) is added to what is optimised and logged as
  `train/memory/<layer>/aux_loss` (experiments/jobs/metrics.py).
  """
  # The cross entropy is taken chunk by chunk from the final hidden states: the [B, T, V]
  # float32 logits never exist (experiments/models/cross_entropy.py).
  hidden_BxTxD, aux = _forward(model, batch, return_aux=True, mesh=mesh, return_hidden=True)
  mask_BxT = batch["loss_mask"].astype(jnp.float32)
  nats_BxT = model.token_nll(hidden_BxTxD, batch["targets"], mesh=layout.sharded(mesh))
  loss_sum = (nats_BxT * mask_BxT).sum()
  loss = loss_sum / jnp.maximum(mask_BxT.sum(), 1.0)
  extra_loss, train_metrics = metrics.loss_terms(aux)
  # MoE layers: Σ balance_coef · balance_loss, and the aux-loss-free routing biases'
  # next values, which the step writes over the optimiser's update (RULE_UPDATES).
  total = loss + extra_loss
  if model.config.moe_layers:
    moe_loss, moe_metrics = metrics.moe_loss_terms(aux, model.config.moe)
    total = total + moe_loss
    train_metrics = {**train_metrics, **moe_metrics}
    rule_updates = moe.routing_bias_updates(model, aux)
    if rule_updates:
      train_metrics[RULE_UPDATES] = rule_updates
  # WEIGHT: the tokens averaged over, so gradient accumulation weighs micro-batches
  # by them and reproduces the full batch's mean (experiments/trainer/step.py).
  return total, {bits_key("train", unit): loss / LN2, **train_metrics,
                 WEIGHT: mask_BxT.sum()}


def make_eval_step(graphdef, *, mesh=None):
  """eval(params, batch) -> sums: loss (nats), tokens, and the memory branches' metric sums."""

  @jax.jit
  def evaluate(params, batch):
    model = nnx.merge(graphdef, params)
    hidden_BxTxD, aux = _forward(model, batch, return_aux=True, mesh=mesh, return_hidden=True)
    mask_BxT = batch["loss_mask"].astype(jnp.float32)
    nats_BxT = model.token_nll(hidden_BxTxD, batch["targets"], mesh=layout.sharded(mesh)) * mask_BxT
    # Per-row sums too: a validation row holds one document (experiments/data/validation.py).
    sums = {"loss_sum": nats_BxT.sum(), "tokens": mask_BxT.sum(),
            "row_nats": nats_BxT.sum(axis=1), "row_tokens": mask_BxT.sum(axis=1)}
    # Padding rows of the last eval batch have segment id 0.
    valid_BxT = batch["segment_ids"] > 0
    memory_sums = metrics.accumulate(model, aux, valid_BxT, batch["segment_ids"])
    if memory_sums:
      sums["memory"] = memory_sums
    moe_sums = metrics.moe_sums(aux)   # MoE layers: each expert's load
    if moe_sums:
      sums["moe"] = moe_sums
    return sums

  return evaluate


def evaluate_batches(eval_step, params, batches, memory_config=None, *,
                     mesh=None, per_doc: dict | None = None,
                     unit: str = "byte") -> dict[str, float]:
  """Validation loss (nats, and bits per `unit` as `eval/bits_per_<unit>`) and
  memory-branch metrics over `batches`; `mesh`: where the batches go (the eval step's
  mesh), None: as they are.

  Batches of the per-document validation set carry `doc` [B] (each row's document,
  -1 on padding); with `per_doc` (a dict) their sums per document are stored in it
  as float64 arrays `nats` and `tokens`."""
  loss_sum = tokens = 0.0
  memory_stats = moe_stats = None
  doc_nats, doc_tokens = {}, {}
  for batch in batches:
    doc_B = batch.get("doc")
    batch = {k: v for k, v in batch.items() if k != "doc"}   # host-side only
    if layout.sharded(mesh) is not None:   # on a mesh: the batch in its shards
      batch = put_batch(batch, mesh)
    sums = eval_step(params, batch)
    if jax.process_count() > 1:   # sums may live on other processes' devices too
      from jax.experimental import multihost_utils
      sums = multihost_utils.process_allgather(sums, tiled=True)
    sums = jax.device_get(sums)
    loss_sum += float(sums["loss_sum"])
    tokens += float(sums["tokens"])
    if doc_B is not None:
      for d, n, t in zip(np.asarray(doc_B), np.asarray(sums["row_nats"], np.float64),
                         np.asarray(sums["row_tokens"], np.float64), strict=True):
        if d >= 0:
          doc_nats[int(d)] = doc_nats.get(int(d), 0.0) + float(n)
          doc_tokens[int(d)] = doc_tokens.get(int(d), 0.0) + float(t)
    if "memory" in sums:
      memory_stats = metrics.merge(memory_stats, sums["memory"])
    if "moe" in sums:
      moe_stats = metrics.merge(moe_stats, sums["moe"])
  if per_doc is not None and doc_nats:
    n_docs = max(doc_nats) + 1
    per_doc["nats"] = np.array([doc_nats.get(d, 0.0) for d in range(n_docs)])
    per_doc["tokens"] = np.array([doc_tokens.get(d, 0.0) for d in range(n_docs)])
  loss = loss_sum / max(tokens, 1.0)
  out = {"eval/loss": loss, bits_key("eval", unit): loss / LN2, "eval/tokens": tokens}
  if memory_stats is not None:
    out |= metrics.summarise(memory_config, memory_stats)
  if moe_stats is not None:
    out |= metrics.summarise_moe(moe_stats)
  return out


def evaluate_model(model, batches, *, mesh=None, unit: str = "byte") -> dict[str, float]:
  """`evaluate_batches` for a DecoderLM (one compiled eval step per model structure)."""
  graphdef, params = nnx.split(model, nnx.Param)
  step = make_eval_step(graphdef, mesh=mesh)
  return evaluate_batches(step, nnx.to_pure_dict(params), batches, model.config.memory,
                          mesh=mesh, unit=unit)


def lm_task(config, workdir, mesh=None, *, model_config=None) -> Task:
  """The LM run an experiment config describes (experiments/configs/lm_*.py) on `mesh`.

  `model_config`: the LMConfig the job's check built from `config` (then `config` is the
  checked one, with an HF backbone's fields in place); None builds both here."""
  if model_config is None:
    config = with_hf_backbone(config)   # init_from=hf:DIR: the checkpoint's backbone
    model_config = lm_config(config)
  dc = config.data
  # Several processes: each reads only the rows of every global batch its devices hold.
  rows = None
  if jax.process_count() > 1 and mesh is not None:
    rows = (*process_rows(mesh, dc.batch_size), dc.batch_size)
  data = _run_data(config, workdir, rows)
  unit, val_names = data.unit, data.val_names
  model_cfg = (model_config if data.vocab_size is None
               else token_run.model_vocab(model_config, data.vocab_size))
  model = DecoderLM(model_cfg, rngs=nnx.Rngs(params=config.train.seed))
  inserted = ""
  if config.get("init_from", ""):
    info = insert_into(model, config.init_from)
    inserted = (f"; backbone from {info['source']} step {info['step']} ({info['copied']} "
                f"arrays), {info['fresh']} new arrays at init")
  graphdef, _ = nnx.split(model, nnx.Param)
  eval_step = make_eval_step(graphdef, mesh=mesh)

  def check_mesh(mesh):
    if model_cfg.moe_layers:   # each `expert` device holds whole experts
      check_expert_axis(model_cfg.moe.n_experts, mesh)
    checks.check_fits(mesh, batch_size=dc.batch_size, seq_len=dc.seq_len,
                      memory=model_cfg.memory)

  last_docs: dict = {}   # the latest evaluation's per-document sums

  def evaluate(module):
    return evaluate_batches(eval_step, nnx.to_pure_dict(nnx.state(module, nnx.Param)),
                            data.val_batches, model_cfg.memory, mesh=mesh, per_doc=last_docs,
                            unit=unit)

  def finish(module, summary):
    # The final evaluation's loss per validation document, for paired document-level
    # statistics (experiments/analysis/stats/); evaluate ran at the last step just before.
    del module
    if val_names is None or not last_docs or jax.process_index() != 0:
      return {}
    path = validation.write_per_doc(summary["workdir"], summary["step"], unit, val_names,
                                    last_docs["nats"], last_docs["tokens"])
    return {"per_doc": str(path)}

  saved = saved_config("lm", config, model_cfg)
  return Task(
      module=model, saved_config=saved,
      batches=data.batches, loss=functools.partial(lm_loss, mesh=mesh, unit=unit),
      optim=config.optim, phases=(config.train.steps,), evaluate=evaluate, finish=finish,
      headline=lambda r: f"validation {r[bits_key('eval', unit)]:.4f} bits/{unit}",
      tokens_per_step=dc.batch_size * dc.seq_len, check_mesh=check_mesh,
      check_resume=resume_check(config, saved),
      placement=layout.placement_rules(model), seq_batches=True, batch_rows=rows,
      # LoRA: the backbone frozen, its factors and any inserted branch trained.
      trainable=lora_trainable if model_cfg.lora is not None else None,
      description=data.about + inserted)


class RunData(NamedTuple):
  """What a run trains and evaluates on: the training batches, the validation batches and
  their documents' names (None: no per-document losses), the line describing the data,
  the unit of its bits ("byte", "token") and a token run's vocabulary (None: bytes)."""
  batches: Any
  val_batches: Any
  val_names: Any
  about: str
  unit: str
  vocab_size: int | None


def _run_data(config, workdir, rows) -> RunData:
  """The run's data: a prepare-data directory's tokens (DESIGN.md §4.3) or the byte corpus
  (its manifest recorded in `workdir`); `rows`: this process's rows of every batch."""
  # grain is imported here, not at module level: notebooks and machines
  # without grain still import this package (restore, evaluate, metrics).
  from experiments.data.pipeline import TrainIterator, eval_batches
  dc = config.data
  if token_run.data_kind(config) == "tokens":   # a prepare-data directory (DESIGN.md §4.3)
    data = token_run.run_data(config, workdir, rows=None if rows is None else rows[:2],
                              record=jax.process_index() == 0)
    return RunData(data.batches, data.val_batches, data.val_names, data.description,
                   "token", data.vocab_size)
  corpus = load_corpus(corpus_spec(config))
  allow_change = bool(dc.get("allow_corpus_change", False))
  if jax.process_index() == 0:
    record_manifest(corpus, workdir, allow_change=allow_change)
  batches = TrainIterator(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size,
                          seed=dc.seed, rows=None if rows is None else rows[:2],
                          allow_corpus_change=allow_change)
  val_batches, val_names = validation.config_batches(
      corpus.val_docs, corpus.val_paths, dc,
      default=lambda: eval_batches(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size,
                                   max_batches=dc.eval_batches))
  about = f"corpus {corpus.train_bytes} train / {corpus.val_bytes} validation bytes"
  return RunData(batches, val_batches, val_names, about, "byte", None)
