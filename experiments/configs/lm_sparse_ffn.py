"""Byte-level decoder LM with a top-1 sparse SwiGLU in lm_lngram's layers, parameter-matched to it.

    lngram-exp train --config=experiments/configs/lm_sparse_ffn.py --workdir=runs/lm_sparse_ffn

The Lngram paper's "matched Sparse FFN" arm (§4.1): same backbone, data,
steps and layers (1 and 2 of 4) as lm_lngram.py, the memory slot holding E
SwiGLU experts of width F behind a softmax top-1 router, with the Switch
balance loss (α = 0.01). Its total and active parameters per layer match
lm_lngram's at the same d within 2% (the (E, F, S) below come from
`experiments.models.arms.sparse_ffn.match_lngram`; a test checks they agree).

The arg is a comma-separated list:
  matched-to=r<R>       match lm_lngram.py:r<R> (default r16), R in MATCHED
  tiled|ragged|dense    how tokens reach their expert (default tiled; same result)
  smoke                 seconds on CPU: tiny model and a tiny arm (4 experts)

    lngram-exp train --config=experiments/configs/lm_sparse_ffn.py:matched-to=r64 --workdir=runs/sffn64
    lngram-exp train --config=experiments/configs/lm_sparse_ffn.py:smoke --workdir=/tmp/sffn_smoke
"""

from experiments.configs import base

# routes of lm_lngram -> (experts E, expert width F, shared width S) at d = 128.
MATCHED = {8: (27, 112, 0), 16: (51, 116, 0), 32: (93, 126, 0), 64: (152, 154, 0),
           128: (199, 234, 0)}
DISPATCHES = ("tiled", "ragged", "dense")


def _arm(experts, expert_dim, shared_dim, tile):
  return dict(kind="sparse_ffn", experts=experts, expert_dim=expert_dim,
              shared_dim=shared_dim, balance_coef=0.01, init_std=0.02, out_init_std=0.0,
              eps=1e-6, dispatch="tiled", tile=tile)


def get_config(arg: str = ""):
  config, smoke, parts = base.memory_run(arg)
  config.model.memory = _arm(*MATCHED[16], tile=32)
  dispatch = "tiled"
  for part in parts:
    if part in DISPATCHES:
      dispatch = part
    elif (part.startswith("matched-to=r") and part.removeprefix("matched-to=r").isdigit()
          and int(part.removeprefix("matched-to=r")) in MATCHED):
      config.model.memory = _arm(*MATCHED[int(part.removeprefix("matched-to=r"))], tile=32)
    else:
      raise ValueError(
          f"lm_sparse_ffn: unknown config arg {part!r}; use matched-to=r<R> with R in "
          f"{sorted(MATCHED)}, one of {DISPATCHES}, or smoke.")
  if smoke:
    config.model.memory = _arm(4, 16, 0, tile=8)
  config.model.memory.dispatch = dispatch
  return config
