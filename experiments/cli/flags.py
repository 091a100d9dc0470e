"""The flags of `lngram-exp`: those several commands share, then each command module's own.

absl defines a flag once per FlagValues, so a flag two commands take (--workdir, --step,
--mesh, --seed, --max_new_tokens) is defined here and named in each command's `FLAGS_OF`.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from experiments.cli.commands import MODULES

# (absl kind, name, default, lower bound, help)
SHARED_FLAGS = [
    ("string", "workdir", None, None, "Run directory (checkpoints, metrics)."),
    ("integer", "step", None, None, "eval/sample/analyze/export-hf/lm-eval: checkpoint step "
     "(default newest)."),
    ("string", "mesh", None, None, "eval/sample/plan: a device mesh, e.g. data=2,table=4."),
    ("integer", "seed", 0, None, "sample: PRNG seed; analyze (LM runs): every sample's seed; "
     "lm-eval: its seeds."),
    ("integer", "max_new_tokens", None, 1, "sample: bytes to generate (default 200, capped "
     "to max_len); analyze (VLM runs): answer length cap."),
    ("bool", "debug", False, None, "Show the full traceback of an error."),
]


def define_flags(argv: list[str]) -> flags.FlagValues:
  """The flags, on a FlagValues of their own; config_flags reads overrides from `argv`."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "train, plan: config file <file.py[:arg]>; "
                                  "set its fields with --config.<field>=<value>.",
                                  flag_values=fv, sys_argv=argv)
  for kind, name, default, bound, text in [*SHARED_FLAGS,
                                           *(f for m in MODULES for f in m.FLAGS)]:
    bounds = {} if bound is None else {"lower_bound": bound}
    # `kind`: an absl kind's name, or a command's own definer (experiments/cli/commands/hf.py).
    define = kind if callable(kind) else getattr(flags, f"DEFINE_{kind}")
    define(name, default, text, flag_values=fv, **bounds)
  return fv
