"""Qwen3-VL + PVM, Stage I: SFT of the PVM branches only (decoder and vision tower frozen).

    lngram-exp train --config=experiments/configs/qwen3vl_pvm_sft.py --config.qwen3vl.hf_dir=ckpt/Qwen3-VL-8B-Instruct --workdir=runs/qwen3vl_pvm_sft

The paper's Stage I (arXiv 2605.00814): PVM at layers 8/16/24 of Qwen3-VL-8B
(arg "4b": 5/11/17 of Qwen3-VL-4B), latent 512, every other width the authors'
`PVMMemoryBlock`'s; only the branches and their gates train; AdamW, LR 1e-4
cosine, warmup 10%, global batch 64 (the paper accumulates 8 micro-batches:
--config.data.batch_size=8 --config.train.grad_accum=8 is the same batch).
λ = 0 at the start, so step 0 is the base model. The review gives no epoch
count: train.steps = one pass over 526k samples at batch 64. Data:
--config.qwen3vl.data.train=PATH (LLaVA-style JSONL with image paths); empty =
the emoji counting scenes rendered into the run directory. Args: "8b"
(default), "4b", "smoke" (a tiny random Qwen3-VL and tokenizer, no download:
seconds on CPU). `train` prints the memory plan for 8 devices first.
"""

from experiments.configs import qwen3vl_common


def get_config(arg: str = ""):
  c = qwen3vl_common.qwen3vl_base_config("sft")
  c.optim.update(lr=1e-4, warmup_frac=0.1, min_lr_ratio=0.0)
  c.data.update(batch_size=64)
  c.train.update(steps=526_000 // 64)
  return qwen3vl_common.apply_args(c, arg, "qwen3vl_pvm_sft")
