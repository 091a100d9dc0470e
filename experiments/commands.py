"""The bodies of the `lngram-exp` commands, as functions of plain arguments.

Each checks its arguments first (in seconds, before a restore or a compile),
calls the library, prints what the command prints (results on stdout, the
checkpoint step and notes on stderr) and returns the exit status. A mistake
raises a one-line ValueError (or OSError, CheckpointError) that
`experiments.cli` prints as `error: ...`.

    train_command(config, workdir)      train or resume; 0, or 130 when interrupted
    eval_command(workdir, step=, mesh=) the validation metrics of a checkpoint
    sample_command(workdir, prompts)    continuations of the prompts
    analyze_command(workdir, ...)       the analyses of an LM or a VLM run
    configs_command()                   the config files and their purpose
    plan_command(config, mesh)          a run's per-device cost on a mesh (experiments/plan)
    command_logging()                   the logging a command runs under (a `with` block)
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

from experiments import preflight

VLM_ANALYSES = ("attention", "accuracy", "logit_lens", "grounding")


@contextlib.contextmanager
def command_logging():
  """While a command runs: our progress lines at INFO on stderr, a warning as one line,
  orbax/absl chatter only from WARNING up; all put back after (a test or a notebook may
  run a command in its own process)."""
  from absl import logging as absl_logging
  ours = logging.getLogger("experiments")
  saved = (ours.level, ours.propagate, absl_logging.get_verbosity(), warnings.formatwarning)
  handler = logging.StreamHandler(sys.stderr)
  # On a terminal, erase the progress bar being redrawn; it reappears on the next step.
  prefix = "\r\x1b[K" if sys.stderr.isatty() else ""
  handler.setFormatter(logging.Formatter(prefix + "%(asctime)s %(message)s", "%H:%M:%S"))
  absl_logging.set_verbosity(absl_logging.WARNING)
  ours.setLevel(logging.INFO)
  ours.addHandler(handler)
  ours.propagate = False
  warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"
  try:
    yield
  finally:
    ours.removeHandler(handler)
    ours.setLevel(saved[0])
    ours.propagate = saved[1]
    absl_logging.set_verbosity(saved[2])
    warnings.formatwarning = saved[3]


def train_command(config, workdir, *, max_memory: str | None = None,
                  coordinator: str | None = None, num_processes: int | None = None,
                  process_id: int | None = None) -> int:
  """Trains (or resumes) `config` in `workdir`; a refused run leaves nothing behind."""
  preflight.check_workdir(workdir, train=True)
  from experiments.trainer.multihost import start_distributed
  # Before jax touches a device (the memory estimate may): jax.distributed requires it.
  start_distributed(coordinator, num_processes, process_id)
  preflight.check_train_config(config, max_memory=max_memory)
  from experiments.tasks import run_train
  with preflight.leave_no_trace(workdir):
    result = run_train(config, workdir)
  if result["interrupted"]:
    print(f"interrupted after step {result['step']}; checkpoint saved in "
          f"{result['workdir']}. Run the same command again to resume.")
    return 130
  print(f"done: {result['step']} steps, run directory {result['workdir']}")
  if "qwen3vl" in config:   # Stage I / II on Qwen3-VL: the last logged loss or reward
    final = result["final"]
    key = "reward" if final["stage"] == "grpo" else "loss"
    print(f"Qwen3-VL {final['stage']}: last train/{key} {final[key][-1]}")
  elif "vlm" in config:
    print(f"VLM {result['final']['stage']}: validation {result['final']['eval']['overall']}")
  else:
    unit = "token" if config.data.get("kind") == "tokens" else "byte"   # token data: per token
    print(f"validation bits per {unit}: {result['eval'].get('eval/bits_per_byte'):.4f}")
  return 0


def mesh_block(text: str | None) -> dict | None:
  """`data=2,table=4` -> the mesh block, checked against this machine's devices."""
  if text is None:
    return None
  from experiments.trainer.placement import make_train_mesh, parse_mesh
  block = parse_mesh(text)
  make_train_mesh(block)   # a bad block fails here, before a checkpoint is read
  return block


