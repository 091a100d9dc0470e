"""`lngram-exp`: train, evaluate, sample and analyse the experiments; list their configs.

    lngram-exp train   --config=experiments/configs/lm_lngram.py[:arg] --workdir=runs/x
                       [--config.train.steps=100 --config.data.path=texts/] [--max_memory=8GiB]
    lngram-exp eval    --workdir=runs/x [--step=N] [--mesh=data=2,table=4]   (LM runs)
    lngram-exp sample  --workdir=runs/x --prompt='def ' [--max_new_tokens=200 --top_k=20]
    lngram-exp configs | prepare-data | train-tokenizer | import-hf  (experiments/*_commands.py)
    lngram-exp plan    --config=experiments/configs/hf_lngram.py:keye2b --mesh=fsdp=64
                       [--accelerator=h100 --mfu=0.4]   (memory, FLOPs, collectives, step time)
    lngram-exp analyze --workdir=runs/x [--step=N] [--which=...]   (LM runs: the ID analyses;
                       VLM runs: attention decay, accuracy by length, LogitLens, grounding)

Several devices: `--config.mesh.data=-1` (train), `--mesh=...` (eval, sample); several hosts:
`--coordinator=host0:1234 --num_processes=N --process_id=i` (train; or JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID). Each command takes only its own flags; every mistake is
one line `error: ...` and exit status 2 (`--debug`: the traceback). Also `python -m
experiments`. The logic lives in libraries (experiments.commands and below); this file
defines the flags (absl, ml_collections config_flags) and calls them.
"""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

from experiments import data_commands, hf_commands
from experiments.overrides import (
    UsageError,
    given_flags,
    mentions_config,
    parse_command_line,
    refuse_flags,
)

# One line each for `lngram-exp --help`.
COMMANDS = {
    "train": "train (or resume) a run from a config file into --workdir",
    "eval": "validation bits per byte of an LM run's checkpoint",
    "sample": "continue prompts with an LM run's checkpoint",
    "configs": "list the config files with their purpose",
    "plan": "per-device memory, FLOPs, collective bytes and step time of a config on a "
            "mesh, compiled from shapes before any run",
    "analyze": "Lngram ID analyses of an LM run; attention, accuracy, LogitLens and "
               "grounding analyses of a VLM run",
}
COMMANDS |= data_commands.COMMANDS | hf_commands.COMMANDS   # prepare-data, ..., import-hf
# The flags each command takes (and --debug); analyze's depend on the run's kind.
FLAGS_OF = {
    "train": {"config", "workdir", "max_memory", "coordinator", "num_processes", "process_id"},
    "eval": {"workdir", "step", "mesh"},
    "sample": {"workdir", "step", "mesh", "prompt", "max_new_tokens", "temperature", "top_k",
               "greedy", "seed", "cache"},
    "analyze": {"workdir", "which", "step"},
    "configs": set(),
    "plan": {"config", "mesh", "accelerator", "mfu", "target", "dump_hlo"},
}
FLAGS_OF |= data_commands.FLAGS_OF | hf_commands.FLAGS_OF
# The flags a command cannot run without (its usage line names them).
REQUIRED_OF = {"train": ("config", "workdir"), "eval": ("workdir",), "sample": ("workdir",),
               "analyze": ("workdir",), "plan": ("config",),
               "prepare-data": ("input", "tokenizer", "out"), "train-tokenizer": ("out",),
               "import-hf": ("hf_dir", "workdir"), "export-hf": ("workdir", "out")}
ANALYZE_FLAGS_OF = {"lm": {"max_positions", "seed", "n_perm", "stability_steps", "dedup",
                           "max_file_share", "perm_strata", "n_rho_boot"},
                    "vlm": {"n", "max_new_tokens"}}


