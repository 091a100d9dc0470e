"""Byte-level decoder LM with Lngram v2 memory in a shallow and a middle layer.

    lngram-exp train --config=experiments/configs/lm_lngram.py --workdir=runs/lm_lngram

The default trains on 2 CPU cores in under 10 minutes and ends by printing
the validation bits per byte; compare with lm_baseline.py (same backbone,
data and steps). Lngram sits in layers 1 and 2 of 4 (the paper's "shallow and
intermediate" placement), 4-bit codes, 2/3-gram tables and the one-bit
surrogate (what the paper uses at scale; on CPU it costs ~20% less per step
than the exact surrogate, which is one arg away).

The arg is a comma-separated list (the paper's Table 3 names its rows the
same way, e.g. r23/m4/KV8/mem256 is `r23,m4,kv8,mem256`):
  r<R>                  routes, e.g. r16 (default) or r64
  m<M>                  bits per route, e.g. m5 (default m4)
  kv<H>                 KV heads of the readout (default 2; must divide the 4
                        query heads: kv1, kv2 or kv4)
  mem<Dm>               memory-entry width Dm (default 32); the readout head
                        dim follows it, as in the paper (head_dim = mem_dim),
                        so q_heads·head_dim may differ from d_model
  nosink                no zero-value sink: softmax over the routes only (the
                        paper's §4.2 ablation)
  exact|onebit|ste|none the router's surrogate gradient (default onebit)
  smoke                 seconds on CPU: tiny model, a slice of the corpus

    lngram-exp train --config=experiments/configs/lm_lngram.py:r64,exact --workdir=runs/r64
    lngram-exp train --config=experiments/configs/lm_lngram.py:nosink --workdir=runs/nosink
    lngram-exp train --config=experiments/configs/lm_lngram.py:r23,kv2,mem64 --workdir=runs/m64
    lngram-exp train --config=experiments/configs/lm_lngram.py:smoke --workdir=/tmp/smoke
"""

from experiments.configs import base

# The surrogate names of lngram_jax.config.SURROGATES, spelled out so that this
# file stays a leaf; experiments.models.config.lm_config checks them (and a test
# checks that the two lists agree).
SURROGATES = ("exact", "onebit", "ste", "none")


def get_config(arg: str = ""):
  config, smoke, parts = base.memory_run(arg)
  for part in parts:
    memory = config.model.memory
    if part in SURROGATES:
      memory.surrogate = part
    elif part == "nosink":
      memory.sink = False
    elif part.startswith("mem") and part[3:].isdigit():
      memory.mem_dim = memory.head_dim = int(part[3:])
    elif part.startswith("kv") and part[2:].isdigit():
      memory.kv_heads = int(part[2:])
    elif part.startswith("m") and part[1:].isdigit():
      memory.bits = int(part[1:])
    elif part.startswith("r") and part[1:].isdigit():
      memory.routes = int(part[1:])
    else:
      raise ValueError(
          f"lm_lngram: unknown config arg {part!r}; use r<routes>, m<bits>, kv<heads>, "
          f"mem<dim>, nosink, one of {SURROGATES}, or smoke.")
  return config
