"""Lngram v2 with its router frozen at init: the random-router control of the ID analyses.

    lngram-exp train --config=experiments/configs/lm_lngram_random_router.py --workdir=runs/random_router
    lngram-exp train --config=experiments/configs/lm_lngram_random_router.py:r64 --workdir=runs/random_router_r64

The same model, data and schedule as lm_lngram.py (every arg of lm_lngram.py
applies: r64, smoke, ...), but `router_w` never trains (`optim.freeze`, an
optimiser mask: its update is zero and it holds no Adam moments), so the codes
stay a fixed random projection of the layer input while the tables, readout and
backbone train. `lngram-exp analyze` on it says how much of ID-KNN's score
(DESIGN.md §9.3) a router needs to learn: what a random hash of the hidden state
already gives is the floor the learned router's ρ must clear.
"""

from experiments.configs import lm_lngram


def get_config(arg: str = ""):
  config = lm_lngram.get_config(arg)
  config.optim.freeze = ("router_w",)
  return config
