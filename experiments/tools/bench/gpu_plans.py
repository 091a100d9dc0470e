"""The paper recipes compiled for the papers' GPUs on this machine: do they fit? (BENCHMARKS.md)

    python -m experiments.tools.bench.gpu_plans --out=experiments/results/records/gpu_plans
    python -m experiments.tools.bench.gpu_plans --out=... --only=moe06b_v2_h800x8
    python -m experiments.tools.bench.gpu_plans --out=... --table      the table, from the records
    python -m experiments.tools.bench.gpu_plans --out=... --buffers    what fills each peak

Each recipe is `lngram-exp plan --target=<gpu>:<GPUs>` (experiments/plan/report.py
`plan_run`) of a config at its own batch and sequence, compiled by XLA:GPU (jax's
CUDA plugin, `pip install -e '.[gpu-compile]'`) for the GPUs named, on this CPU
machine; nothing is allocated. Usable memory is JAX's allocator share
(XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set) of the memory CUDA reports. One
JSON record per recipe, written as soon as its compile ends, in the format of
tpu_plans (whose machinery this reuses); `--table` and `--buffers` render them.
"""

from __future__ import annotations

import sys

from experiments.tools.bench.tpu_plans import (
  CONFIGS,
  KEYE2B_LONG,
  MOE06B_VOCAB,
  Recipe,
  keye30b_recipes,
  main,
)

RECIPES = (
    Recipe("moe06b_baseline_h800x8", f"{CONFIGS}/moe06b_baseline.py", "data=8", "h800:8",
           MOE06B_VOCAB, purpose="Table 4 MoE 0.6B baseline, 32 rows x 4,096 (App. D.3)"),
    Recipe("moe06b_v1_h800x8", f"{CONFIGS}/moe06b_lngram_v1.py", "data=8", "h800:8",
           MOE06B_VOCAB, purpose="Table 4 MoE 0.6B + Lngram v1, 32 rows x 4,096"),
    Recipe("moe06b_v2_h800x8", f"{CONFIGS}/moe06b_lngram_v2.py", "data=8", "h800:8",
           MOE06B_VOCAB, purpose="Table 4 MoE 0.6B + Lngram v2, 32 rows x 4,096"),
    Recipe("moe06b_v2_expert8_h800x8", f"{CONFIGS}/moe06b_lngram_v2.py", "expert=8", "h800:8",
           MOE06B_VOCAB, purpose="the same, one expert per GPU: tokens by ragged all-to-all"),
    Recipe("keye2b_8k_h800x8", f"{CONFIGS}/hf_lngram.py:keye2b", "fsdp=8", "h800:8",
           (*KEYE2B_LONG, ("data.seq_len", "8192")),
           purpose="App. B Keye2B (Qwen3-1.7B widths) + Lngram, 8 rows x 8,192"),
    Recipe("keye2b_32k_h800x8", f"{CONFIGS}/hf_lngram.py:keye2b", "fsdp=8", "h800:8",
           (*KEYE2B_LONG, ("data.seq_len", "32768")),
           purpose="the same at the paper's 32,768 tokens"),
    Recipe("pvm8b_sft_h200x8", f"{CONFIGS}/qwen3vl_pvm_sft.py", "fsdp=8", "h200:8",
           purpose="PVM Stage I, Qwen3-VL-8B, 64 rows x 4,096 (the paper's GPU)"),
    Recipe("pvm8b_sft_h100x8", f"{CONFIGS}/qwen3vl_pvm_sft.py", "fsdp=8", "h100:8",
           purpose="the same on 80 GB H100s"),
    Recipe("pvm8b_grpo_h200x8", f"{CONFIGS}/qwen3vl_pvm_grpo.py", "fsdp=8", "h200:8",
           purpose="PVM Stage II (GRPO step), 8 prompts x group 8, 16,384-token completions"),
    Recipe("pvm8b_grpo_accum8_h200x8", f"{CONFIGS}/qwen3vl_pvm_grpo.py", "fsdp=8", "h200:8",
           (("train.grad_accum", "8"),),
           purpose="PVM Stage II (GRPO step), 8 prompts x group 8, 16,384-token completions, "
           "in 8 micro-batches"),
    Recipe("pvm8b_rollout_h200x8", f"{CONFIGS}/qwen3vl_pvm_grpo.py", "fsdp=8", "h200:8",
           purpose="PVM Stage II's rollout: prefill + decode loop, 64 rows to 16,384 new "
           "tokens (rows × cache slots; step s = the rollout's modelled time)",
           program="rollout"),
    *keye30b_recipes("h800x64", "h800:8x8", "GPU", full=True),
)


if __name__ == "__main__":
  from experiments.plan.gpu import quiet_cuda_startup
  quiet_cuda_startup()
  sys.exit(main(recipes=RECIPES, module="experiments.tools.bench.gpu_plans", doc=__doc__,
                compiler="XLA:GPU", unit="GPU"))
