"""Qwen3-VL LoRA-SFT: the PVM paper's LoRA baseline, Stage I data and schedule, no branch.

    lngram-exp train --config=experiments/configs/qwen3vl_lora_sft.py --config.qwen3vl.hf_dir=ckpt/Qwen3-VL-8B-Instruct --workdir=runs/qwen3vl_lora_sft

The paper's LoRA-SFT row (arXiv 2605.00814, Qwen3-VL-8B: 67.5 against PVM-SFT's
70.6): the backbone frozen, LoRA factors on the decoder trained on the Stage I
data with the Stage I schedule (AdamW, LR 1e-4 cosine, warmup 10%, global
batch 64, one pass over 526k samples: qwen3vl_pvm_sft.py's), no PVM branch.
The review states neither rank nor targets: PEFT's defaults, r = 8,
alpha = 8, dropout 0, q_proj and v_proj (our k and v are one fused weight,
so k gets factors too; DESIGN.md §13). Override with
--config.qwen3vl.lora.rank=N, .alpha, .targets (a regex over decoder
weight paths, e.g. "blocks/\\d+/(attn/w_(q|kv|o)|mlp/w_(gate|up|down))").
B = 0 at the start, so step 0 is the base model. Args: "8b" (default), "4b",
"smoke" (a tiny random Qwen3-VL and tokenizer: seconds on CPU). Stage II:
qwen3vl_lora_grpo.py.
"""

from experiments.configs import qwen3vl_common


def get_config(arg: str = ""):
  c = qwen3vl_common.qwen3vl_base_config("sft")
  c.optim.update(lr=1e-4, warmup_frac=0.1, min_lr_ratio=0.0)
  c.data.update(batch_size=64)
  c.train.update(steps=526_000 // 64)
  c = qwen3vl_common.apply_args(c, arg, "qwen3vl_lora_sft")
  return qwen3vl_common.lora_baseline(c)
