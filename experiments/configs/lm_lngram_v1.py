"""Byte-level decoder LM with Lngram v1 (single table per order) in the memory slots (a comparison arm).

    lngram-exp train --config=experiments/configs/lm_lngram_v1.py --workdir=runs/lm_lngram_v1

Same backbone, data and steps as lm_baseline.py and lm_lngram.py; Lngram v1
("Lngram: N-gram Conditional Memory in Latent Space", arXiv 2605.24869) sits
in layers 1 and 2 of 4, where lm_lngram puts v2. v1 couples its routes to
the width: router d → d, R = d/4 = 32 routes of 4-bit codes at d = 128, 2/3-gram
tables, sigmoid-gated readout with dense W_K/W_V (R·Dm → d) shared by the
orders, the one-bit surrogate. Default Dm = 16 (the authors' default): its
tables hold exactly as many parameters as lm_lngram r16's (2.23M per layer;
2.38M total / 150k active vs v2's 2.28M / 51k). Output zero at init (zero
tables and conv taps, as in the authors' code).

The arg is a comma-separated list:
  mem<Dm>               table row width, e.g. mem8 or mem32
  r<R>                  R routes set apart from the width (router d -> R·M, as Lngram
                        v2's; a control: v1 itself has R = d / M)
  zerotable             the tables stay at their zero init (frozen, `optim.freeze`):
                        every read is 0, so only the dense path acts (k = b_K,
                        v = b_V, the gate and the conv); a control locating v1's lead
  exact|onebit|ste|none the router's surrogate gradient (default onebit; the
                        authors' single-table file builds only "exact")
  smoke                 seconds on CPU: tiny model, a slice of the corpus

    lngram-exp train --config=experiments/configs/lm_lngram_v1.py:exact --workdir=runs/v1_exact
    lngram-exp train --config=experiments/configs/lm_lngram_v1.py:smoke --workdir=/tmp/v1_smoke
"""

from experiments.configs import base

# lngram_jax.config.SURROGATES, spelled out so that this file stays a leaf.
SURROGATES = ("exact", "onebit", "ste", "none")


def get_config(arg: str = ""):
  config, smoke, parts = base.memory_run(arg)
  # Replaces the base's Lngram v2 fields; eps follows the backbone's norm_eps
  # (the router reuses the block's own pre-attention RMSNorm).
  config.model.memory = dict(kind="lngram_v1", bits=4, orders=(2, 3), mem_dim=16,
                             surrogate="onebit", eps=config.model.norm_eps)
  if smoke:
    config.model.memory.update(bits=2, mem_dim=4)  # d = 32: R = 16 routes of 4 codes
  for part in parts:
    if part in SURROGATES:
      config.model.memory.surrogate = part
    elif part.startswith("mem") and part[3:].isdigit():
      config.model.memory.mem_dim = int(part[3:])
    elif part.startswith("r") and part[1:].isdigit():
      config.model.memory.n_routes = int(part[1:])
    elif part == "zerotable":   # zero at init (table_init_std 0) and never trained
      config.model.memory.table_init_std = 0.0
      config.optim.freeze = ("tables",)
    else:
      raise ValueError(
          f"lm_lngram_v1: unknown config arg {part!r}; use mem<Dm>, r<routes>, zerotable, "
          f"one of {SURROGATES}, or smoke.")
  return config
