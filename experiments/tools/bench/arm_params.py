"""Total / active parameters per token of every memory arm, from their `param_count`s.

    python -m experiments.tools.bench.arm_params

Two settings, each arm in the two memory layers:
  small   the experiment configs' defaults (d = 128; experiments/configs/lm_*.py);
  paper   the Lngram v2 paper's Table 3 setting (d = 2048), where the arms are
          sized to Lngram v2 r121/m4/KV16 (the paper's Table 2 comparison), or
          to what the paper states (Lngram v1: the authors' Dm = 16 and the
          paper's Dm = 144).
Prints a markdown table (millions, two layers) generated from the code, never typed.
"""

from __future__ import annotations

from experiments.configs import load_config
from experiments.models import branches, lm_config
from experiments.models.arms import engram, lngram_v1, pkm, sparse_ffn
from experiments.models.params import branch_param_count as count
from lngram_jax.config import LngramConfig

ARM_FILES = ("lm_lngram", "lm_lngram.py:nosink", "lm_lngram.py:r64", "lm_pkm", "lm_engram",
             "lm_lngram_v1", "lm_sparse_ffn")


def small_rows():
  rows = []
  for spec in ARM_FILES:
    path = spec if spec.endswith(".py") or ".py:" in spec else f"{spec}.py"
    model = lm_config(load_config(f"experiments/configs/{path}"))
    c = count(model.memory)
    layers = len(model.memory_layers)
    rows.append((spec, branches.kind_of(model.memory).name, layers * c["total"],
                 layers * c["active"]))
  return rows


def paper_rows(d: int = 2048):
  r121 = LngramConfig(d_model=d, routes=121, bits=4, orders=(2, 3), mem_dim=128, q_heads=16,
                      kv_heads=16, head_dim=128)
  arms = {
      "Lngram v2 r121/m4/KV16": r121,
      "Lngram v2 r64/m4/KV8": r121.replace(routes=64, kv_heads=8),
      "Lngram v2 r16/m4/KV8": r121.replace(routes=16, kv_heads=8),
      "PKM H4/Dk256/Nk192/top32": pkm.PKMConfig(d_model=d, heads=4, key_dim=256,
                                                num_keys=192, topk=32),
      "Engram 8 heads x 160, base 26261": engram.EngramConfig(
          d_model=d, heads=8, head_dim=160, table_base=26261),
      "Lngram v1 Dm=16": lngram_v1.LngramV1Config(d_model=d, mem_dim=16),
      "Lngram v1 Dm=144": lngram_v1.LngramV1Config(d_model=d, mem_dim=144),
      "sparse FFN matched to r121": sparse_ffn.match_lngram(r121, d),
  }
  return [(name, branches.kind_of(c).name, 2 * count(c)["total"], 2 * count(c)["active"])
          for name, c in arms.items()]


def table(rows, title: str) -> str:
  lines = [f"{title}", "", "| arm | kind | total (M) | active / token (M) |",
           "|---|---|---:|---:|"]
  lines += [f"| {name} | {kind} | {total / 1e6:.3f} | {active / 1e6:.3f} |"
            for name, kind, total, active in rows]
  return "\n".join(lines)


def main():
  print(table(small_rows(), "Default configs (d = 128), memory layers of each config:"))
  print()
  print(table(paper_rows(), "Paper setting (d = 2048, two memory layers):"))


if __name__ == "__main__":
  main()
