"""`lngram-exp lm-eval`: lm-evaluation-harness tasks on an LM run's checkpoint.

    lngram-exp lm-eval --workdir=runs/x --tasks=hellaswag,arc_easy [--limit=100]
                       [--num_fewshot=5] [--batch_size=8] [--include_path=my_tasks/]
                       [--step=N] [--seed=0]

The flags are lm-eval's own (`lm-eval run --tasks ... --include_path ...`). The run
(an LM run, or a Hugging Face backbone brought in with import-hf, with or without
memory) is restored on one device and wrapped as an lm-eval model
(experiments/jobs/lm/lm_eval_adapter.py); `lm_eval.simple_evaluate` runs the tasks and
lm-eval's table is printed. The results go to `<workdir>/lm_eval/results_step<N>.json`:
one file per checkpoint step holding every task evaluated on it (a task run again
replaces its entry; `lngram.runs` records the settings of each task's run).

Task names are lm-eval's (`lm-eval ls tasks`), glob patterns of them, task YAML files,
or the tasks of YAML files under `include_path`. Needs the [eval] extra
(`pip install 'lngram-jax[eval]'`).
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

COMMANDS = {"lm-eval": "lm-evaluation-harness tasks on an LM run's checkpoint (the [eval] "
                       "extra)"}
FLAGS_OF = {"lm-eval": {"workdir", "step", "seed", "tasks", "include_path", "limit",
                        "batch_size", "num_fewshot"}}
REQUIRED_OF = {"lm-eval": ("workdir", "tasks")}
# (absl kind, name, default, lower bound, help); --workdir, --step, --seed:
# experiments/cli/flags.py. The names are lm-eval's own.
FLAGS = [
    ("list", "tasks", None, None, "lm-eval: task names, globs or YAML files, e.g. "
     "hellaswag,arc_easy."),
    ("string", "include_path", None, None, "lm-eval: a folder of task YAML files."),
    ("float", "limit", None, None, "lm-eval: examples per task (a fraction if < 1)."),
    ("integer", "batch_size", 1, 1, "lm-eval: requests per forward."),
    ("integer", "num_fewshot", None, 0, "lm-eval: few-shot examples per task."),
]
RESULTS_DIR = "lm_eval"
# The task-keyed parts of lm-eval's results, merged into a step's file.
_BY_TASK = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot",
            "higher_is_better", "n-samples")


def run(command: str, f, argv: list[str]) -> int:
  del command, argv
  limit = f.limit
  if limit is not None and limit >= 1 and float(limit).is_integer():
    limit = int(limit)   # lm-eval reads an int as a count, a float below 1 as a fraction
  return lm_eval_command(f.workdir, f.tasks, include_path=f.include_path, limit=limit,
                         batch_size=f.batch_size, step=f.step, num_fewshot=f.num_fewshot,
                         seed=f.seed)


def lm_eval_command(workdir, tasks: list[str], *, include_path: str | None = None,
                    limit: int | float | None = None, batch_size: int = 1,
                    step: int | None = None, num_fewshot: int | None = None,
                    seed: int = 0) -> int:
  """Runs lm-eval `tasks` on the run in `workdir` (its newest readable step, or `step`),
  prints lm-eval's table and writes the results JSON into the run; returns 0.

  Raises a one-line ValueError for a task lm-eval does not know, a VLM run, a bad
  setting, or lm-eval not installed.
  """
  from experiments.cli import preflight
  from experiments.jobs.lm.lm_eval_adapter import require_lm_eval
  path = preflight.check_workdir(workdir, train=False)
  task_list = _task_list(tasks)
  _check_settings(limit=limit, batch_size=batch_size, num_fewshot=num_fewshot, seed=seed)
  try:
    lm_eval = require_lm_eval()
  except ModuleNotFoundError as e:
    raise ValueError(str(e)) from None
  # Everything that can be refused is, before the checkpoint is restored: the tasks
  # (names, then each built from its data) and the folder the results go to.
  task_manager, task_names = resolve_tasks(task_list, include_path)
  task_objects = build_tasks(task_manager, task_names)
  check_results_writable(path)
  lm, step = restore_lm(workdir, step, batch_size=batch_size, seed=seed)
  print(f"checkpoint step {step} of {workdir}", file=sys.stderr)
  results = lm_eval.simple_evaluate(
      model=lm, tasks=task_objects, num_fewshot=num_fewshot, limit=limit,
      batch_size=batch_size, task_manager=task_manager, log_samples=False,
      random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
      fewshot_random_seed=seed)
  settings = {"limit": limit, "num_fewshot": num_fewshot, "batch_size": batch_size,
              "seed": seed, "include_path": None if include_path is None else str(include_path)}
  from lm_eval.utils import make_table
  print(make_table(results), flush=True)   # first: a failed write below loses no numbers
  if results.get("groups"):
    print(make_table(results, "groups"), flush=True)
  out = write_results(path, step, results, settings)
  print(f"results: {out}", file=sys.stderr)
  return 0


def _task_list(tasks) -> list[str]:
  """`tasks` as a list of names (a "a,b" string or list entries split at commas)."""
  if isinstance(tasks, str):
    tasks = [tasks]
  names = [name.strip() for entry in tasks for name in str(entry).split(",") if name.strip()]
  if not names:
    raise ValueError("lm-eval needs --tasks=TASK[,TASK] (`lm-eval ls tasks` lists lm-eval's "
                     "tasks; a YAML file or --include_path=DIR names local ones).")
  return list(dict.fromkeys(names))


def _check_settings(*, limit, batch_size, num_fewshot, seed) -> None:
  def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)

  if not is_int(batch_size) or batch_size < 1:
    raise ValueError(f"--batch_size={batch_size!r} must be an integer >= 1.")
  if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)
                            or not limit > 0 or (isinstance(limit, float) and limit > 1)):
    raise ValueError(f"--limit={limit!r} must be a number of examples >= 1 per task, or a "
                     "fraction in (0, 1].")
  if num_fewshot is not None and (not is_int(num_fewshot) or num_fewshot < 0):
    raise ValueError(f"--num_fewshot={num_fewshot!r} must be an integer >= 0.")
  if not is_int(seed):
    raise ValueError(f"--seed={seed!r} must be an integer.")


def resolve_tasks(tasks: list[str], include_path=None):
  """(lm-eval's TaskManager, the task specs to run): names and glob patterns of known
  tasks (lm-eval's and those under `include_path`), and YAML files; a one-line
  ValueError lists what was not found."""
  from lm_eval.tasks import TaskManager
  if include_path is not None and not Path(include_path).is_dir():
    raise ValueError(f"--include_path={include_path} is not a directory of task YAML files.")
  manager = TaskManager(include_path=None if include_path is None else str(include_path))
  specs, missing = [], []
  for name in tasks:
    if name.endswith((".yaml", ".yml")):
      found = sorted(glob.glob(name))
    else:
      found = manager.match_tasks([name])
    missing += [] if found else [name]
    specs += [f for f in found if f not in specs]
  if missing:
    where = "lm-eval's tasks" + ("" if include_path is None else f" and {include_path}")
    raise ValueError(f"lm-eval task{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(map(repr, missing))} not found among {where} "
                     "(`lm-eval ls tasks` lists lm-eval's; local task YAML files need "
                     "--include_path=DIR).")
  return manager, specs


def build_tasks(manager, specs: list[str]) -> list:
  """Each task spec built by lm-eval (its dataset read, its first document checked), in
  `specs`' order: a built task where the spec is plain tasks, else the spec itself (a
  group is built again by `simple_evaluate`, which keeps its aggregation). An exception
  from lm-eval's task code is a one-line ValueError naming the task."""
  from lm_eval.api.task import Task
  out = []
  for spec in specs:
    try:
      if hasattr(manager, "load"):   # lm-eval >= 0.4.10: flat dicts of tasks and groups
        loaded = manager.load([spec])
        built = {} if loaded["groups"] else loaded["tasks"]
      else:
        from lm_eval.tasks import get_task_dict
        built = get_task_dict([spec], manager)
    except Exception as e:   # lm-eval's own code on the task's YAML and data
      text = " ".join(str(e).split()) or "(no message)"
      raise ValueError(f"lm-eval task {spec!r} failed while lm-eval built it: "
                       f"{type(e).__name__}: {text[:300]} (check the task's YAML and its "
                       "documents: an empty answer choice, a missing field).") from None
    plain = bool(built) and all(isinstance(v, Task) and isinstance(k, str)
                                for k, v in built.items())
    out += list(built.values()) if plain else [spec]
  return out


def check_results_writable(workdir: Path) -> None:
  """Refuses, before any work, a run whose `lm_eval` folder cannot be written: the
  folder is made and a file written and removed in it."""
  folder = Path(workdir) / RESULTS_DIR
  probe = folder / f".probe.{os.getpid()}"
  try:
    folder.mkdir(parents=True, exist_ok=True)
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as e:
    raise ValueError(f"{folder}: cannot write the results there ({e.strerror or e}); make "
                     "the run directory writable, or evaluate a copy of the run.") from None


def restore_lm(workdir, step: int | None = None, **adapter):
  """(an lm-eval model over the run's model and tokenizer, the step restored); `adapter`:
  keyword arguments of `LngramLM` (batch_size, seed, ...)."""
  from experiments.jobs.lm.evaluate import require_lm
  from experiments.jobs.lm.lm_eval_adapter import make_lm
  from experiments.jobs.restore import restore_module
  model, saved, step = restore_module(workdir, step)
  require_lm(saved, workdir, "lm-eval")
  codec, prefix, stops = run_tokens(workdir, saved, model)
  adapter = {"prefix_token_id": prefix, "stop_ids": stops, **adapter}
  return make_lm(model, codec, **adapter), step


def run_tokens(workdir, saved: dict, model):
  """(codec or None for bytes, prefix token id or None, stop token ids) of a run: the
  tokenizer `sample` uses; the prefix is the BOS of an imported Hugging Face model's
  config, else the EOS; generation stops at the EOS ids."""
  from experiments.hf.config import HF_CONFIG_COPY
  workdir = Path(workdir)
  hf_config = {}
  if (workdir / HF_CONFIG_COPY).is_file():
    try:
      hf_config = json.loads((workdir / HF_CONFIG_COPY).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
      hf_config = {}
  bos = hf_config.get("bos_token_id") if isinstance(hf_config, dict) else None
  bos = bos if isinstance(bos, int) and not isinstance(bos, bool) else None
  from experiments.jobs.lm.codec import run_codec
  codec = run_codec(workdir, saved, model, "evaluate")
  if saved.get("experiment", {}).get("data", {}).get("kind") == "tokens":
    stops = ()
    if (workdir / "tokenizer.json").is_file():
      from experiments.data.tokens.tokenizer import describe
      eos = describe(str(workdir / "tokenizer.json")).eos_id
      stops = () if eos is None else (eos,)
  else:
    stops = () if codec is None else tuple(codec.eos_ids)
  prefix = bos if bos is not None else (stops[0] if stops else None)
  return codec, prefix, stops


def write_results(workdir, step: int, results: dict, settings: dict) -> Path:
  """Merges lm-eval's `results` into `<workdir>/lm_eval/results_step<step>.json` (the
  tasks run now replace their earlier entries) and returns the file."""
  from lm_eval.utils import handle_non_serializable
  fresh = json.loads(json.dumps({k: v for k, v in results.items() if k != "samples"},
                                default=handle_non_serializable))
  out = Path(workdir) / RESULTS_DIR / f"results_step{step}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  merged = {}
  if out.is_file():
    try:
      merged = json.loads(out.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
      merged = {}   # unreadable: replaced
  for key, value in fresh.items():
    if key in _BY_TASK and isinstance(value, dict) and isinstance(merged.get(key), dict):
      merged[key] = {**merged[key], **value}
    else:
      merged[key] = value
  run = {**settings, "date": fresh.get("date")}
  runs = (merged.get("lngram") or {}).get("runs", {})
  runs |= {task: run for task in fresh.get("results", {})}
  merged["lngram"] = {"workdir": str(workdir), "step": step, "runs": runs}
  from experiments.trainer import durable
  return durable.write_text(out, json.dumps(merged, indent=2, sort_keys=False,
                                            ensure_ascii=False) + "\n")
