"""Byte-level decoder LM without memory layers: the baseline of lm_lngram.

    lngram-exp train --config=experiments/configs/lm_baseline.py --workdir=runs/lm_baseline

Same backbone, data, optimiser and steps as lm_lngram.py, so the validation
bits per byte of the two runs compare directly. Args: "" (the default run,
minutes on 2 CPU cores) or "smoke" (a few seconds, a slice of the corpus):

    lngram-exp train --config=experiments/configs/lm_baseline.py:smoke --workdir=/tmp/smoke
"""

from experiments.configs import base


def get_config(arg: str = ""):
  config = base.base_config()
  config.model.memory_layers = ()
  for part in filter(None, (arg or "").split(",")):
    if part == "smoke":
      base.smoke(config)
    else:
      raise ValueError(f"lm_baseline: unknown config arg {part!r}; use '' or 'smoke'.")
  return config
