"""Byte-level decoder LM with Engram hashed n-gram memory in Lngram v2's memory slots (a comparison arm).

    lngram-exp train --config=experiments/configs/lm_engram.py --workdir=runs/lm_engram

Same backbone, data and steps as lm_baseline.py and lm_lngram.py; Engram
(Cheng et al. 2026, "Conditional Memory via Scalable Lookup", arXiv 2601.07372)
sits in layers 1 and 2 of 4, where lm_lngram puts Lngram v2, and adds its
delta before those layers' attention. It hashes the byte ids (ASCII case
folded) of the 2- and 3-grams ending at each position, 4 heads per order, each
with its own prime-sized table (>= 11587 rows of width 24): 2.28M total / 50k
active parameters per layer vs Lngram r16's 2.28M / 51k. Its output is not
zero at init (the original's value projection is random); `zeroinit` makes it so.

The arg is a comma-separated list:
  zeroinit              W_v, b_v start at zero (step 0 equals the baseline)
  nofold                raw byte ids (no ASCII case folding)
  base<N>               the smallest table size per head, e.g. base4099
  smoke                 seconds on CPU: tiny model, a slice of the corpus

    lngram-exp train --config=experiments/configs/lm_engram.py:zeroinit --workdir=runs/engram0
    lngram-exp train --config=experiments/configs/lm_engram.py:smoke --workdir=/tmp/engram_smoke
"""

from experiments.configs import base


def get_config(arg: str = ""):
  config, smoke, parts = base.memory_run(arg)
  # Replaces the base's Lngram fields.
  config.model.memory = dict(kind="engram", orders=(2, 3), heads=4, head_dim=24,
                             table_base=11587, vocab_size=256, case_fold=True, hash_seed=0,
                             conv_kernel=4, zero_init=False)
  if smoke:
    config.model.memory.update(heads=2, head_dim=8, table_base=97)
  for part in parts:
    if part == "zeroinit":
      config.model.memory.zero_init = True
    elif part == "nofold":
      config.model.memory.case_fold = False
    elif part.startswith("base") and part[4:].isdigit():
      config.model.memory.table_base = int(part[4:])
    else:
      raise ValueError(
          f"lm_engram: unknown config arg {part!r}; use zeroinit, nofold, base<N> or smoke.")
  return config