def eval_command(workdir, *, step: int | None = None, mesh: str | None = None) -> int:
  """Prints the validation metrics of an LM run's checkpoint (the newest, or `step`)."""
  from experiments.tasks.evaluate import evaluate_checkpoint
  preflight.check_workdir(workdir, train=False)
  metrics, step = evaluate_checkpoint(workdir, step=step, mesh=mesh_block(mesh))
  print(f"checkpoint step {step} of {workdir}", file=sys.stderr)
  for key, value in sorted(metrics.items()):
    print(f"{key:<32} {value:.4f}")
  return 0


def sample_command(workdir, prompts: list[str], *, step: int | None = None,
                   mesh: str | None = None, max_new_tokens: int | None = None,
                   **sampling) -> int:
  """Prints the continuation of each prompt (`sampling`: seed, temperature, top_k,
  greedy, use_cache of `experiments.sampling.sample_checkpoint`)."""
  from experiments.sampling import sample_checkpoint
  preflight.check_workdir(workdir, train=False)
  prompts = preflight.check_prompts(list(prompts))   # before the restore
  texts, step, note = sample_checkpoint(
      workdir, prompts, step=step, mesh=mesh_block(mesh),
      max_new_tokens=200 if max_new_tokens is None else max_new_tokens, **sampling)
  print(f"checkpoint step {step} of {workdir}", file=sys.stderr)
  if note:
    print(f"note: {note}", file=sys.stderr)
  for prompt, text in zip(prompts, texts, strict=True):
    print(f"--- {prompt!r}\n{prompt}{text}")
  return 0


def analyze_command(workdir, kind: str, *, which=None, step: int | None = None, n: int = 32,
                    max_new_tokens: int | None = None, stability_steps=None,
                    **lm_options) -> int:
  """Runs the analyses of a run of `kind` ("lm": `analyze_lm`, with `lm_options`
  seed, max_positions, n_perm; "vlm": `experiments.vlm.run.analyze`)."""
  preflight.check_workdir(workdir, train=False)
  if kind == "vlm":
    from experiments.vlm.run import analyze
    out = analyze(workdir, which=tuple(which or VLM_ANALYSES), step=step, n=n,
                  max_new_tokens=max_new_tokens)
    print(f"wrote {sorted(out)} (.json, .png) into {workdir}")
    return 0
  from experiments.analysis.run import LM_ANALYSES, analyze_lm
  steps = list(stability_steps or [])
  if not all(str(s).strip().isdigit() for s in steps):
    raise ValueError(f"--stability_steps={','.join(map(str, steps))}: give checkpoint steps "
                     "as integers, e.g. 100,300.")
  out = analyze_lm(workdir, which=tuple(which or LM_ANALYSES), step=step,
                   stability_steps=tuple(int(s) for s in steps) or None, **lm_options)
  print(f"wrote {sorted(out)} (.json, .md, .png) into {workdir}/analysis")
  return 0


def plan_command(config, mesh: str | None = None, *, accelerator: str = "h100",
                 mfu: float = 0.4, target: str | None = None, dump_hlo: str | None = None,
                 accelerator_given: bool = False, argv: list[str] | None = None) -> int:
  """Prints the plan of `config` on `mesh` (`data=8`; None: one device): memory, FLOPs,
  collective bytes and step time per device, from the compiled step (experiments/plan);
  `target`: a TPU topology to compile for with the TPU compiler."""
  from experiments.plan.command import plan_command as plan
  from experiments.tasks.checks import check_experiment_config
  check_experiment_config(config)
  name = next((a.split("=", 1)[1] for a in argv or () if a.startswith("--config=")), "")
  return plan(config, mesh, accelerator=accelerator, mfu=mfu, target=target,
              dump_hlo=dump_hlo, accelerator_given=accelerator_given, name=name, argv=argv)


def configs_command() -> int:
  """Prints every config file with the first line of its docstring."""
  from experiments.configs import config_files, purpose
  files = config_files()
  width = max((len(p.name) for p in files), default=0)   # the longest name, then two spaces
  for path in files:
    print(f"{path.name:<{width}}  {purpose(path)}")
  return 0
