"""The task protocol: what one run gives the training loop (experiments/train/loop.py).

The loop is the same for every run (the byte LM, VLM stage 0, Stage I with a
frozen backbone, Stage II GRPO); a `Task` supplies what differs:

    kind          "lm" or "vlm": which model `experiments.checkpoint.restore`
                  rebuilds from the saved config
    module        the trained nnx module, freshly initialised (the model, or
                  a training-only wrapper such as the stage-0 `CellPretrainer`)
    saved_config  JSON stored in every checkpoint: {"kind", "experiment",
                  "model", "trained"}; enough to rebuild the module
    batches       a resumable batch source: `next()`, `get_state()` -> JSON,
                  `set_state(state)`
    loss          `(module, batch) -> (loss, metrics)`, traced inside the step
    optim         the `optim` config block the one optimiser builder reads
    phases        steps per phase: each phase starts a fresh optimiser state
                  with its own warmup + cosine over its steps (the VLM
                  stage-0 curriculum); one phase for ordinary runs
    trainable     `path -> bool` on the trained module's parameter paths, or
                  None (all train); frozen leaves stay bit-for-bit unchanged
    phase_reset   optional `path -> bool`: leaves that restart from their
                  initial values at every phase (the stage-0 cell head, which
                  the per-phase runs before the one loop rebuilt each phase)
    prepare       optional host-side `(module, batch, step) -> batch` given
                  the current parameters (GRPO: sampling, rewards, advantages)
    evaluate      optional `(module) -> {name: float}` every eval_every steps
                  and at the end
    finish        optional `(module, summary) -> dict` after the last step
                  (VLM: accuracy by length, metrics.json)
    tokens_per_step  for the progress bar's throughput
    check_mesh    optional `(mesh) -> None`: refuses, naming the numbers, a
                  device mesh the run cannot be split over (experiments/train/mesh.py)
    batch_rows    (first, stop, global rows) when `batches` yields only this
                  process's rows of every global batch (several processes); None:
                  every process reads whole batches
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Protocol

from flax import nnx


class BatchSource(Protocol):
  """An endless, exactly resumable stream of host batches (dicts of numpy arrays)."""

  def __next__(self) -> dict: ...

  def get_state(self) -> dict: ...

  def set_state(self, state: dict) -> None: ...


@dataclasses.dataclass
class Task:
  """One run's pieces; see the module docstring."""

  kind: str
  module: nnx.Module
  saved_config: dict
  batches: BatchSource
  loss: Callable[[nnx.Module, dict], tuple[Any, dict]]
  optim: Any
  phases: tuple[int, ...]
  trainable: Callable[[str], bool] | None = None
  phase_reset: Callable[[str], bool] | None = None
  prepare: Callable[[nnx.Module, dict, int], dict] | None = None
  evaluate: Callable[[nnx.Module], dict] | None = None
  finish: Callable[[nnx.Module, dict], dict] | None = None
  tokens_per_step: int = 0
  description: str = ""
  check_mesh: Callable[[Any], None] | None = None
  batch_rows: tuple[int, int, int] | None = None

  def __post_init__(self):
    self.phases = tuple(int(s) for s in self.phases)
    if not self.phases or min(self.phases) < 1:
      raise ValueError(f"Task: phases={self.phases} must be one or more positive step counts.")
    if self.kind not in ("lm", "vlm"):
      raise ValueError(f"Task: kind={self.kind!r} is not 'lm' or 'vlm'.")

  @property
  def total_steps(self) -> int:
    return sum(self.phases)


def saved_config(kind: str, config, model_config, trained: dict | None = None) -> dict:
  """What a checkpoint stores: the experiment config and the resolved model config.

  `trained` describes a training-only wrapper around the model (e.g. the
  stage-0 cell head) so that `restore` can rebuild the saved tree.
  """
  return {"kind": kind, "experiment": json.loads(config.to_json_best_effort()),
          "model": model_config.to_dict(), "trained": trained or {}}


def make_task(config, workdir) -> Task:
  """The task an experiment config describes: a VLM stage if it has a `vlm` block.

  Bad numbers and a model larger than this machine's memory are refused here,
  before the corpus is read or any parameter allocated.
  """
  check_experiment_config(config)
  check_memory(config)
  if "vlm" in config:
    from experiments.vlm.run import vlm_task
    return vlm_task(config, workdir)
  from experiments.train.lm_task import lm_task
  return lm_task(config, workdir)


# --- checks before anything is built ------------------------------------------------------

# (field, test, what it must be): numbers a run cannot use, rejected with the field named.
_POSITIVE_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                 "a positive int")
_NONNEG_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
               "an int >= 0")
