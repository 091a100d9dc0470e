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
other arms have no reference module and are not written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from experiments.hf import memory_export, qwen3_moe
from experiments.hf.memory_export import lngram_v2_export
from experiments.hf.names import to_hf
from experiments.hf.safetensors_io import INDEX_NAME, SINGLE_NAME, HFCheckpointError, write_file
from experiments.models.config import LMConfig
from experiments.trainer.optimizer import path_str

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "llama": "LlamaForCausalLM", qwen3_moe.MODEL_TYPE: qwen3_moe.ARCHITECTURE}


def hf_config_json(config: LMConfig, source: dict | None = None) -> dict:
  """The config.json of `config`'s backbone (over `source`, a config.json it came from)."""
  c = config
  model_type = "qwen3" if c.qk_norm else "qwen2" if c.qkv_bias else "llama"
  if c.moe_layers:   # only Qwen3-MoE holds experts: q/k norms, no shared experts
    qwen3_moe.check_exportable(c)
    model_type = qwen3_moe.MODEL_TYPE
  out = dict(source or {})
  for old in ("rope_parameters", "rope_scaling", "torch_dtype"):
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


def export_hf(workdir, out, *, step: int | None = None,
              max_shard_bytes: int = 4 * 2**30) -> dict:
  """Writes the backbone of the run in `workdir` (newest valid step, or `step`) to `out`.

  `out` must be new or empty; a failure while writing removes what this call
  created. Returns {"out", "files", "tensors", "step"}.
  """
  from experiments.tasks.restore import restore

  out = Path(out).expanduser()
  if out.exists() and (not out.is_dir() or any(out.iterdir())):
    raise HFCheckpointError(f"--out={out} exists and is not empty; export-hf writes a new "
                            "checkpoint directory.")
  model, experiment = restore(workdir, step)
  if type(model).__name__ == "Qwen3VL":   # with its PVM branches in the authors' layout
    from experiments.hf.qwen3vl_export import export_qwen3vl
    return export_qwen3vl(model, workdir, out, experiment.restored_step)
  if not isinstance(getattr(model, "config", None), LMConfig):
    raise HFCheckpointError(f"{workdir}: export-hf exports LM runs, not this one.")
  flat = {path_str(path): np.asarray(v) for path, v in jax.tree_util.tree_flatten_with_path(
      nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]}
  tensors = to_hf(model.config, flat)
  source_path = Path(workdir) / "hf_config.json"
  source = json.loads(source_path.read_text()) if source_path.is_file() else None
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensors[name]
    size += nbytes
  shards.append(current)
  created = not out.exists()
  try:
    out.mkdir(parents=True, exist_ok=True)
    if len(shards) == 1:
      files = [SINGLE_NAME]
      write_file(out / SINGLE_NAME, shards[0], {"format": "np"})
    else:
      files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
      for file, shard in zip(files, shards, strict=True):
        write_file(out / file, shard, {"format": "np"})
      index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
               "weight_map": {n: f for f, s in zip(files, shards, strict=True) for n in s}}
      (out / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True))
    (out / "config.json").write_text(
        json.dumps(hf_config_json(model.config, source), indent=2, sort_keys=True))
    lngram = lngram_v2_export(model.config, flat)
    if lngram is not None:   # the Lngram v2 branches, under the authors' module's names
      write_file(out / memory_export.FILE, lngram[0], {"format": "pt"})
      (out / memory_export.CONFIG_FILE).write_text(json.dumps(lngram[1], indent=2))
      files.append(memory_export.FILE)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json"):
      if (Path(workdir) / name).is_file():
        shutil.copyfile(Path(workdir) / name, out / name)
  except BaseException:
    if created:
      shutil.rmtree(out, ignore_errors=True)
    raise
  return {"out": str(out), "files": files, "tensors": len(tensors),
          "step": int(experiment.restored_step)}
