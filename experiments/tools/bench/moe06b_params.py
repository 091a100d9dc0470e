"""The 0.6B MoE recipes' parameters and tokens, and the Table 4 claim beside ours.

    python -m experiments.tools.bench.moe06b_params

For each arm of experiments/configs/moe06b_*.py at full size (vocabulary 32,768,
as their commands pass it): total and active parameters per token
(`experiments.models.counts.lm_param_count`, whose docstring states the
formula), the memory module's share, and tokens per run; then the Lngram v1
and v2 r16 module counts beside the paper's "82.6% fewer parameters, 95.2%
fewer active" (Table 4). Generated from the configs, never typed.
"""

from __future__ import annotations

from experiments.configs import load_config
from experiments.models import lm_config
from experiments.models.counts import lm_param_count, table4_lines

VOCAB = 32768
ARMS = ("moe06b_baseline.py", "moe06b_lngram_v1.py", "moe06b_lngram_v2.py:r16",
        "moe06b_lngram_v2.py:r64", "moe06b_lngram_v2.py:r192")


def recipe(spec: str):
  config = load_config(f"experiments/configs/{spec}")
  config.model.vocab_size = VOCAB
  return config, lm_config(config)


def rows():
  out = []
  for spec in ARMS:
    config, lm = recipe(spec)
    c = lm_param_count(lm)
    tokens = config.data.batch_size * config.data.seq_len * config.train.steps
    out.append((spec, c["total"], c["active"], c["memory"], c["memory_active"], tokens))
  return out


def main():
  print("| config | total (M) | active / token (M) | memory (M) | memory active (M) | "
        "tokens (B) |")
  print("|---|---:|---:|---:|---:|---:|")
  for spec, total, active, memory, memory_active, tokens in rows():
    print(f"| {spec} | {total / 1e6:.2f} | {active / 1e6:.2f} | {memory / 1e6:.2f} | "
          f"{memory_active / 1e6:.2f} | {tokens / 1e9:.3f} |")
  print()
  _, v1 = recipe("moe06b_lngram_v1.py")
  _, v2 = recipe("moe06b_lngram_v2.py:r16")
  print("\n".join(table4_lines(v1, v2)))


if __name__ == "__main__":
  main()
