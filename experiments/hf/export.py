"""Export a run's backbone as a Hugging Face checkpoint: `lngram-exp export-hf`.

    export_hf(workdir, out)   config.json + model.safetensors (or shards with
                              model.safetensors.index.json above `max_shard_bytes`)

`transformers.AutoModelForCausalLM.from_pretrained(out)` then computes our
logits with the memory branches off (they have no HF counterpart). A run that
came from `import-hf` starts from its source `config.json` (hf_config.json),
so every field we do not model survives; otherwise the family follows from
the decoder options: q/k norms -> qwen3, q/k/v biases -> qwen2, else llama.
The name table is experiments/hf/names.py (DESIGN.md §11); importing an
export gives the same parameters bit for bit. Lngram v2 branches go beside
the backbone in lngram_v2.safetensors + lngram_v2_config.json under the
authors' `RouteNgramMemoryV2` names (experiments/hf/memory_export.py); the
other arms have no reference module and are not written: export-hf says so
in one warning line naming the branch and its parameter count.

The checkpoint is written whole or not at all (experiments/hf/atomic_dir.py
`new_directory`, which import-hf uses too): everything goes into a private sibling `<out>.tmp-<pid>`
that is renamed onto `out` at the very end, so a kill at any point leaves
nothing at `out`, and two writers into one `out` never mix (the second is
refused in one line). config.json of an Lngram v2 export names its
`lngram_v2` files; readers refuse a copy that lacks them
(experiments/hf/load.py).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from experiments.hf import memory_export, qwen3_moe
from experiments.hf.atomic_dir import new_directory
from experiments.hf.load import LNGRAM_ENTRY
from experiments.hf.memory_export import lngram_v2_export
from experiments.hf.names import param_targets, to_hf
from experiments.hf.safetensors_io import INDEX_NAME, SINGLE_NAME, HFCheckpointError, write_file
from experiments.models.config import LMConfig
from experiments.trainer.optimizer import path_str

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "llama": "LlamaForCausalLM", qwen3_moe.MODEL_TYPE: qwen3_moe.ARCHITECTURE}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def left_out(config: LMConfig, flat: dict, exported_memory: bool) -> list[str]:
  """One line per branch of the run that the export does not hold: its kind, layers
  and parameter count (the PKM, Engram, Lngram v1, sparse-FFN memories and the
  beside-FFN branches have no Hugging Face form)."""
  from experiments.models import branches
  backbone = set(param_targets(config))
  lines = []
  for slot, layers, branch, name in (
      ("memory", config.memory_layers, config.memory, "memory"),
      ("ffn_branch", config.ffn_branch_layers, config.ffn_branch, "beside-FFN branch")):
    if not layers or branch is None or (slot == "memory" and exported_memory):
      continue
    count = sum(int(np.size(v)) for path, v in flat.items() if path not in backbone
                and path.split("/")[0] == "blocks" and path.split("/")[2] == slot)
    where = (f"layer {layers[0]}" if len(layers) == 1
             else f"layers {', '.join(map(str, layers))}")
    lines.append(f"the {branches.kind_of(branch).name} {name} ({where}, {count:,} parameters) "
                 "has no Hugging Face form and is not exported; the export holds the "
                 "backbone only.")
  return lines


def hf_config_json(config: LMConfig, source: dict | None = None) -> dict:
  """The config.json of `config`'s backbone (over `source`, a config.json it came from)."""
  c = config
  model_type = "qwen3" if c.qk_norm else "qwen2" if c.qkv_bias else "llama"
  if c.moe_layers:   # only Qwen3-MoE holds experts: q/k norms, no shared experts
    qwen3_moe.check_exportable(c)
    model_type = qwen3_moe.MODEL_TYPE
  out = dict(source or {})
  # An imported export's memory entry: this export declares its own, if any.
  for old in ("rope_parameters", "rope_scaling", "torch_dtype", LNGRAM_ENTRY):
    out.pop(old, None)
  out.update(
      architectures=[ARCHITECTURES[model_type]], model_type=model_type,
      vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.ffn_dim,
      num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
      num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
      max_position_embeddings=c.max_len, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
      rope_scaling=dict(c.rope_scaling) or None, tie_word_embeddings=c.tie_embeddings,
      hidden_act="silu", initializer_range=c.init_std, dtype=np.dtype(c.param_dtype).name)
  if model_type != "qwen2":
    out["attention_bias"] = False
  if c.moe_layers:
    out.pop("num_local_experts", None)
    out.update(qwen3_moe.hf_config_fields(c))
  return out


def export_lm(model, workdir, out, step: int, *, max_shard_bytes: int = 4 * 2**30) -> dict:
  """Writes the backbone of `model`, restored from the run in `workdir` at `step`, to `out`
  (checked new or empty by the caller; the run's hf_config.json and tokenizer files are
  read from `workdir`).

  `out` appears whole at the end or not at all (`new_directory`). A branch with no
  Hugging Face form is named in a warning. Returns {"out", "files", "tensors", "step",
  "left_out" (the warnings' lines)}.
  """
  if not isinstance(getattr(model, "config", None), LMConfig):
    raise HFCheckpointError(f"{workdir}: export-hf exports LM runs, not this one.")
  flat = {path_str(path): np.asarray(v) for path, v in jax.tree_util.tree_flatten_with_path(
      nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]}
  tensors = to_hf(model.config, flat)
  source_path = Path(workdir) / "hf_config.json"
  source = json.loads(source_path.read_text()) if source_path.is_file() else None
  config_json = hf_config_json(model.config, source)
  lngram = lngram_v2_export(model.config, flat)
  if lngram is not None:   # config.json names the memory's files: readers check them
    config_json[LNGRAM_ENTRY] = {"weights": memory_export.FILE,
                                 "config": memory_export.CONFIG_FILE,
                                 "layers": list(lngram[1]["layers"])}
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensors[name]
    size += nbytes
  shards.append(current)
  with new_directory(out, "out", "export-hf", "checkpoint") as tmp:
    if len(shards) == 1:
      files = [SINGLE_NAME]
      write_file(tmp / SINGLE_NAME, shards[0], {"format": "np"})
    else:
      files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
      for file, shard in zip(files, shards, strict=True):
        write_file(tmp / file, shard, {"format": "np"})
      index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
               "weight_map": {n: f for f, s in zip(files, shards, strict=True) for n in s}}
      (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True))
    (tmp / "config.json").write_text(json.dumps(config_json, indent=2, sort_keys=True))
    if lngram is not None:   # the Lngram v2 branches, under the authors' module's names
      write_file(tmp / memory_export.FILE, lngram[0], {"format": "pt"})
      (tmp / memory_export.CONFIG_FILE).write_text(json.dumps(lngram[1], indent=2))
      files.append(memory_export.FILE)
    for name in TOKENIZER_FILES:
      if (Path(workdir) / name).is_file():
        shutil.copyfile(Path(workdir) / name, tmp / name)
  dropped = left_out(model.config, flat, exported_memory=lngram is not None)
  for line in dropped:
    warnings.warn(line, UserWarning, stacklevel=2)
  return {"out": str(out), "files": files, "tensors": len(tensors),
          "step": int(step), "left_out": dropped}
