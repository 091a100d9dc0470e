"""`python -m experiments.vlm {train,analyze}`: the VLM stages without the lngram-exp CLI.

    python -m experiments.vlm train --config=experiments/configs/vlm_base.py[:arg] --workdir=runs/x
                                    [--config.<field>=<value> ...]
    python -m experiments.vlm analyze --workdir=runs/x [--n=32 --which=attention,accuracy,logit_lens,grounding]
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "VLM config file `path.py[:arg]`.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_N = flags.DEFINE_integer("n", 32, "analyze: validation scenes.")
_WHICH = flags.DEFINE_list("which", ["attention", "accuracy", "logit_lens", "grounding"],
                           "analyze: which.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "analyze: answer length cap.")


def _run(argv):
  if len(argv) != 2 or argv[1] not in ("train", "analyze") or not _WORKDIR.value:
    raise app.UsageError("usage: python -m experiments.vlm {train,analyze} --workdir=... "
                         "[--config=...]")
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
  logging.getLogger("jax").setLevel(logging.WARNING)
  from experiments.vlm import run
  if argv[1] == "train":
    if _CONFIG.value is None:
      raise app.UsageError("train needs --config=<file.py[:arg]>.")
    metrics = run.run_stage(_CONFIG.value, _WORKDIR.value)
    print(f"done: {metrics['stage']}, eval {metrics['eval']['overall']}")
    return 0
  out = run.analyze(_WORKDIR.value, which=tuple(_WHICH.value), n=_N.value,
                    max_new_tokens=_MAX_NEW.value)
  print(f"wrote {sorted(out)} into {_WORKDIR.value}")
  return 0


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(_run(argv)))
