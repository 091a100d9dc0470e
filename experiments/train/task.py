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
  """The task an experiment config describes: a VLM stage if it has a `vlm` block."""
  if "vlm" in config:
    from experiments.vlm.run import vlm_task
    return vlm_task(config, workdir)
  from experiments.train.lm_task import lm_task
  return lm_task(config, workdir)
