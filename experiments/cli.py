"""`lngram-exp`: train, evaluate, sample and analyse the experiments; list their configs.

    lngram-exp train   --config=experiments/configs/lm_lngram.py[:arg] --workdir=runs/x
                       [--config.train.steps=100 --config.data.path=my/texts ...]
                       [--max_memory=8GiB]
    lngram-exp eval    --workdir=runs/x [--step=N] [--mesh=data=2,table=4]   (LM runs)
    lngram-exp sample  --workdir=runs/x --prompt='def ' [--max_new_tokens=200 --top_k=20]
                       [--mesh=table=8]

On several devices: `--config.mesh.data=-1` (train; axes data, fsdp, seq, table;
experiments/train/mesh.py), `--mesh=...` (eval, sample); on several hosts add
`--coordinator=host0:1234 --num_processes=N --process_id=i` to `train` (or set
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
    lngram-exp configs
    lngram-exp analyze --workdir=runs/vlm_x [--n=32 --which=attention,accuracy,logit_lens,
                       grounding --max_new_tokens=N]  (VLM runs: attention decay, accuracy by
                       length, LogitLens, grounding probe; JSON + PNG into the run directory)
    lngram-exp analyze --workdir=runs/lm_lngram [--which=utilisation,id_knn,associations,
                       distributed,stability,injection --max_positions=4000 --seed=0]
                       (LM runs: the Lngram ID analyses; JSON + PNG + Markdown into
                       <workdir>/analysis)

A config with a `vlm` block (experiments/configs/vlm_*.py) trains a VLM stage;
every run, LM or VLM, goes through the same loop (experiments.train.train),
checkpoints and resumes the same way: rerun the same command after a kill.

Errors of the project (config, data, checkpoint, input checks) end in one
line `error: ...` on stderr and exit status 2; `--debug` shows the traceback.

Also `python -m experiments ...`. The logic lives in importable libraries
(experiments.train, experiments.checkpoint, experiments.vlm.run); this file
only parses flags.
"""

from __future__ import annotations

import ast
import difflib
import logging
import sys

from absl import flags

# One line each for `lngram-exp --help`.
COMMANDS = {
    "train": "train (or resume) a run from a config file into --workdir",
    "eval": "validation bits per byte of an LM run's checkpoint",
    "sample": "continue prompts with an LM run's checkpoint",
    "configs": "list the config files with their purpose",
    "analyze": "Lngram ID analyses of an LM run; attention, accuracy, LogitLens and "
               "grounding analyses of a VLM run",
}

# Config fields a config file need not define: the loop reads them with
# `config.train.get(name, default)`.
EXTRA_FIELDS = {"train.allow_config_change": False, "train.profile_steps": (),
                "train.grad_accum": 1, "optim.state_dtype": ""}

# `--config` and `--config.<field>=<value>` are parsed here, not by absl's
# config_flags, so that a typo'd field is one line naming the closest field.
_CONFIG_HELP = ("--config=<file.py[:arg]>: experiment config file; override fields with "
                "--config.<field>=<value>.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")
