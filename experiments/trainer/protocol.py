"""The task protocol: what one run gives the trainer (experiments/trainer/loop.py).

The trainer is the same for every job; a `Task` supplies what differs. The
caller builds the task (experiments/jobs: the LM on bytes or tokens, the tiny VLM's
stage 0, Stage I with a frozen backbone and Stage II GRPO, Qwen3-VL's stages) and
hands it to `train`:

    module        the trained nnx module, initialised (the model, or a
                  training-only wrapper such as the stage-0 `CellPretrainer`)
    saved_config  JSON stored in every checkpoint; enough to rebuild the module
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
                  initial values at every phase (the stage-0 cell head)
    prepare       optional host-side `(module, batch, step) -> batch` given
                  the current parameters (GRPO: sampling, rewards, advantages)
    evaluate      optional `(module) -> {name: float}` every eval_every steps
                  and at the end
    headline      optional `(evaluation) -> str`: the line logged for it
    finish        optional `(module, summary) -> dict` after the last step
                  (VLM: accuracy by length, metrics.json)
    tokens_per_step  for the throughput (the progress bar, train/tokens_per_s)
    description   the run in a few words, for the log line a run starts with
    check_mesh    optional `(mesh) -> None`: refuses, naming the numbers, a
                  device mesh the run cannot be split over
    check_resume  optional `(run directory, saved config) -> None`: refuses a
                  checkpoint whose config this run may not continue, before any
                  array is read (experiments/jobs/checks.py)
    placement     optional `rule(path, shape, mesh) -> PartitionSpec | None`
                  for the parameters (experiments/trainer/placement.py)
    seq_batches   the batches are [B, T, ...] token arrays whose time axis the
                  mesh's `seq` axis may split
    batch_rows    (first, stop, global rows) when `batches` yields only this
                  process's rows of every global batch (several processes); None:
                  every process reads whole batches
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
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
  headline: Callable[[dict], str] | None = None
  finish: Callable[[nnx.Module, dict], dict] | None = None
  tokens_per_step: int = 0
  description: str = ""
  check_mesh: Callable[[Any], None] | None = None
  check_resume: Callable[[Path, dict], None] | None = None
  placement: Callable[..., Any] | None = None
  seq_batches: bool = False
  batch_rows: tuple[int, int, int] | None = None

  def __post_init__(self):
    self.phases = tuple(int(s) for s in self.phases)
    if not self.phases or min(self.phases) < 1:
      raise ValueError(f"Task: phases={self.phases} must be one or more positive step counts.")

  @property
  def total_steps(self) -> int:
    return sum(self.phases)
