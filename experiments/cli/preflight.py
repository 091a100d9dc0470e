"""Checks a command makes before it touches a run, and a refused run's clean-up.

Each check raises a one-line `ValueError` naming the flag or config field, in
seconds: before a checkpoint is restored, a corpus read or a step compiled.

  check_workdir(path, train=...)  a run directory that is a file (or under one)
  check_prompts(prompts)          empty or non-UTF-8 `--prompt` text
  mesh_block(text)                `--mesh=data=2,table=4` as a mesh block, checked
                                  against this machine's devices
  check_train_config(config)      the job's check: the numbers and the model config
                                  (its dtypes, widths), optionally against a memory
                                  limit; the train.wandb_* fields (the run's one check
                                  of them)
  leave_no_trace(workdir)         a run refused before it trained leaves none of
                                  the files it created (the directory, its lock,
                                  a lone corpus manifest)
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path


def check_workdir(workdir, *, train: bool) -> Path:
  """`workdir` as a Path; refuses a file, or (train) a path under a file."""
  path = Path(workdir).expanduser()
  if path.exists() and not path.is_dir():
    raise ValueError(f"--workdir={workdir} is a file, not a run directory.")
  if train:
    parent = path.absolute().parent
    while not parent.exists():
      parent = parent.parent
    if not parent.is_dir():
      raise ValueError(f"--workdir={workdir}: {parent} is a file, not a directory.")
  return path


def check_prompts(prompts: list[str]) -> list[str]:
  """The prompts, each a non-empty string that is valid UTF-8 text."""
  for prompt in prompts:
    if not prompt:
      raise ValueError("--prompt must be a non-empty string.")
    try:
      prompt.encode("utf-8")
    except UnicodeEncodeError as e:
      # Bytes that are not UTF-8 reach Python as lone surrogates ("\udcff" for 0xff).
      bad = prompt[e.start:e.end].encode("utf-8", "surrogateescape")
      raise ValueError(f"--prompt={prompt.encode('utf-8', 'surrogateescape')!r} is not "
                       f"UTF-8 text (byte {bad[:1].hex()} at position {e.start}); the "
                       "model reads UTF-8 bytes.") from None
  return prompts


def mesh_block(text: str | None) -> dict | None:
  """`data=2,table=4` -> the mesh block, checked against this machine's devices."""
  if text is None:
    return None
  from experiments.trainer.placement import make_train_mesh, parse_mesh
  block = parse_mesh(text)
  make_train_mesh(block)   # a bad block fails here, before a checkpoint is read
  return block


def check_train_config(config, *, max_memory: str | None = None):
  """Refuses a config the run cannot use, before its workdir is touched; returns its job's
  check (`experiments.jobs.Checked`), which builds the task without checking again."""
  from experiments.jobs import job_of
  from experiments.jobs.checks import check_memory, parse_bytes
  from experiments.trainer.writers import check_wandb
  # Once per run, here: the trainer makes the W&B run without checking them again.
  check_wandb(config.get("train") or {})
  job = job_of(config)
  checked = job.check(config)
  if config.get("plan_devices"):   # e.g. experiments/configs/hf_lngram.py: the plan for N
    line = job.memory_line(checked, config.plan_devices)
    if line:
      print(line, file=sys.stderr, flush=True)
  if max_memory:   # the machine's own memory is checked when the task is built
    check_memory(checked, limit=parse_bytes(max_memory, "--max_memory"))
  return checked


# What `train` writes before its first step; a directory holding anything else has
# a run's results in it and is never cleaned. (`checkpoints.log` is not one: it holds
# the full text of a failed save, which the error points to.)
_PRE_RUN_FILES = {".lock", "corpus_manifest.json", "checkpoints"}


def _only_pre_run_files(path: Path) -> bool:
  if path.is_dir():
    return all(_only_pre_run_files(p) for p in path.iterdir()) and (
        path.name in _PRE_RUN_FILES)
  return path.name in _PRE_RUN_FILES or path.name.startswith(".lock.")


@contextlib.contextmanager
def leave_no_trace(workdir):
  """Removes what a run created in `workdir` if it fails before writing any result.

  A directory the run created goes entirely, if it holds only pre-run files; in
  a directory that existed, only the pre-run files the run added go. Results
  (metrics, checkpoints, plots, the checkpoint log) are never removed, and a
  directory that already held a run (a resume) is left as it is.
  """
  import jax
  path = Path(workdir).expanduser().absolute()
  created = []   # the directories this run will create, outermost first
  probe = path
  while not probe.exists():
    created.insert(0, probe)
    probe = probe.parent
  before = set(path.iterdir()) if path.is_dir() else set()
  held_a_run = any(p.name in ("checkpoints", "metrics.jsonl") for p in before)
  try:
    yield
  except BaseException:
    if jax.process_count() == 1 and not held_a_run:
      added = [p for p in path.iterdir() if p not in before] if path.is_dir() else []
      if all(_only_pre_run_files(p) for p in added):
        for p in added:
          shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        for directory in reversed(created):   # innermost first, each only if empty
          with contextlib.suppress(OSError):
            directory.rmdir()
    raise
