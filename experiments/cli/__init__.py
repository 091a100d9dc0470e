"""`lngram-exp`: train, evaluate, sample and analyse the experiments; list their configs.

    lngram-exp train   --config=experiments/configs/lm_lngram.py[:arg] --workdir=runs/x
                       [--config.train.steps=100 --config.data.path=texts/] [--max_memory=8GiB]
    lngram-exp eval    --workdir=runs/x [--step=N] [--mesh=data=2,table=4]   (LM runs)
    lngram-exp sample  --workdir=runs/x --prompt='def ' [--max_new_tokens=200 --top_k=20]
    lngram-exp configs | prepare-data | train-tokenizer | import-hf | export-hf
    lngram-exp plan    --config=experiments/configs/hf_lngram.py:keye2b --mesh=fsdp=64
                       [--accelerator=h100 --mfu=0.4]   (memory, FLOPs, collectives, step time)
    lngram-exp analyze --workdir=runs/x [--step=N] [--which=...]   (LM runs: the ID analyses;
                       VLM runs: attention decay, accuracy by length, LogitLens, grounding)

Several devices: `--config.mesh.data=-1` (train), `--mesh=...` (eval, sample); several hosts:
`--coordinator=host0:1234 --num_processes=N --process_id=i` (train; or JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID). Each command takes only its own flags; every mistake is
one line `error: ...` and exit status 2 (`--debug`: the traceback). Also `python -m
experiments`. Each command is a module of experiments/cli/commands/ (its flags, its
checks, its body); this file reads the command line and dispatches (flags.py defines the
flags with absl and ml_collections config_flags).
"""

from __future__ import annotations

import sys

from absl import flags

from experiments.cli.commands import MODULES
from experiments.cli.commands.analyze import ANALYZE_FLAGS_OF
from experiments.cli.flags import define_flags
from experiments.cli.overrides import (
    UsageError,
    given_flags,
    mentions_config,
    parse_command_line,
    refuse_flags,
)

# One line each for `lngram-exp --help`; the flags each command takes (and --debug; analyze's
# depend on the run's kind); those it cannot run without (its usage line names them).
COMMANDS = {name: text for m in MODULES for name, text in m.COMMANDS.items()}
FLAGS_OF = {name: takes for m in MODULES for name, takes in m.FLAGS_OF.items()}
REQUIRED_OF = {name: needs for m in MODULES for name, needs in m.REQUIRED_OF.items()}
MODULE_OF = {name: m for m in MODULES for name in m.COMMANDS}
# A command's own text for a flag it shares with others (`COMMAND --help`).
FLAG_HELP = {name: texts for m in MODULES for name, texts in getattr(m, "FLAG_HELP", {}).items()}
__all__ = ["ANALYZE_FLAGS_OF", "COMMANDS", "FLAGS_OF", "REQUIRED_OF", "define_flags", "main",
           "run_main", "usage"]


def usage(fv: flags.FlagValues | None = None) -> str:
  width = max(len(c) for c in COMMANDS)
  lines = ["usage: lngram-exp <command> [flags]", "", "commands:"]
  lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
  if fv is not None:
    lines += ["", "flags:", fv.module_help(next(iter(fv.flags_by_module_dict())))]
  return "\n".join(lines)


def refuse_non_finite(fv: flags.FlagValues) -> None:
  """One line for a float flag given as nan or inf (absl parses both; a `<= 0` check
  lets NaN through)."""
  import math
  for name in fv:
    flag = fv[name]
    if (flag.present and isinstance(flag.value, float) and not name.startswith("config.")
        and not math.isfinite(flag.value)):
      raise ValueError(f"--{name}={flag.value} is not a finite number.")


def command_usage(fv: flags.FlagValues, command: str) -> str:
  """`lngram-exp COMMAND --help`: one usage line, what the command does, and its own
  flags only (analyze: those of both run kinds), each with its default."""
  names = set(FLAGS_OF[command])
  if command == "analyze":
    names = names | set().union(*ANALYZE_FLAGS_OF.values())
  names = sorted(names | {"debug"})
  required = [f"--{n}=..." for n in REQUIRED_OF.get(command, ())]
  lines = [f"usage: lngram-exp {command} {' '.join(required + ['[flags]'])}".rstrip(),
           "", f"{COMMANDS[command]}.", "", "flags:"]
  for name in names:
    flag = fv[name]
    default = "" if flag.default in (None, [], "") else f" (default: {flag.default_as_str})"
    text = FLAG_HELP.get(command, {}).get(name, flag.help)
    lines.append(f"  --{name}: {text}{default}")
  if "config" in names:
    lines.append("  --config.<field>=<value>: set a field of the config file")
  return "\n".join(lines)