_POSITIVE = (lambda v: _is_number(v) and v > 0, "a number > 0")
_NONNEG = (lambda v: _is_number(v) and v >= 0, "a number >= 0")
_UNIT_OPEN = (lambda v: _is_number(v) and 0 <= v < 1, "in [0, 1)")
_UNIT = (lambda v: _is_number(v) and 0 <= v <= 1, "in [0, 1]")
_CHECKS = {
    "train.steps": _POSITIVE_INT,
    "train.log_every": _POSITIVE_INT,
    "train.eval_every": _POSITIVE_INT,
    "train.ckpt_every": _POSITIVE_INT,
    "train.max_to_keep": _POSITIVE_INT,
    "train.seed": _NONNEG_INT,
    "data.batch_size": _POSITIVE_INT,
    "data.seq_len": _POSITIVE_INT,
    "data.eval_batches": _POSITIVE_INT,
    "data.max_files": _NONNEG_INT,
    "data.seed": _NONNEG_INT,
    "data.val_fraction": _UNIT_OPEN,
    "optim.lr": _POSITIVE,
    "optim.table_lr_mult": _POSITIVE,
    "optim.weight_decay": _NONNEG,
    "optim.b1": _UNIT_OPEN,
    "optim.b2": _UNIT_OPEN,
    "optim.eps": _POSITIVE,
    "optim.warmup_steps": _NONNEG_INT,
    "optim.warmup_frac": _UNIT_OPEN,
    "optim.min_lr_ratio": _UNIT,
    "optim.clip_norm": _NONNEG,
}


def _is_number(value) -> bool:
  import math
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def check_experiment_config(config) -> None:
  """Rejects numbers a run cannot use (steps <= 0, a negative LR, ...), naming the field.

  Fields a config does not have are skipped (the LM and VLM configs differ);
  the model block is checked by its own config class (`lm_config`, `vlm_config`).
  """
  for field, (ok, what) in _CHECKS.items():
    block, _, name = field.partition(".")
    if block not in config or name not in config[block]:
      continue
    value = config[block][name]
    if not ok(value):
      raise ValueError(f"{field}={value!r} must be {what}.")
  if "vlm" not in config and "model" in config and "data" in config:
    seq_len, max_len = config.data.get("seq_len"), config.model.get("max_len")
    if isinstance(max_len, int) and seq_len > max_len:
      raise ValueError(f"data.seq_len={seq_len} exceeds model.max_len={max_len}.")


# --- memory estimate ----------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, field: str = "max_memory") -> int:
  """'8GiB', '512MB', '1e9' -> bytes."""
  import re
  match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
  unit = match and match.group(2).lower()
  if not match or unit not in _UNITS:
    raise ValueError(f"{field}={text!r} is not a size like 8GiB, 512MB or 1e9.")
  try:
    value = float(match.group(1)) * _UNITS[unit]
  except ValueError:
    raise ValueError(f"{field}={text!r} is not a size like 8GiB, 512MB or 1e9.") from None
  if not value > 0:
    raise ValueError(f"{field}={text!r} must be > 0.")
  return int(value)


def format_bytes(n: float) -> str:
  for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{int(n)} B"


def machine_memory() -> int | None:
  """Physical memory of this machine in bytes (None where the OS does not say)."""
  import os
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def param_bytes(config) -> int:
  """Bytes of the model's parameters, from shapes alone (nnx.eval_shape: no arrays)."""
  import jax
  if "vlm" in config:
    from experiments.vlm.config import vlm_config
    from experiments.vlm.model import VLM
    model_config = vlm_config(config)
    build = lambda: VLM(model_config, rngs=nnx.Rngs(0))  # noqa: E731
  else:
    from experiments.models import DecoderLM
    from experiments.models.config import lm_config
    model_config = lm_config(config)
    build = lambda: DecoderLM(model_config, rngs=nnx.Rngs(0))  # noqa: E731
  abstract = nnx.eval_shape(build)
  leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
  return sum(int(leaf.size) * leaf.dtype.itemsize for leaf in leaves)


def memory_estimate(config) -> int:
  """Bytes of parameters + AdamW state (two moments, each the size of the parameters)."""
  return 3 * param_bytes(config)


def check_memory(config, limit: int | None = None) -> int:
  """Refuses a config whose parameters + optimizer state exceed `limit` (default: the
  machine's memory) before anything is allocated; returns the estimate in bytes."""
  need = memory_estimate(config)
  available = machine_memory()
  limits = [(limit, "the --max_memory limit")] if limit else []
  if available:
    limits.append((available, "this machine's memory"))
  for cap, what in limits:
    if need > cap:
      raise ValueError(
          f"the model needs about {format_bytes(need)} for parameters + optimizer state "
          f"({format_bytes(need / 3)} of parameters, AdamW's two moments), more than "
          f"{what} ({format_bytes(cap)}); shrink the model (e.g. model.memory.routes, "
          "bits, orders, mem_dim) or raise --max_memory.")
  return need
