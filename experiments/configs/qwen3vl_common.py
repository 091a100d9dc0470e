"""Shared defaults of the Qwen3-VL configs (qwen3vl_pvm_*.py, qwen3vl_lora_*.py).

Not a config file itself (no `get_config`); a leaf: imports only
ml_collections and `base`. The trainer reads `optim`, `train` and
`data.batch_size` as in every run; the `qwen3vl` block says what is trained:

  qwen3vl.hf_dir      a Qwen3-VL checkpoint (base, or the PVM authors' format with
                      `pvm_layers`); "" with the `smoke` arg = a tiny random model
  qwen3vl.init_from   Stage II: the Stage I run directory (its model, PVM included)
  qwen3vl.remat       recompute each decoder block in the backward (full sizes: on;
                      `smoke`: off)
  qwen3vl.pvm         layers and latent width of the branches (the paper's: 8/16/24
                      at 8B, 5/11/17 at 4B, latent 512); every other width is the
                      authors' (experiments/hf/pvm_format.py)
  qwen3vl.lora        LoRA factors on the decoder's projections (rank 0: none;
                      experiments/models/lora.py), the LoRA-SFT baseline's
  qwen3vl.stage       name "sft" | "grpo" and what trains ("branch": PVM only;
                      "lm+branch": decoder + PVM, the vision tower frozen;
                      "lora": the LoRA factors only)
  qwen3vl.data        train: a LLaVA-style JSONL ("" = the emoji scenes rendered
                      into the run directory, `emoji_n` rows); image_size: every
                      image resized to it (static shapes); seq_len: training rows
  qwen3vl.grpo        Stage II: group size, prompts per step, completion length,
                      LR, clip ε, KL coefficient, sampling temperature
  plan_devices        `train` first prints the memory plan for that many devices

The library turns the block into a model: experiments/vlm/qwen3vl/pvm.py
(`model_config`); the stages are experiments/jobs/qwen3vl/task.py.
"""

from __future__ import annotations

import ml_collections

from experiments.configs import base

# The paper (Qwen3-VL-4B / 8B): PVM layers and latent width.
SIZES = {"8b": (8, 16, 24), "4b": (5, 11, 17)}


def qwen3vl_base_config(stage: str) -> ml_collections.ConfigDict:
  c = base.base_config()
  # The model is the checkpoint's (qwen3vl.hf_dir); `model` and the corpus fields of
  # `data` are the byte LM's and unused here (kept: every config holds the run-control
  # fields of configs.LATER_FIELDS).
  del c["init_from"]
  c.data.update(batch_size=8, seq_len=4096)
  c.optim.update(weight_decay=0.0, warmup_steps=0, min_lr_ratio=0.0, table_lr_mult=1.0)
  c.train.update(log_every=10, eval_every=1000, ckpt_every=500)
  c.qwen3vl = dict(
      size="8b", hf_dir="", init_from="", max_len=0, remat=True,
      pvm=dict(layers=SIZES["8b"], latent_dim=512),
      # LoRA on the decoder (rank 0: none); qwen3vl_lora_sft.py sets PEFT's defaults.
      lora=dict(rank=0, alpha=8.0, dropout=0.0, targets=""),
      stage=dict(name=stage, trainable="branch" if stage == "sft" else "lm+branch"),
      data=dict(train="", emoji_n=2000, image_size=(448, 448)),
      grpo=dict(group_size=8, prompts_per_step=8, max_new_tokens=16384, lr=1e-6, clip_eps=0.2,
                kl_coef=0.0, temperature=1.0))
  c.plan_devices = 8
  return c


def apply_args(c: ml_collections.ConfigDict, arg: str, name: str) -> ml_collections.ConfigDict:
  """Args: "8b" (default) | "4b" (the paper's layers for that model) | "smoke"."""
  parts = [p for p in (arg or "").split(",") if p]
  unknown = [p for p in parts if p not in ("8b", "4b", "smoke")]
  if unknown or len(parts) > 1:
    raise ValueError(f"{name}: unknown args {parts}; use one of '8b', '4b', 'smoke'.")
  size = parts[0] if parts else "8b"
  q = c.qwen3vl
  q.size = size
  if size in SIZES:
    q.pvm.layers = SIZES[size]
    return c
  # smoke: a tiny random Qwen3-VL (experiments/vlm/qwen3vl/pvm.py), seconds on CPU.
  c.plan_devices = 0
  c.data.update(batch_size=2, seq_len=192)
  c.optim.update(warmup_steps=0)
  c.train.update(steps=3, log_every=1, eval_every=3, ckpt_every=2, max_to_keep=2,
                 grad_accum=1)
  q.update(max_len=256, remat=False)
  q.pvm.update(layers=(1,), latent_dim=32)
  q.data.update(emoji_n=8, image_size=(128, 128))
  q.grpo.update(group_size=2, prompts_per_step=1, max_new_tokens=4)
  return c


def lora_baseline(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The PVM paper's LoRA rows: no branch, LoRA factors (PEFT's defaults: r 8, alpha 8,
  dropout 0, q and v projections, targets "" = experiments/models/lora.py's default)
  the only trained parameters."""
  c.qwen3vl.pvm.layers = ()
  c.qwen3vl.lora.update(rank=8, alpha=8.0, dropout=0.0, targets="")
  c.qwen3vl.stage.trainable = "lora"
  return c
