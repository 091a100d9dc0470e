"""The 0.6B MoE with Lngram v1 in layers 2 and 12: the Lngram v1 column of Table 4.

    lngram-exp train --config=experiments/configs/moe06b_lngram_v1.py \
        --config.data.kind=tokens --config.data.path=data/fwe32k \
        --config.model.vocab_size=32768 --config.mesh.data=8 --workdir=runs/moe06b_lngram_v1

The backbone, data order, optimiser and seed of moe06b_baseline.py
(moe06b_common.py); Lngram v1 ("Lngram: N-gram Conditional Memory in Latent
Space", arXiv 2605.24869) in the 2nd and 12th layers (memory_layers (1, 11),
0-based): router d -> d, so R = 768 / 4 = 192 routes of 4-bit codes, 2/3-gram
tables, the one-bit surrogate. The paper gives no table width for v1 at
d = 768; Dm = 24 is ours, chosen so that v2 r16 (moe06b_lngram_v2.py) has the
paper's 82.6% fewer module parameters and 95.2% fewer active ones (we get
82.61% / 95.22%: 55.46M / 15.37M for v1's two layers against v2's 9.64M /
0.73M; `python -m experiments.tools.bench.moe06b_params` prints them).

Args (comma-separated):
  exact|onebit|ste|none the router's surrogate gradient (default onebit)
  smoke                 seconds on CPU, the embedded byte corpus

    lngram-exp train --config=experiments/configs/moe06b_lngram_v1.py:smoke --workdir=/tmp/v1_smoke
"""

from experiments.configs import moe06b_common

# lngram_jax.config.SURROGATES, spelled out so that this file stays a leaf.
SURROGATES = ("exact", "onebit", "ste", "none")
MEM_DIM = 24   # ours (module docstring)


def get_config(arg: str = ""):
  config, smoke, parts = moe06b_common.recipe(arg, "moe06b_lngram_v1", SURROGATES)
  config.model.memory_layers = moe06b_common.memory_layers(smoke)
  # eps follows the backbone: v1's router reads the block's own pre-attention RMSNorm.
  config.model.memory = dict(kind="lngram_v1", bits=4, orders=(2, 3), mem_dim=MEM_DIM,
                             surrogate="onebit", eps=config.model.norm_eps)
  if smoke:
    config.model.memory.update(bits=2, mem_dim=4)   # d = 32: 16 routes of 4 codes
  for part in parts:
    config.model.memory.surrogate = part
  return config
