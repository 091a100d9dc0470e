"""Insertion into a trained model (Lngram v2 paper, App. B): `init_from`.

`--config.init_from=<workdir>` starts a run with memory branches from the
newest valid checkpoint of a run without them: every parameter the source
run has (the backbone) is copied in; the new branch parameters keep their
fresh initialisation. Lngram v2's W_O and conv taps are zero at init, so the
branch adds exactly nothing and the model at step 0 computes the source
model's logits bit for bit. The run has its own optimiser state and schedule
(they are not read from the source), and a resumed run restores its own
checkpoints, not the source's.
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from experiments.models import DecoderLM, LMConfig

# Fields that may differ between the source and the run it starts: the slots
# being inserted, and how the backward is computed.
_MAY_DIFFER = ("memory_layers", "memory", "remat")


class InitFromError(ValueError):
  """The source run of `init_from` cannot start this model."""


def _flat(tree: dict, prefix=()) -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out |= _flat(value, prefix + (key,))
    else:
      out[prefix + (key,)] = value
  return out


def _set(tree: dict, path: tuple, value) -> None:
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value


def check_backbones_match(source: LMConfig, target: LMConfig) -> None:
  diffs = [f"{f.name}: {getattr(source, f.name)!r} in the source, "
           f"{getattr(target, f.name)!r} here"
           for f in dataclasses.fields(LMConfig) if f.name not in _MAY_DIFFER
           and getattr(source, f.name) != getattr(target, f.name)]
  if diffs:
    raise InitFromError("init_from: the source run's backbone differs from this model's ("
                        + "; ".join(diffs) + "); use a source trained with the same "
                        "model settings.")


def insert_into(model: DecoderLM, source_workdir) -> dict:
  """Copies the backbone of the run in `source_workdir` into `model`, in place.

  Returns {"source", "step", "copied", "fresh"} (array counts). Raises
  `InitFromError` when the source is not an LM run, its backbone config
  differs, or it has a parameter this model lacks or holds with another shape
  (e.g. a memory branch of a different kind).
  """
  from experiments.checkpoint.restore import restore_module

  source, saved, step = restore_module(source_workdir)
  if not isinstance(source, DecoderLM):
    raise InitFromError(f"init_from={source_workdir!r} holds a {saved.get('kind')!r} run, "
                        "not a byte LM.")
  check_backbones_match(source.config, model.config)
  source_params = _flat(nnx.to_pure_dict(nnx.state(source, nnx.Param)))
  target_tree = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  target_params = _flat(target_tree)
  for path, value in source_params.items():
    have = target_params.get(path)
    name = "/".join(map(str, path))
    if have is None:
      raise InitFromError(f"init_from: the source has parameter {name}, which this model "
                          "lacks (insert into a run without that branch).")
    if have.shape != value.shape or have.dtype != value.dtype:
      raise InitFromError(f"init_from: parameter {name} is {value.dtype}{list(value.shape)} "
                          f"in the source, {have.dtype}{list(have.shape)} here.")
    _set(target_tree, path, value)
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, target_tree)
  nnx.update(model, state)
  return {"source": str(source_workdir), "step": step, "copied": len(source_params),
          "fresh": len(target_params) - len(source_params)}
