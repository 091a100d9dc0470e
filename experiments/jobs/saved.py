"""What a checkpoint stores about its run, and the check a resumed run makes against it."""

from __future__ import annotations

import json


def saved_config(kind: str, config, model_config, trained: dict | None = None) -> dict:
  """What a checkpoint stores: {"kind", "experiment", "model", "trained"}.

  `kind` ("lm", "vlm" or "qwen3vl") says which model `experiments.restore` rebuilds;
  `trained` describes a training-only wrapper around the model (e.g. the
  stage-0 cell head) so that `restore` can rebuild the saved tree.
  """
  if kind not in ("lm", "vlm", "qwen3vl"):
    raise ValueError(f"saved_config: kind={kind!r} is not 'lm', 'vlm' or 'qwen3vl'.")
  return {"kind": kind, "experiment": json.loads(config.to_json_best_effort()),
          "model": model_config.to_dict(), "trained": trained or {}}


def resume_check(config, wanted: dict):
  """The task's `check_resume`: the saved config against `wanted` (`saved_config`),
  a changed schedule allowed by `train.allow_config_change`."""
  from experiments.jobs.checks import check_resume_config
  allow = bool(config.train.get("allow_config_change", False))
  later = _later_fields()
  return lambda directory, saved: check_resume_config(directory, saved, wanted, allow, later)


def _later_fields() -> dict:
  """Config fields added after runs may have been saved, with their defaults."""
  import experiments.configs as configs
  return dict(getattr(configs, "LATER_FIELDS", {}) or {})
