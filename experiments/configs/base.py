"""Shared defaults of the LM experiments and the config -> library conversions.

Not a config file itself (no `get_config`): `lm_baseline.py` and
`lm_lngram.py` start from `base_config()` and change what they study.

Layout of an experiment config:
  model   the backbone (LMConfig fields); model.lngram_layers and model.lngram
          (LngramConfig fields except d_model, which follows model.d_model).
  data    corpus (data.path = a folder of text files, empty = the embedded
          Python standard library), split, packing, batch, shuffling seed.
  optim   AdamW, schedule, clipping, the table learning-rate multiplier.
  train   steps, logging, evaluation, checkpoints.
"""

from __future__ import annotations

import ml_collections

from experiments.data.corpus import CorpusSpec
from experiments.models import LMConfig
from lngram_jax.config import LngramConfig


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = dict(
      d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=384,
      max_len=1024, rope_theta=10000.0, tie_embeddings=True, dtype="float32",
      param_dtype="float32", remat=False, norm_eps=1e-6, lngram_layers=(),
      lngram=dict(routes=16, bits=4, orders=(2, 3), mem_dim=32, q_heads=4, kv_heads=2,
                  head_dim=32, sink_mass=0.5, surrogate="onebit", readout="absorbed"))
  c.data = dict(path="", val_fraction=0.05, max_files=0, seq_len=128, batch_size=16,
                seed=0, eval_batches=16)
  c.optim = dict(lr=3e-3, table_lr_mult=4.0, weight_decay=0.1, b1=0.9, b2=0.95, eps=1e-8,
                 warmup_steps=50, min_lr_ratio=0.1, clip_norm=1.0)
  c.train = dict(steps=600, seed=0, log_every=10, eval_every=200, ckpt_every=200,
                 max_to_keep=3, async_checkpoint=True, progress=True)
  return c


def smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a config to seconds on CPU: tiny model, a slice of the corpus."""
  c.model.update(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
                 max_len=128)
  c.model.lngram.update(routes=4, bits=2, mem_dim=8, q_heads=2, kv_heads=1, head_dim=16)
  c.data.update(max_files=12, seq_len=32, batch_size=4, eval_batches=2)
  c.optim.update(warmup_steps=2)
  c.train.update(steps=4, log_every=1, eval_every=4, ckpt_every=2, max_to_keep=2)
  return c


def lm_config(c: ml_collections.ConfigDict) -> LMConfig:
  """The model config an experiment config describes."""
  m = c.model.to_dict()
  lngram = m.pop("lngram")
  layers = tuple(m["lngram_layers"])
  m["lngram"] = LngramConfig(d_model=m["d_model"], **_tuples(lngram)) if layers else None
  m["lngram_layers"] = layers
  if c.data.seq_len > m["max_len"]:
    raise ValueError(
        f"data.seq_len={c.data.seq_len} exceeds model.max_len={m['max_len']}.")
  return LMConfig(**m)


def corpus_spec(c: ml_collections.ConfigDict) -> CorpusSpec:
  """data.path empty -> the embedded standard-library corpus, else that folder."""
  d = c.data
  return CorpusSpec(source="folder" if d.path else "stdlib", path=d.path,
                    val_fraction=d.val_fraction, max_files=d.max_files)


def _tuples(d: dict) -> dict:
  return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
