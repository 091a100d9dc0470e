"""Byte-level decoder LM with Lngram v2 memory in a shallow and a middle layer.

    lngram-exp train --config=experiments/configs/lm_lngram.py --workdir=runs/lm_lngram

The default trains on 2 CPU cores in under 10 minutes and ends by printing
the validation bits per byte; compare with lm_baseline.py (same backbone,
data and steps). Lngram sits in layers 1 and 2 of 4 (the paper's "shallow and
intermediate" placement), 4-bit codes, 2/3-gram tables and the one-bit
surrogate (what the paper uses at scale; on CPU it costs ~20% less per step
than the exact surrogate, which is one arg away).

The arg is a comma-separated list:
  r<R>                  routes, e.g. r16 (default) or r64
  exact|onebit|ste|none the router's surrogate gradient (default onebit)
  smoke                 seconds on CPU: tiny model, a slice of the corpus

    lngram-exp train --config=experiments/configs/lm_lngram.py:r64,exact --workdir=runs/r64
    lngram-exp train --config=experiments/configs/lm_lngram.py:smoke --workdir=/tmp/smoke
"""

from experiments.configs import base

# The surrogate names of lngram_jax.config.SURROGATES, spelled out so that this
# file stays a leaf; experiments.models.config.lm_config checks them (and a test
# checks that the two lists agree).
SURROGATES = ("exact", "onebit", "ste", "none")


def get_config(arg: str = ""):
  config = base.base_config()
  config.model.memory_layers = (1, 2)
  parts = [p for p in (arg or "").split(",") if p]
  if "smoke" in parts:
    base.smoke(config)
    config.model.memory_layers = (1,)  # the smoke backbone has 2 layers
  for part in parts:
    if part == "smoke":
      continue
    if part in SURROGATES:
      config.model.memory.surrogate = part
    elif part.startswith("r") and part[1:].isdigit():
      config.model.memory.routes = int(part[1:])
    else:
      raise ValueError(
          f"lm_lngram: unknown config arg {part!r}; use r<routes>, one of {SURROGATES}, "
          "or smoke.")
  return config
