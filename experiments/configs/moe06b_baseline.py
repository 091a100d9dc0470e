"""The 0.6B MoE without memory: the Baseline column of the Lngram v2 paper's Table 4.

    lngram-exp train --config=experiments/configs/moe06b_baseline.py \
        --config.data.kind=tokens --config.data.path=data/fwe32k \
        --config.model.vocab_size=32768 --config.mesh.data=8 --workdir=runs/moe06b_baseline

A DeepSeek-V2-style sparse MoE trained from scratch (App. D.3): 24 layers,
d 768, 12 heads, 2 KV heads, 8 routed experts + 1 shared expert, top-2, in
every layer; 10,000 steps x 32 rows x 4,096 tokens = 1.31B FineWeb-Edu tokens;
LR 3e-4, 1% warm-up, the cosine of a 61,036-step run stopped at step 10,000,
seed 42 (App. A.5). 593.2M parameters, 253.4M active per token, at the
32,768-token vocabulary passed above. Every choice the paper does not state
(expert width, vocabulary, sequence length, ...) is listed in
moe06b_common.py and DESIGN.md §12. data/fwe32k is a `prepare-data`
directory of FineWeb-Edu shards (docs/reproductions.md, "The paper's experiments");
moe06b_lngram_v1.py and moe06b_lngram_v2.py add the memory arms.

Args: "" or "smoke" (seconds on CPU, the embedded byte corpus, no flags needed):

    lngram-exp train --config=experiments/configs/moe06b_baseline.py:smoke --workdir=/tmp/moe_smoke
"""

from experiments.configs import moe06b_common


def get_config(arg: str = ""):
  config, _, _ = moe06b_common.recipe(arg, "moe06b_baseline")
  return config
