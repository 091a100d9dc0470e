"""Load a Hugging Face Qwen3 / Qwen3-MoE / Llama / Qwen2 checkpoint into the one `DecoderLM`.

    model, config = load_hf(hf_dir)                 the backbone alone
    fill_backbone(model, hf_dir)                    into a model with memory slots

The model is built shape-only (`nnx.eval_shape`: no weights drawn, no memory
used); each parameter is then assembled from its memory-mapped HF tensors
(experiments/hf/names.py) and put on device, one at a time, so the host holds
about one tensor beyond the file pages it reads. With a `mesh` every parameter
goes straight into its shard (`jax.make_array_from_callback`): each process
reads only the slices its own devices hold. Every check (tensors missing or
unexpected, shapes) runs before the first tensor is read.

config.json's tie_word_embeddings=true beside an `lm_head.weight` that differs
from the embedding: `load_hf` keeps the head (the model is untied, with a
warning), as transformers 5 does; a head equal to the embedding stays tied. A
tied model given to `fill_backbone` (init_from=hf:DIR) cannot hold such a head
and is refused. An Lngram v2 export's config.json names its memory files
(`lngram_v2`, experiments/hf/export.py): a copy without them is an incomplete
export and is refused; with them, a warning says the memory is not read.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from experiments.hf import qwen3_moe
from experiments.hf.config import check_matches, hf_lm_config, read_config_json
from experiments.hf.hub import resolve_checkpoint
from experiments.hf.names import hf_shapes, ignorable, param_targets
from experiments.hf.safetensors_io import INDEX_NAME, SINGLE_NAME, Checkpoint, HFCheckpointError
from experiments.models.config import LMConfig
from experiments.models.lm import DecoderLM
from experiments.trainer.optimizer import path_str
from experiments.trainer.placement import param_spec


def named(names, limit=6) -> str:
  """Up to `limit` of `names`, sorted, for an error line ("a, b and 3 more")."""
  names = sorted(names)
  more = f" and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def check_tensors(ckpt: Checkpoint, config: LMConfig) -> None:
  """Refuses missing / unexpected tensors and shape mismatches, naming them."""
  want = hf_shapes(config, qwen3_moe.layout_of(ckpt.names()))
  check_tensor_set(ckpt, want, lambda name: ignorable(name, config))


def check_tensor_set(ckpt: Checkpoint, want: dict, ignore=lambda name: False) -> None:
  """The checkpoint holds exactly `want` {name: shape} (besides names `ignore`
  accepts), each at its shape; otherwise one error naming what differs."""
  have = ckpt.names()
  missing = set(want) - have
  if missing:
    raise HFCheckpointError(f"{ckpt.dir}: missing tensors {named(missing)}.")
  unexpected = {n for n in have - set(want) if not ignore(n)}
  if unexpected:
    raise HFCheckpointError(f"{ckpt.dir}: unexpected tensors {named(unexpected)} (not "
                            "part of the model config.json describes).")
  for name, shape in sorted(want.items()):
    if ckpt.shape(name) != shape:
      raise HFCheckpointError(f"{ckpt.dir}: tensor {name} has shape {list(ckpt.shape(name))}, "
                              f"config.json implies {list(shape)}.")


def _put(host, shape, dtype, sharding):
  """One parameter on device: whole, or shard by shard from `host` (a host array, often a
  memory-mapped view, so a shard reads only its own slice of the file)."""
  if sharding is None:
    return jax.device_put(np.asarray(host, dtype=dtype))
  return jax.make_array_from_callback(
      shape, sharding, lambda index: np.asarray(host[index], dtype=dtype))


def _strip(path):
  return tuple(k for k in path
               if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))


def copy_params(model, targets: dict, ckpt: Checkpoint, hf_dir, sharding_of=None) -> list:
  """Sets each parameter of `model` named in `targets` from the checkpoint's tensors.

  A parameter with no target keeps its value (a branch the checkpoint lacks); in an
  abstract model (shape-only) that is an error. sharding_of(name, shape) places a
  tensor shard by shard; default whole on the default device. Returns the names of
  the parameters left as they were.
  """
  params = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  new, fresh = [], []
  for path, leaf in leaves:
    name = path_str(_strip(path))
    target = targets.get(name)
    if target is None:
      if isinstance(leaf, jax.ShapeDtypeStruct):
        raise HFCheckpointError(f"{hf_dir}: no tensor for parameter {name}.")
      fresh.append(name)
      new.append(leaf)
      continue
    host = target.build(*(ckpt.tensor(s) for s in target.sources))
    if tuple(np.shape(host)) != tuple(leaf.shape):
      raise HFCheckpointError(f"{hf_dir}: parameter {name} would get shape "
                              f"{list(np.shape(host))}, the model has {list(leaf.shape)}.")
    sharding = sharding_of(name, tuple(leaf.shape)) if sharding_of is not None else None
    new.append(_put(host, tuple(leaf.shape), leaf.dtype, sharding))
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return fresh


HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"
LNGRAM_ENTRY = "lngram_v2"   # config.json's entry of an Lngram v2 export (export.py)


def head_differs(ckpt: Checkpoint) -> bool:
  """Whether the checkpoint holds an lm_head.weight that is not its embedding table
  (compared in blocks of rows, so the host never holds two whole copies)."""
  if HEAD not in ckpt.names() or EMBED not in ckpt.names():
    return False
  head, embed = ckpt.tensor(HEAD), ckpt.tensor(EMBED)
  if head.shape != embed.shape:
    return True
  rows = max(1, 2**26 // max(1, head[:1].nbytes))
  return any(not np.array_equal(head[i:i + rows], embed[i:i + rows])
             for i in range(0, head.shape[0], rows))


def untied_if_head_differs(config, hf_dir):
  """`config` untied when config.json ties but the files hold an lm_head.weight other
  than the embedding (transformers 5 keeps that head); else `config` itself. A
  directory with config.json alone (a plan from shapes) is left as it is."""
  if not config.tie_embeddings or not any(
      (Path(hf_dir) / name).is_file() for name in (SINGLE_NAME, INDEX_NAME)):
    return config
  with warnings.catch_warnings():   # fill_backbone opens it again and says what it reads
    warnings.simplefilter("ignore")
    ckpt = Checkpoint(hf_dir)
  return dataclasses.replace(config, tie_embeddings=False) if head_differs(ckpt) else config


def _untied_head_note(hf_dir) -> str:
  return (f"{hf_dir}: config.json ties the output layer to the embeddings "
          f"(tie_word_embeddings=true) but {HEAD} differs from {EMBED}")


def check_memory_files(hf_dir, hf: dict) -> None:
  """An Lngram v2 export (config.json's `lngram_v2` entry) holds its memory files:
  refused without them (an interrupted or partial copy would read as a plain
  backbone); with them, a warning that the memory is not read."""
  entry = hf.get(LNGRAM_ENTRY)
  if not isinstance(entry, dict):
    return
  names = [entry.get(key) for key in ("weights", "config")]
  missing = [name for name in names if not isinstance(name, str)
             or not (Path(hf_dir) / name).is_file()]
  if missing:
    raise HFCheckpointError(
        f"{hf_dir}: an incomplete export: config.json declares an Lngram v2 memory in "
        f"{', '.join(map(str, missing))}, which is missing (an interrupted copy?). Export "
        f"again, or delete config.json's {LNGRAM_ENTRY!r} entry to read the backbone alone.")
  warnings.warn(f"{hf_dir} holds an Lngram v2 memory ({names[0]}, layers "
                f"{entry.get('layers')}) that is not read: only the backbone is loaded.",
                UserWarning, stacklevel=3)


def fill_backbone(model: DecoderLM, hf_dir, *, mesh=None, rules=None) -> dict:
  """Sets every backbone parameter of `model` (abstract or concrete) from the checkpoint.

  Parameters the checkpoint has no tensor for (memory and beside-FFN branches)
  keep their values; in an abstract model that is an error. An untied model
  reads lm_head.weight even where config.json ties (load_hf's choice for a
  distinct head); a tied one is refused when that head differs from the
  embedding. Returns {"copied", "fresh" (paths left as they were)}. `hf_dir`: a
  directory or a hub id (experiments/hf/hub.py).
  """
  hf_dir = resolve_checkpoint(hf_dir)
  hf = read_config_json(hf_dir)
  check_memory_files(hf_dir, hf)
  hf_config = hf_lm_config(hf, dtype=model.config.dtype, param_dtype=model.config.param_dtype)
  ckpt = Checkpoint(hf_dir)
  if hf_config.tie_embeddings and HEAD in ckpt.names():
    if not model.config.tie_embeddings:
      hf_config = dataclasses.replace(hf_config, tie_embeddings=False)
    elif head_differs(ckpt):
      raise HFCheckpointError(
          f"{_untied_head_note(hf_dir)}; a tied model would drop that head, which "
          "transformers 5 keeps. Set tie_word_embeddings to false in config.json to read "
          "it untied.")
  check_matches(hf_config, model.config)
  check_tensors(ckpt, model.config)
  targets = param_targets(model.config, qwen3_moe.layout_of(ckpt.names()))
  sharding_of = None
  if mesh is not None:
    sharding_of = lambda name, shape: NamedSharding(  # noqa: E731
        mesh, param_spec(tuple(name.split("/")), shape, mesh, rules))
  fresh = copy_params(model, targets, ckpt, hf_dir, sharding_of)
  return {"copied": len(targets), "fresh": fresh}


def load_hf(hf_dir, *, config: LMConfig | None = None, mesh=None, rules=None, dtype=None,
            param_dtype=None, max_len=None) -> tuple[DecoderLM, LMConfig]:
  """(model, config) of a Hugging Face checkpoint directory.

  config: the LMConfig to build (e.g. with memory slots; its backbone fields
  must match config.json); default the checkpoint's own (untied when a tied
  config.json sits beside a distinct lm_head.weight), with dtype /
  param_dtype (default the checkpoint's) and max_len (default
  max_position_embeddings). Branch parameters are drawn from their init
  (seed 0); the backbone is never drawn. `hf_dir`: a directory or a hub id
  (experiments/hf/hub.py).
  """
  hf_dir = resolve_checkpoint(hf_dir)
  if config is None:
    config = hf_lm_config(read_config_json(hf_dir), dtype=dtype, param_dtype=param_dtype,
                          max_len=max_len)
    untied = untied_if_head_differs(config, hf_dir)
    if untied is not config:
      warnings.warn(f"{_untied_head_note(hf_dir)}: loaded untied, keeping the head, as "
                    "transformers 5 does.", UserWarning, stacklevel=2)
      config = untied
  abstract = nnx.eval_shape(lambda: DecoderLM(config, rngs=nnx.Rngs(0)))
  if config.memory_layers or config.ffn_branch_layers or config.lora is not None:
    model = DecoderLM(config, rngs=nnx.Rngs(0))
  else:
    model = abstract
  fill_backbone(model, hf_dir, mesh=mesh, rules=rules)
  return model, config
