"""The analyses of a finished VLM run: `analyze(workdir, ...)` (experiments.analysis.vlm).

A VLM run directory is a run directory like any other (orbax checkpoints with
the data state, metrics.jsonl, loss_curve.png; resumable after a kill) plus
data/ (the rendered scenes, cached unless vlm.scenes.data_dir says where),
accuracy_by_length.json/.png and metrics.json (stage, history, timings,
evaluation, branch) once the stage has finished. The stages themselves are
tasks of the trainer: experiments/jobs/vlm/task.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import ml_collections

from experiments.analysis import output
from experiments.analysis import vlm as analysis
from experiments.analysis.grounding import grounding_probe
from experiments.vlm.tiny.scenes import split_data

log = logging.getLogger("experiments")
ANALYSES = ("attention", "accuracy", "logit_lens", "grounding")


def analyze(workdir, *, restore, which=ANALYSES, step: int | None = None, n: int = 16,
            max_new_tokens: int | None = None) -> dict:
  """Runs the analyses on the checkpoint at `step` (default the newest) of a run; writes
  <name>.json/.png into it atomically, each result with its `source` (checkpoint step,
  config digest, seeds), under the run's analysis lock (experiments/analysis/output.py).
  `restore(step) -> (model, saved config JSON, step restored)`: the run's checkpoints
  (the CLI passes `experiments.jobs.restore.restore_module` bound to `workdir`)."""
  unknown = set(which) - set(ANALYSES)
  if unknown:
    raise ValueError(f"analyze: unknown analyses {sorted(unknown)}.")
  workdir = Path(workdir).absolute()
  if not (workdir / "checkpoints").is_dir():   # before the lock is written into it
    raise FileNotFoundError(f"no checkpoint directory {workdir / 'checkpoints'}.")
  with output.analysis_lock(workdir):
    return _analyze(workdir, restore, which, step, n, max_new_tokens)


def _analyze(workdir: Path, restore, which, step, n, max_new_tokens) -> dict:
  model, saved, step = restore(step)
  if saved.get("kind") != "vlm":
    raise ValueError(f"analyze: {workdir} is not a VLM run (lngram-exp eval reads LM runs).")
  config = ml_collections.ConfigDict(saved["experiment"])
  sc = config.vlm.scenes
  val = split_data(config, workdir, "validation", max(n, config.vlm.eval.n),
                   task="caption" if sc.task == "caption" else "count")
  N = max_new_tokens or config.vlm.eval.max_new_tokens
  out = {}
  if "attention" in which:
    out["attention_decay"] = analysis.attention_decay(model, val, n=n, max_new_tokens=N)
  if "accuracy" in which:
    out["accuracy_by_length"] = analysis.accuracy_by_length(model, val, n=n, max_new_tokens=N)
  if "logit_lens" in which:
    out["logit_lens"] = analysis.logit_lens(model, val, n=n, max_new_tokens=N)
  if "grounding" in which:
    out["grounding"] = grounding_probe(model, val, n=n)
  # The scenes are drawn from the config's scene seed: that is the seed of every result.
  src = output.source(saved, step, config.vlm.scenes.scene_seed)
  out = {name: {**result, "source": src} for name, result in out.items()}
  for name, result in out.items():
    analysis.write_json_png(workdir, name, result)
  return out
