"""Qwen3-VL + PVM, Stage II: GRPO of the decoder and PVM (vision tower frozen), from Stage I.

    lngram-exp train --config=experiments/configs/qwen3vl_pvm_grpo.py --config.qwen3vl.init_from=runs/qwen3vl_pvm_sft --workdir=runs/qwen3vl_pvm_grpo

The paper's Stage II (arXiv 2605.00814): group size G = 8, group-relative
advantages, clipped ratio (ε = 0.2), KL coefficient 0 (no reference forward),
AdamW LR 1e-6 constant, completions up to 16,384 tokens; reward 0.1·format +
0.9·accuracy of "<answer>N</answer>" against each row's "answer"
(experiments.vlm.emoji.rewards). Sampling prefills [image | prompt] once and decodes
with the KV cache and PVM's visual cache. Prompts per step (8, so 64
completions) is our choice: the review does not state it. The model is the
Stage I run's (qwen3vl.init_from; its args must match: "8b", "4b", "smoke").
Data as Stage I (--config.qwen3vl.data.train=PATH, rows with an "answer").
"""

from experiments.configs import qwen3vl_common


def get_config(arg: str = ""):
  c = qwen3vl_common.qwen3vl_base_config("grpo")
  c.train.update(steps=3600 // 8, log_every=1)
  return qwen3vl_common.apply_args(c, arg, "qwen3vl_pvm_grpo")
