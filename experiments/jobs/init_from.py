"""`init_from`: start a model from the parameters of an earlier run, by path.

One function serves both uses:

  * insertion into a trained LM (Lngram v2 paper, App. B; `--config.init_from=
    <workdir>`): every parameter of the source run (the backbone) is copied in;
    the new memory branches keep their fresh initialisation. Lngram v2's W_O and
    conv taps are zero at init, so the branch adds exactly nothing and the model
    at step 0 computes the source model's logits bit for bit;
  * the VLM's later stages (`vlm.stage.init_from`): Stage I starts from stage 0,
    its PVM branch left at init (λ = 0: the base model exactly), Stage II from
    Stage I.

The run has its own optimiser state and schedule (they are not read from the
source), and a resumed run restores its own checkpoints, not the source's. A
source parameter the model has no place for, or holds with another shape or
dtype, means the configs disagree: an error rather than dropped silently.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.trainer.optimizer import path_str

# LM fields that may differ between the source and the run it starts: the slots
# being inserted, and how the backward is computed.
_MAY_DIFFER = ("memory_layers", "memory", "remat")


class InitFromError(ValueError):
  """The source run of `init_from` cannot start this model."""


def _strip_value(path):
  # nnx.State leaves are Variables whose key path ends in `.value`.
  return tuple(k for k in path
               if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))


def flat_params(params) -> dict[str, jax.Array]:
  """{'lm/blocks/1/ffn_branch/gate': array, ...} of a param state or pure dict."""
  return {path_str(_strip_value(p)): v
          for p, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def check_backbones_match(source, target) -> None:
  """Refuses an LM source whose config differs outside the inserted slots."""
  diffs = [f"{f.name}: {getattr(source, f.name)!r} in the source, "
           f"{getattr(target, f.name)!r} here"
           for f in dataclasses.fields(type(target)) if f.name not in _MAY_DIFFER
           and getattr(source, f.name) != getattr(target, f.name)]
  if diffs:
    raise InitFromError("init_from: the source run's backbone differs from this model's ("
                        + "; ".join(diffs) + "); use a source trained with the same "
                        "model settings.")


def init_from(model: nnx.Module, source_workdir, *, kind: str | None = None,
              check=None) -> dict:
  """Copies every parameter of the run in `source_workdir` (its newest valid
  checkpoint) into `model`, in place, by path.

  Args:
    model: the freshly initialised model (parameters the source lacks keep their init).
    source_workdir: the earlier run's directory.
    kind: the source run's kind ("lm", "vlm"), or None (any).
    check: optional `check(source_config, model_config)` that raises
      `InitFromError` (the LM's `check_backbones_match`).

  Returns:
    {"source", "step", "copied", "fresh" (array counts), "missing" (the paths left
    at their init)}.
  """
  from experiments.jobs.registry import saved_job_name
  from experiments.jobs.restore import restore_module

  source, saved, step = restore_module(source_workdir)
  if kind is not None and saved_job_name(saved) != kind:
    raise InitFromError(f"init_from={str(source_workdir)!r} holds a "
                        f"{saved_job_name(saved)!r} run, not a {kind!r} run.")
  if check is not None:
    check(source.config, model.config)
  source_params = {k: np.asarray(v)
                   for k, v in flat_params(nnx.state(source, nnx.Param)).items()}
  params = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  have = {path_str(_strip_value(p)): v for p, v in leaves}
  for name, value in source_params.items():
    if name not in have:
      raise InitFromError(f"init_from: the source has parameter {name}, which this model "
                          f"lacks ({source_workdir}, step {step}); its config must match "
                          "the run it starts from.")
    if have[name].shape != value.shape or have[name].dtype != value.dtype:
      raise InitFromError(f"init_from: parameter {name} is {value.dtype}{list(value.shape)} "
                          f"in the source, {have[name].dtype}{list(have[name].shape)} here.")
  new, missing = [], []
  for p, v in leaves:
    name = path_str(_strip_value(p))
    if name in source_params:
      new.append(jnp.asarray(source_params[name], v.dtype))
    else:
      missing.append(name)
      new.append(v)
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return {"source": str(source_workdir), "step": step, "copied": len(source_params),
          "fresh": len(missing), "missing": missing}


def insert_into(model, source_workdir) -> dict:
  """Insertion into a trained LM: `init_from` an LM run whose backbone matches, or
  (`hf:DIR`) a Hugging Face checkpoint's tensors (experiments/hf; the model was
  built with its backbone by `experiments.hf.backbone.with_hf_backbone`)."""
  from experiments.hf.backbone import hf_dir_of
  hf_dir = hf_dir_of(source_workdir)
  if hf_dir is not None:
    from experiments.hf.load import fill_backbone
    info = fill_backbone(model, hf_dir)
    return {"source": str(source_workdir), "step": 0, "copied": info["copied"],
            "fresh": len(info["fresh"]), "missing": info["fresh"]}
  return init_from(model, source_workdir, kind="lm", check=check_backbones_match)