_STEP = flags.DEFINE_integer("step", None, "eval/sample: checkpoint step (default newest).")
_PROMPT = flags.DEFINE_multi_string("prompt", ["def "], "sample: prompt(s), repeatable.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "sample: bytes to generate (default "
                                 "200, capped to what the model can hold); analyze (VLM "
                                 "runs): answer length cap (default the run's "
                                 "vlm.eval.max_new_tokens).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "sample: softmax temperature.")
_TOP_K = flags.DEFINE_integer("top_k", None, "sample: keep the k most likely bytes.")
_GREEDY = flags.DEFINE_bool("greedy", False, "sample: argmax decoding.")
_SEED = flags.DEFINE_integer("seed", 0, "sample: PRNG seed; analyze (LM runs): the seed of "
                             "every sample (files, positions, permutations, bootstrap).")
_CACHE = flags.DEFINE_bool("cache", True, "sample: KV cache + Lngram decode state.")
_N_ANALYZE = flags.DEFINE_integer("n", 32, "analyze (VLM runs): validation scenes to analyse.")
_VLM_ANALYSES = ["attention", "accuracy", "logit_lens", "grounding"]
_WHICH = flags.DEFINE_list("which", None, "analyze: which analyses (default all; VLM runs: "
                           f"{','.join(_VLM_ANALYSES)}; LM runs: utilisation,id_knn,"
                           "associations,distributed,stability,injection).")
_MAX_POSITIONS = flags.DEFINE_integer("max_positions", 4000, "analyze (LM runs): sampled "
                                      "byte positions per split (reference, held-out).")
_STABILITY_STEPS = flags.DEFINE_list(
    "stability_steps", None, "analyze (LM runs): the kept checkpoints the stability analysis "
    "compares, e.g. 100,300 (default: every kept one, adjacent pairs).")
_N_PERM = flags.DEFINE_integer("n_perm", 500, "analyze (LM runs): permutations of the "
                               "ID-KNN test.")
_MAX_MEMORY = flags.DEFINE_string("max_memory", None, "train: refuse a config whose "
                                  "parameters + optimizer state exceed this, e.g. 8GiB "
                                  "(default: the machine's memory).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator", None, "train on several hosts: the jax.distributed coordinator host:port "
    "(else JAX_COORDINATOR_ADDRESS, or the cluster's own discovery: SLURM, Open MPI, TPU pods).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "train on several hosts: "
                                      "the number of processes (else JAX_NUM_PROCESSES).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "train on several hosts: this "
                                   "process's index (else JAX_PROCESS_ID).")
_MESH = flags.DEFINE_string("mesh", None, "eval/sample: run on a device mesh, e.g. "
                            "data=2,table=4 (axes data, fsdp, seq, table; -1 = the rest). "
                            "train: set --config.mesh.<axis> instead.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the full traceback of an error.")

DEFAULT_MAX_NEW_TOKENS = 200


class UsageError(Exception):
  """Wrong command line: printed as `usage: ...`, exit status 2."""


def usage() -> str:
  width = max(len(c) for c in COMMANDS)
  lines = ["usage: lngram-exp <command> [flags]", "", "commands:"]
  lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
  lines += ["", "`lngram-exp --help` also lists the flags; " + _CONFIG_HELP]
  return "\n".join(lines)


# --- `--config` and its overrides ------------------------------------------------------


def split_config_args(args: list[str]) -> tuple[str | None, list[tuple[str, str]], list[str]]:
  """(config spec, [(field, value text)], the other args) of a command line.

  Accepts `--config=x`, `--config x`, `--config.a.b=v` and `--config.a.b v`.
  """
  spec, overrides, rest = None, [], []
  i = 0
  while i < len(args):
    arg = args[i]
    if arg == "--":
      rest += args[i:]
      break
    if arg == "--config" or arg.startswith(("--config=", "--config.")):
      name, eq, value = arg[2:].partition("=")
      if not eq:
        if i + 1 >= len(args):
          raise UsageError(f"{arg} needs a value.")
        value, i = args[i + 1], i + 1
      if name == "config":
        spec = value
      else:
        field = name[len("config."):]
        if not field:
          raise UsageError(f"{arg}: name a config field, e.g. --config.train.steps=100.")
        overrides.append((field, value))
    else:
      rest.append(arg)
    i += 1
  return spec, overrides, rest


def field_names(config, prefix: str = "") -> list[str]:
  """Dotted names of every leaf field of a ConfigDict."""
  names = []
  for key, value in config.items():
    name = f"{prefix}{key}"
    if hasattr(value, "items"):
      names += field_names(value, name + ".")
    else:
      names.append(name)
  return names


def _parse_bool(field, text):
  low = text.strip().lower()
  if low in ("true", "1", "yes", "on"):
    return True
  if low in ("false", "0", "no", "off"):
    return False
  raise ValueError(f"{field}={text!r} is not a bool (true/false).")


def parse_value(field: str, old, text: str):
  """`text` as the type of the field's current value `old`."""
  if isinstance(old, bool):
    return _parse_bool(field, text)
  if isinstance(old, int):
    try:
      return int(text)
    except ValueError:
      raise ValueError(f"{field}={text!r} is not an int.") from None
  if isinstance(old, float):
    try:
      return float(text)
    except ValueError:
      raise ValueError(f"{field}={text!r} is not a number.") from None
  if isinstance(old, str):
    return text
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if old is None:
      return text
    raise ValueError(f"{field}={text!r} is not a Python literal like {old!r}.") from None
  if isinstance(old, (tuple, list)):
    if isinstance(value, (int, float, str)):
      value = (value,)
    if not isinstance(value, (tuple, list)):
      raise ValueError(f"{field}={text!r} is not a tuple like {tuple(old)!r}.")
    return tuple(value)
  return value


def apply_overrides(config, overrides: list[tuple[str, str]]):
  """Sets `--config.<field>=<value>` overrides on `config` (in place), checked by name."""
  names = field_names(config)
  for field, text in overrides:
    parts = field.split(".")
    node = config
    for part in parts[:-1]:
      node = node.get(part) if hasattr(node, "get") else None
      if node is None or not hasattr(node, "items"):
        break
    leaf = parts[-1]
    if node is None or not hasattr(node, "items") or leaf not in node:
      if field in EXTRA_FIELDS and node is not None and hasattr(node, "items"):
        with config.unlocked():
          node[leaf] = parse_value(field, EXTRA_FIELDS[field], text)
        continue
      close = difflib.get_close_matches(field, names + list(EXTRA_FIELDS), n=1, cutoff=0.6)
      hint = f" (did you mean {close[0]}?)" if close else ""
      raise ValueError(f"unknown field {field}{hint}")
    old = node[leaf]
    if hasattr(old, "items"):
      raise ValueError(f"{field} is a block of fields; set them one by one, e.g. "
                       f"--config.{field}.{next(iter(old.keys()), 'x')}=...")
    node[leaf] = parse_value(field, old, text)
  return config


def load_with_overrides(spec: str, overrides: list[tuple[str, str]]):
  """The ConfigDict of `path.py[:arg]` with the overrides applied, then locked."""
  from experiments.configs import load_config
  config = load_config(spec)
  apply_overrides(config, overrides)
  config.lock()
  return config


# --- commands ----------------------------------------------------------------------------


def _run(argv, config):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise UsageError(f"lngram-exp <{'|'.join(COMMANDS)}> [flags]; got {argv[1:]}")
  command = argv[1]
  _setup_logging()
  if command == "configs":
    from experiments.configs import config_files, purpose
    for path in config_files():
      print(f"{path.name:<18} {purpose(path)}")
    return 0
  if not _WORKDIR.value:
    raise UsageError(f"lngram-exp {command} needs --workdir.")
  if command == "train":
    return _train(config)
  return _inspect(command)


def _inspect(command):
  if command == "analyze":
    from experiments.analysis.run import LM_ANALYSES, analyze_lm, run_kind
    if run_kind(_WORKDIR.value) == "lm":
      if _MAX_POSITIONS.value < 1 or _N_PERM.value < 0:
        raise ValueError(f"--max_positions={_MAX_POSITIONS.value} must be >= 1 and "
                         f"--n_perm={_N_PERM.value} >= 0.")
      out = analyze_lm(_WORKDIR.value, which=tuple(_WHICH.value or LM_ANALYSES),
                       max_positions=_MAX_POSITIONS.value, seed=_SEED.value,
                       n_perm=_N_PERM.value, stability_steps=_stability_steps())
      print(f"wrote {sorted(out)} (.json, .md, .png) into {_WORKDIR.value}/analysis")
      return 0
    from experiments.vlm.run import analyze
    out = analyze(_WORKDIR.value, which=tuple(_WHICH.value or _VLM_ANALYSES),
                  n=_N_ANALYZE.value, max_new_tokens=_MAX_NEW.value)
    print(f"wrote {sorted(out)} (.json, .png) into {_WORKDIR.value}")
    return 0
  if command == "eval":
    from experiments.train.evaluate import evaluate_checkpoint
    mesh = _mesh_flag()
    metrics, step = evaluate_checkpoint(_WORKDIR.value, step=_STEP.value, mesh=mesh)
    print(f"checkpoint step {step} of {_WORKDIR.value}", file=sys.stderr)
    for key, value in sorted(metrics.items()):
      print(f"{key:<32} {value:.4f}")
    return 0
  from experiments.checkpoint.restore import restore_module
  from experiments.train.evaluate import cap_new_tokens, require_lm, sample_text
  prompts = list(_PROMPT.value)
  if any(not p for p in prompts):
    raise ValueError("--prompt must be a non-empty string.")
  if _MAX_NEW.value is not None and _MAX_NEW.value < 1:
    raise ValueError(f"--max_new_tokens={_MAX_NEW.value} must be >= 1.")
  mesh = _mesh_flag()
  model, saved, step = restore_module(_WORKDIR.value, _STEP.value)
  require_lm(saved, _WORKDIR.value, "sample")
  if mesh:
    from experiments.train import mesh as mesh_lib
    mesh_lib.place_model(model, mesh_lib.make_train_mesh(mesh))
  print(f"checkpoint step {step} of {_WORKDIR.value}", file=sys.stderr)
  asked = DEFAULT_MAX_NEW_TOKENS if _MAX_NEW.value is None else _MAX_NEW.value
  max_new, note = cap_new_tokens(model.config.max_len, prompts, asked)
  if note:
    print(f"note: {note}", file=sys.stderr)
  texts = sample_text(model, prompts, max_new_tokens=max_new, seed=_SEED.value,
                      temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                      greedy=_GREEDY.value, use_cache=_CACHE.value)
  for prompt, text in zip(prompts, texts, strict=True):
    print(f"--- {prompt!r}\n{prompt}{text}")
  return 0


def _stability_steps() -> tuple[int, ...] | None:
  if not _STABILITY_STEPS.value:
    return None
  try:
    return tuple(int(s) for s in _STABILITY_STEPS.value)
  except ValueError:
    raise ValueError(f"--stability_steps={','.join(_STABILITY_STEPS.value)}: give checkpoint "
                     "steps as integers, e.g. 100,300.") from None


def _mesh_flag() -> dict | None:
  if _MESH.value is None:
    return None
  from experiments.train.mesh import make_train_mesh, parse_mesh
  block = parse_mesh(_MESH.value)
  make_train_mesh(block)   # a bad block fails here, before a checkpoint is read
  return block


def _train(config):
  if config is None:
    raise UsageError("lngram-exp train needs --config=<file.py[:arg]>.")
  _start_distributed()
  from experiments.train import train
  from experiments.train.task import check_experiment_config, check_memory, parse_bytes
  check_experiment_config(config)
  if _MAX_MEMORY.value:   # the machine's memory is checked by make_task
    check_memory(config, limit=parse_bytes(_MAX_MEMORY.value, "--max_memory"))
  result = train(config, _WORKDIR.value)
  if result["interrupted"]:
    print(f"interrupted after step {result['step']}; checkpoint saved in "
          f"{result['workdir']}. Run the same command again to resume.")
    return 130
  print(f"done: {result['step']} steps, run directory {result['workdir']}")
  if "vlm" in config:
    final = result["final"]
    print(f"VLM {final['stage']}: validation {final['eval']['overall']}")
    return 0
  bpb = result["eval"].get("eval/bits_per_byte")
  print(f"validation bits per byte: {bpb:.4f}")
  return 0


def _start_distributed():
  """`jax.distributed` start-up when this run spans several processes (the flags or
  JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID say so); before any
  device is touched."""
  import os
  flags_given = (_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if all(v is None for v in flags_given) and not os.environ.get("JAX_COORDINATOR_ADDRESS"):
    return
  from lngram_jax.sharding.multihost import initialize
  initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)


def _setup_logging():
  # Our progress lines at INFO; orbax/absl chatter only from WARNING up.
  logging.getLogger("absl").setLevel(logging.WARNING)
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  ours = logging.getLogger("experiments")
  ours.setLevel(logging.INFO)
  if not ours.handlers:
    handler = logging.StreamHandler(sys.stderr)
    fmt = "%(asctime)s %(message)s"
    if sys.stderr.isatty():
      # Erase the progress bar being redrawn in place; it reappears on the next step.
      fmt = "\r\x1b[K" + fmt
    handler.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    ours.addHandler(handler)
    ours.propagate = False
  # Warnings (e.g. a checkpoint fallback) as one line each, without the source line
  # Python prints under them by default.
  import warnings
  warnings.formatwarning = lambda message, category, *args, **kwargs: f"warning: {message}\n"


def _project_errors():
  from lngram_jax.checkpoint import CheckpointError
  # FileNotFoundError, NotADirectoryError, PermissionError are OSErrors;
  # FloatingPointError is the loop's NaN/Inf check.
  return (CheckpointError, ValueError, OSError, FloatingPointError)


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split()) or type(error).__name__


def main(argv: list[str] | None = None):
  """The command line: exits 0, 2 (a usage or project error) or 130 (interrupted)."""
  import os
  try:
    status = run_main(argv)
    sys.stdout.flush()
  except BrokenPipeError:   # `lngram-exp --help | head`: the reader left; no traceback
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 1
  if _abandoned_save_threads:
    # orbax's threads of the failed save wait minutes for a step directory that
    # will never exist, and Python would join them at exit. Nothing of ours is
    # pending: the loop closed its checkpointer and released the workdir lock.
    sys.stderr.flush()
    os._exit(status)
  sys.exit(status)


_abandoned_save_threads = False


def run_main(argv: list[str] | None = None) -> int:
  """The command line's exit status."""
  argv = list(sys.argv if argv is None else argv)
  debug = any(a in ("--debug", "--debug=true", "--debug=1") for a in argv)
  if len(argv) == 1 or argv[1] == "help" or any(a in ("--help", "-h", "-help")
                                                   for a in argv[1:]):
    print(usage())
    if len(argv) > 1:
      print("\nflags:\n" + flags.FLAGS.module_help(__name__))
    return 0 if len(argv) > 1 else 2
  try:
    spec, overrides, rest = split_config_args(argv[1:])
    try:
      rest = flags.FLAGS([argv[0], *rest])
    except flags.Error as e:   # an unknown flag, a flag value of the wrong type
      raise ValueError(str(e)) from e
    if overrides and spec is None:
      raise UsageError("--config.<field> overrides need --config=<file.py[:arg]>.")
    config = load_with_overrides(spec, overrides) if spec is not None else None
    return _run(rest, config)
  except UsageError as e:
    if debug:
      raise
    print(f"usage: {_one_line(e)} (`lngram-exp --help` lists the commands)", file=sys.stderr)
    return 2
  except _project_errors() as e:
    if debug:
      raise
    print(f"error: {_one_line(e)}", file=sys.stderr)
    from lngram_jax.checkpoint import CheckpointSaveError
    global _abandoned_save_threads
    _abandoned_save_threads = isinstance(e, CheckpointSaveError)
    return 2


if __name__ == "__main__":
  main()
