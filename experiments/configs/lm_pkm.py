"""Byte-level decoder LM with Product Key Memory in Lngram v2's memory slots (a comparison arm).

    lngram-exp train --config=experiments/configs/lm_pkm.py --workdir=runs/lm_pkm

Same backbone, data and steps as lm_baseline.py and lm_lngram.py; PKM
(Lample et al. 2019, arXiv 1907.05242) sits in layers 1 and 2 of 4, where
lm_lngram puts Lngram v2, and adds its delta before those layers' attention.
Default size comparable with lm_lngram's r16 per layer: 128² = 16,384 slots of
d = 128 values, 4 heads, key dim 32, top-32 (2.13M total / 49k active
parameters vs Lngram's 2.28M / 51k). Output zero at init.

The arg is a comma-separated list:
  gated                 the "memory+" output (m ⊙ SiLU(x W_g)) W_o (Berges et al. 2024,
                        arXiv 2412.09764)
  keys<N>               N sub-keys per half (N² slots), e.g. keys256
  top<P>                slots read per head, e.g. top16
  smoke                 seconds on CPU: tiny model, a slice of the corpus

    lngram-exp train --config=experiments/configs/lm_pkm.py:gated --workdir=runs/lm_pkm_gated
    lngram-exp train --config=experiments/configs/lm_pkm.py:smoke --workdir=/tmp/pkm_smoke
"""

from experiments.configs import base


def get_config(arg: str = ""):
  config, smoke, parts = base.memory_run(arg)
  # Replaces the base's Lngram fields: value_dim 0 = d_model (values are the output).
  config.model.memory = dict(kind="pkm", heads=4, key_dim=32, num_keys=128, topk=32,
                             value_dim=0, gated=False, query_norm="rms", key_norm=False,
                             zero_init=True)
  if smoke:
    config.model.memory.update(heads=2, key_dim=8, num_keys=16, topk=4)
  for part in parts:
    if part == "gated":
      config.model.memory.gated = True
    elif part.startswith("keys") and part[4:].isdigit():
      config.model.memory.num_keys = int(part[4:])
    elif part.startswith("top") and part[3:].isdigit():
      config.model.memory.topk = int(part[3:])
    else:
      raise ValueError(
          f"lm_pkm: unknown config arg {part!r}; use gated, keys<N>, top<P> or smoke.")
  return config
