"""Shared defaults of the LM experiments (a leaf: imports only ml_collections).

Not a config file itself (no `get_config`): `lm_baseline.py` and
`lm_lngram.py` start from `base_config()` and change what they study. The
library turns a config into its objects: `experiments.models.config.lm_config`
(the model), `experiments.data.corpus_spec` (the corpus).

Layout of an experiment config:
  model   the backbone (LMConfig fields; vocab_size 0 = the data's: 256 bytes, or
          the token data's vocabulary); model.lora: LoRA factors on the
          backbone (rank 0 = none); model.memory_layers and model.memory
          = dict(kind="lngram", <LngramConfig fields except d_model, which
          follows model.d_model>), the branch in those layers' memory slot.
  data    corpus (kind "bytes": data.path = a folder of text files, empty = the
          embedded Python standard library; kind "tokens": a directory written
          by `lngram-exp prepare-data`), split, packing, batch, shuffling seed.
  optim   AdamW, schedule, clipping, the table learning-rate multiplier.
  train   steps, logging, evaluation, checkpoints; the run-control fields
          allow_config_change (resume with another optimiser/schedule),
          profile_steps (steps to trace), grad_accum (micro-batches per step);
          wandb_project (set: the metrics also go to a Weights & Biases run, the
          `track` extra), wandb_entity, wandb_run_name, wandb_tags ("a,b"); ""
          leaves each to W&B (its WANDB_* environment variables).
  mesh    device mesh axis sizes data, fsdp, seq, table, expert (-1: the devices the
          others leave); all 1 = one device (experiments/trainer/placement.py).
  init_from  "" or the workdir of a run without memory: start from its
          backbone, new branches at init (the paper's App. B insertion).
"""

from __future__ import annotations

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = dict(
      d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=384,
      vocab_size=0, max_len=1024, rope_theta=10000.0, tie_embeddings=True, dtype="float32",
      param_dtype="float32", remat=False, norm_eps=1e-6, memory_layers=(),
      memory=dict(kind="lngram", routes=16, bits=4, orders=(2, 3), mem_dim=32, q_heads=4,
                  kv_heads=2, head_dim=32, sink_mass=0.5, surrogate="onebit",
                  readout="absorbed"),
      # LoRA on the backbone's projections (experiments/models/lora.py), off at rank 0;
      # on, the backbone is frozen and the factors (and any branch) train. alpha 8 and
      # targets "" (= q and the fused k/v projections) are PEFT's defaults.
      lora=dict(rank=0, alpha=8.0, dropout=0.0, targets=""))
  # kind "bytes": data.path is a folder of text files; "tokens": a `prepare-data` directory.
  # Validation: the first val_doc_cap units (bytes, tokens) of every validation document,
  # at most val_budget units in all (0: no bound), packed per document, losses kept per
  # document (experiments/data/validation.py); val_doc_cap 0 = the older first
  # eval_batches batches in path order (what a saved run without the field reads back).
  # dedup_validation (byte corpora): leave out every validation file with a near-duplicate
  # in the training split (experiments/data/dedup.py's rule; the files left out are
  # recorded in eval_per_doc.json). Off here, so every config and saved run keeps the set it
  # declared; the reproduction's runs declared from its v3 controls on turn it on.
  c.data = dict(kind="bytes", path="", val_fraction=0.05, max_files=0, seq_len=128,
                batch_size=16, seed=0, eval_batches=16, allow_corpus_change=False,
                val_doc_cap=32768, val_budget=524288, dedup_validation=False)
  # state_dtype "": AdamW's first moment in the parameters' dtype.
  c.optim = dict(lr=3e-3, table_lr_mult=4.0, weight_decay=0.1, b1=0.9, b2=0.95, eps=1e-8,
                 warmup_steps=50, min_lr_ratio=0.1, clip_norm=1.0, state_dtype="")
  c.train = dict(steps=600, seed=0, log_every=10, eval_every=200, ckpt_every=200,
                 max_to_keep=3, async_checkpoint=True, progress=True,
                 allow_config_change=False, profile_steps=(), grad_accum=1,
                 wandb_project="", wandb_entity="", wandb_run_name="", wandb_tags="")
  c.mesh = dict(data=1, fsdp=1, seq=1, table=1, expert=1)
  c.init_from = ""
  return c


# Fields added to the defaults after runs were saved without them: a saved run that
# lacks one ran with this value, so resuming it with this value is no change.
LATER_FIELDS = {"optim.state_dtype": "", "train.allow_config_change": False,
                "train.profile_steps": (), "train.grad_accum": 1,
                "data.allow_corpus_change": False, "data.kind": "bytes", "model.vocab_size": 0,
                "train.wandb_project": "", "train.wandb_entity": "", "train.wandb_run_name": "",
                "train.wandb_tags": "", "data.dedup_validation": False}


def memory_run(arg: str) -> tuple[ml_collections.ConfigDict, bool, list[str]]:
  """The start of every memory-arm config file: (config, smoke, other args).

  `base_config()` with the memory slot filled at layers 1 and 2 of 4 (the
  paper's "shallow and intermediate" placement); the `smoke` arg, if given, is
  applied (tiny model, memory at layer 1 of 2). The caller sets
  `config.model.memory` (after this, so that `smoke` shrinks only Lngram's
  default fields) and reads the remaining comma-separated args.
  """
  config = base_config()
  config.model.memory_layers = (1, 2)
  parts = [p for p in (arg or "").split(",") if p]
  is_smoke = "smoke" in parts
  if is_smoke:
    smoke(config)
    config.model.memory_layers = (1,)  # the smoke backbone has 2 layers
  return config, is_smoke, [p for p in parts if p != "smoke"]


def smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a config to seconds on CPU: tiny model, a slice of the corpus."""
  c.model.update(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
                 max_len=128)
  c.model.memory.update(routes=4, bits=2, mem_dim=8, q_heads=2, kv_heads=1, head_dim=16)
  c.data.update(max_files=12, seq_len=32, batch_size=4, eval_batches=2, val_doc_cap=256)
  c.optim.update(warmup_steps=2)
  c.train.update(steps=4, log_every=1, eval_every=4, ckpt_every=2, max_to_keep=2)
  return c