def define_flags(argv: list[str]) -> flags.FlagValues:
  """The flags, on a FlagValues of their own; config_flags reads overrides from `argv`."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "train, plan: config file <file.py[:arg]>; "
                                  "set its fields with --config.<field>=<value>.",
                                  flag_values=fv, sys_argv=argv)
  for kind, name, default, bound, text in [
      ("string", "workdir", None, None, "Run directory (checkpoints, metrics)."),
      ("integer", "step", None, None, "eval/sample/analyze: checkpoint step (default newest)."),
      ("multi_string", "prompt", ["def "], None, "sample: prompt(s), repeatable."),
      ("integer", "max_new_tokens", None, 1, "sample: bytes to generate (default 200, capped "
       "to max_len); analyze (VLM runs): answer length cap."),
      ("float", "temperature", 0.8, None, "sample: softmax temperature."),
      ("integer", "top_k", None, 1, "sample: keep the k most likely bytes."),
      ("bool", "greedy", False, None, "sample: argmax decoding."),
      ("integer", "seed", 0, None, "sample: PRNG seed; analyze (LM runs): every sample's seed."),
      ("bool", "cache", True, None, "sample: KV cache + Lngram decode state."),
      ("integer", "n", 32, 1, "analyze (VLM runs): validation scenes."),
      ("list", "which", None, None, "analyze: which analyses (default all), e.g. "
       "utilisation,id_knn,stability (LM runs) or attention,accuracy,grounding (VLM runs)."),
      ("integer", "max_positions", 4000, 1, "analyze (LM runs): byte positions per split."),
      ("list", "stability_steps", None, None, "analyze (LM runs): kept checkpoints to compare, "
       "e.g. 100,300."),
      ("integer", "n_perm", 500, 0, "analyze (LM runs): ID-KNN permutations."),
      ("bool", "dedup", True, None, "analyze (LM runs): remove near-duplicate files from both "
       "splits (experiments/analysis/dedup.py)."),
      ("float", "max_file_share", 0.05, None, "analyze (LM runs): most of a split's positions "
       "one file may give."),
      ("string", "perm_strata", "nuisance_byte", None, "analyze (LM runs): the permutation "
       "test's cells, nuisance or nuisance_byte (stratum x current byte)."),
      ("integer", "n_rho_boot", 500, 0, "analyze (LM runs): bootstrap resamples of the rho CIs."),
      ("string", "max_memory", None, None, "train: refuse a config whose parameters + "
       "optimizer state exceed this, e.g. 8GiB (default: the machine's memory)."),
      ("string", "coordinator", None, None, "train on several hosts: coordinator host:port."),
      ("integer", "num_processes", None, 1, "train on several hosts: the process count."),
      ("integer", "process_id", None, 0, "train on several hosts: this process's index."),
      ("string", "mesh", None, None, "eval/sample/plan: a device mesh, e.g. data=2,table=4."),
      ("string", "accelerator", "h100", None, "plan: h100, h200, h800, tpu_v4, tpu_v5e, "
       "tpu_v5p or tpu_v6e (the step time's peak FLOP/s and links); --target sets it."),
      ("string", "target", None, None, "plan: compile with the TPU compiler for this "
       "topology, e.g. v5e:2x2, v6e:2x4, v5p:2x2x1, v5p:2x2x2 (needs pip install -e "
       "'.[tpu]'; the mesh must have its device count)."),
      ("string", "dump_hlo", None, None, "plan: write the compiled program's text to this "
       "file."),
      ("float", "mfu", 0.4, None, "plan: the share of peak FLOP/s the step time assumes."),
      ("bool", "debug", False, None, "Show the full traceback of an error."),
      *data_commands.FLAGS, *hf_commands.FLAGS]:
    bounds = {} if bound is None else {"lower_bound": bound}
    getattr(flags, f"DEFINE_{kind}")(name, default, text, flag_values=fv, **bounds)
  return fv


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
    lines.append(f"  --{name}: {flag.help}{default}")
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
  from experiments import commands, preflight
  if argv[1] in COMMANDS and argv[1] not in ("train", "plan") and mentions_config(argv):
    refuse_flags(["config"], argv[1], FLAGS_OF[argv[1]], FLAGS_OF)   # before it is read
  rest = parse_command_line(fv, argv)
  if len(rest) != 2 or rest[1] not in COMMANDS:
    raise UsageError(f"lngram-exp <{'|'.join(COMMANDS)}> [flags]; got {rest[1:]}")
  command, f = rest[1], fv   # analyze's flags depend on the run's kind: checked below
  by_kind = set().union(*ANALYZE_FLAGS_OF.values()) if command == "analyze" else set()
  refuse_flags(given_flags(f), command, FLAGS_OF[command] | by_kind, FLAGS_OF)
  refuse_non_finite(f)
  if command == "configs":
    return commands.configs_command()
  for extra in (data_commands, hf_commands):
    if command in extra.COMMANDS:
      return extra.run(command, f)
  if command == "plan":
    if f.config is None:
      raise UsageError("lngram-exp plan needs --config=<file.py[:arg]>.")
    return commands.plan_command(f.config, f.mesh, accelerator=f.accelerator, mfu=f.mfu,
                                 target=f.target, dump_hlo=f.dump_hlo,
                                 accelerator_given=f["accelerator"].present, argv=argv)
  if not f.workdir:
    raise UsageError(f"lngram-exp {command} needs --workdir.")
  if command == "train":
    if f.config is None:
      raise UsageError("lngram-exp train needs --config=<file.py[:arg]>.")
    return commands.train_command(f.config, f.workdir, max_memory=f.max_memory,
                                  coordinator=f.coordinator, num_processes=f.num_processes,
                                  process_id=f.process_id)
  if command == "eval":
    return commands.eval_command(f.workdir, step=f.step, mesh=f.mesh)
  if command == "sample":
    ignored = [name for name in ("temperature", "top_k", "seed") if f[name].present]
    if f.greedy and ignored:
      raise ValueError(f"sample --greedy does not take --{ignored[0]} (argmax decoding "
                       "draws nothing).")
    return commands.sample_command(f.workdir, f.prompt, step=f.step, mesh=f.mesh,
                                   max_new_tokens=f.max_new_tokens, seed=f.seed,
                                   temperature=f.temperature, top_k=f.top_k,
                                   greedy=f.greedy, use_cache=f.cache)
  from experiments.analysis.run import run_kind
  preflight.check_workdir(f.workdir, train=False)
  kind = run_kind(f.workdir)   # which analyses, and so which flags, apply
  refuse_flags(given_flags(f), f"analyze of an {kind.upper()} run",
               FLAGS_OF["analyze"] | ANALYZE_FLAGS_OF[kind],
               {f"analyze of {k.upper()} runs": v for k, v in ANALYZE_FLAGS_OF.items()})
  if kind == "vlm":
    return commands.analyze_command(f.workdir, kind, which=f.which, step=f.step, n=f.n,
                                    max_new_tokens=f.max_new_tokens)
  return commands.analyze_command(f.workdir, kind, which=f.which, step=f.step, seed=f.seed,
                                  max_positions=f.max_positions, n_perm=f.n_perm,
                                  stability_steps=f.stability_steps, dedup=f.dedup,
                                  max_file_share=f.max_file_share, perm_strata=f.perm_strata,
                                  n_rho_boot=f.n_rho_boot)


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
  from experiments.plan.tpu import quiet_backend_probe
  quiet_backend_probe()   # libtpu (the [tpu] extra) on a machine without TPU chips
  try:
    from experiments.commands import command_logging
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