def _help(argv: list[str], fv: flags.FlagValues) -> tuple[str, int]:
  """(text, status) of a help request: the commands, or one command's usage; an
  unknown command is one line naming the commands (status 2)."""
  words = [a for a in argv[1:] if not a.startswith("-")]
  if words and words[0] == "help":
    words = words[1:]
  if not words:
    return usage(fv), 0
  if words[0] not in COMMANDS:
    return (f"error: unknown command {words[0]!r}; the commands are "
            f"{', '.join(COMMANDS)} (`lngram-exp --help`)."), 2
  return command_usage(fv, words[0]), 0


def _command(argv: list[str], fv: flags.FlagValues) -> int:
  if argv[1] in COMMANDS and argv[1] not in ("train", "plan") and mentions_config(argv):
    refuse_flags(["config"], argv[1], FLAGS_OF[argv[1]], FLAGS_OF)   # before it is read
  rest = parse_command_line(fv, argv)
  if len(rest) != 2 or rest[1] not in COMMANDS:
    raise UsageError(f"lngram-exp <{'|'.join(COMMANDS)}> [flags]; got {rest[1:]}")
  command, f = rest[1], fv   # analyze's flags depend on the run's kind: checked there
  by_kind = set().union(*ANALYZE_FLAGS_OF.values()) if command == "analyze" else set()
  refuse_flags(given_flags(f), command, FLAGS_OF[command] | by_kind, FLAGS_OF)
  refuse_non_finite(f)
  missing = [name for name in REQUIRED_OF.get(command, ()) if not f[name].value]
  if missing:
    what = "<file.py[:arg]>" if missing == ["config"] else ""
    raise UsageError(f"lngram-exp {command} needs --{' --'.join(missing)}"
                     f"{'=' + what if what else ''}.")
  return MODULE_OF[command].run(command, f, argv)


def run_main(argv: list[str] | None = None) -> int:
  """The command line's exit status: 0, 2 (a usage or project error) or 130 (interrupted)."""
  from experiments.trainer.errors import CheckpointError
  argv = list(sys.argv if argv is None else argv)
  fv = define_flags(argv)
  if len(argv) == 1:
    print(usage(None))
    return 2
  if argv[1] == "help" or {"--help", "-h", "-help"} & set(argv[1:]):
    text, status = _help(argv, fv)
    print(text, file=sys.stderr if status else sys.stdout)
    return status
  debug = any(a in ("--debug", "--debug=true", "--debug=1") for a in argv)
  from experiments.plan.gpu import quiet_cuda_startup
  quiet_cuda_startup()    # jax's CUDA plugin (the [gpu-compile] extra) without a GPU driver
  from experiments.plan.tpu import quiet_backend_probe
  quiet_backend_probe()   # libtpu (the [tpu] extra) on a machine without TPU chips
  try:
    from experiments.cli.logs import command_logging
    with command_logging():
      return _command(argv, fv)
  except UsageError as e:
    if debug:
      raise
    print(f"usage: {_one_line(e)} (`lngram-exp --help` lists the commands)", file=sys.stderr)
  # OSError: a missing file, a read-only directory; FloatingPointError: the loop's NaN check.
  except (CheckpointError, ValueError, OSError, FloatingPointError) as e:
    if debug:
      raise
    print(f"error: {_one_line(e)}", file=sys.stderr)
  return 2


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split()) or type(error).__name__


def main(argv: list[str] | None = None):
  """`lngram-exp` (the console script) and `python -m experiments`."""
  # A multi-process train runs as a child of a parent that reports a lost coordinator in
  # one line (the runtime aborts the survivors: experiments/cli/supervise.py).
  from experiments.cli import supervise
  command_line = list(sys.argv if argv is None else argv)
  if supervise.needed(command_line):
    sys.exit(supervise.run_supervised(command_line))
  # Ctrl-C anywhere: orbax's threads stopped, "interrupted", 130 (training itself saves
  # first); the late asyncio noise of an abandoned read kept off the terminal.
  from experiments.cli.shutdown import cli_noise_filter, run_interruptible
  try:
    with cli_noise_filter():
      status = run_interruptible(run_main, argv)
    sys.stdout.flush()
  except BrokenPipeError:   # `lngram-exp --help | head`: the reader left; no traceback
    import os
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 1
  sys.exit(status)


if __name__ == "__main__":
  main()
