"""Qwen3-VL LoRA-SFT+GRPO: Stage II GRPO of the LoRA factors, from a LoRA-SFT run.

    lngram-exp train --config=experiments/configs/qwen3vl_lora_grpo.py --config.qwen3vl.init_from=runs/qwen3vl_lora_sft --workdir=runs/qwen3vl_lora_grpo

The paper's LoRA-SFT+GRPO row (arXiv 2605.00814, Qwen3-VL-8B: 68.4 against PVM
SFT+GRPO's 71.5): Stage II as qwen3vl_pvm_grpo.py (G = 8, clip ε 0.2, KL 0,
AdamW LR 1e-6 constant, completions up to 16,384 tokens, reward 0.1·format +
0.9·accuracy), on the LoRA-SFT run's model (qwen3vl.init_from, factors
included). What trains in Stage II of the LoRA row the review does not say; the
LoRA factors keep training and the backbone stays frozen (a LoRA run's adapter
is what it trains). Args as Stage I: "8b", "4b", "smoke".
"""

from experiments.configs import qwen3vl_common


def get_config(arg: str = ""):
  c = qwen3vl_common.qwen3vl_base_config("grpo")
  c.train.update(steps=3600 // 8, log_every=1)
  c = qwen3vl_common.apply_args(c, arg, "qwen3vl_lora_grpo")
  return qwen3vl_common.lora_baseline(c)
