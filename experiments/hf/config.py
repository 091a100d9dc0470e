"""A Hugging Face `config.json` (Qwen3, Qwen3-MoE, Llama, Qwen2) as the backbone fields of an `LMConfig`.

transformers 5 writes the RoPE options as `rope_parameters` ({"rope_type",
"rope_theta", ...}); older files as `rope_theta` + `rope_scaling`. Both are
read. Options the decoder does not implement (sliding windows, an output
bias, an MLP bias, an activation other than SiLU) are refused rather than
approximated, so a loaded model either computes the checkpoint's function or
does not load. Mapping and deviations: DESIGN.md §11.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from experiments.hf import qwen3_moe
from experiments.hf.safetensors_io import HFCheckpointError
from experiments.models.config import LMConfig
from experiments.models.moe import MoEConfig

# model_type -> the architecture it must name, and whether q/k/v carry biases.
# The name under which a run imported from a checkpoint keeps its config.json (export-hf
# starts from it; a run's tokenizer codec reads its EOS ids from it).
HF_CONFIG_COPY = "hf_config.json"
SUPPORTED = {"qwen3": ("Qwen3ForCausalLM", False),
             "llama": ("LlamaForCausalLM", False),
             "qwen2": ("Qwen2ForCausalLM", True),
             qwen3_moe.MODEL_TYPE: (qwen3_moe.ARCHITECTURE, False)}
# Families with per-head q/k RMSNorms.
QK_NORM = ("qwen3", qwen3_moe.MODEL_TYPE)
_DTYPES = ("float32", "bfloat16", "float16", "float64")
# The LMConfig fields a config.json decides; an experiment config may not contradict them.
BACKBONE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                   "ffn_dim", "rope_theta", "rope_scaling", "tie_embeddings", "norm_eps",
                   "qkv_bias", "qk_norm", "norm_scale_in_dtype", "moe_layers", "moe")


@contextlib.contextmanager
def config_json_errors():
  """Turns a missing field (KeyError) or a value the config refuses (ValueError) inside the
  block into a one-line HFCheckpointError that names config.json."""
  try:
    yield
  except HFCheckpointError:
    raise
  except KeyError as e:
    raise HFCheckpointError(f"config.json: missing field {e.args[0]!r}.") from None
  except ValueError as e:
    raise HFCheckpointError(f"config.json: {e}") from None


def read_config_json(hf_dir) -> dict:
  path = Path(hf_dir) / "config.json"
  if not Path(hf_dir).is_dir():
    raise HFCheckpointError(f"{hf_dir}: not a directory.")
  if not path.is_file():
    raise HFCheckpointError(f"{hf_dir}: no config.json (not a Hugging Face checkpoint "
                            "directory).")
  return read_json_object(path)


def read_json_object(path) -> dict:
  """A checkpoint's JSON file that must hold an object (config.json, tokenizer_config.json,
  ...); HFCheckpointError (a ValueError) naming the file otherwise."""
  path = Path(path)
  try:
    value = json.loads(path.read_text())
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise HFCheckpointError(f"{path}: not valid JSON ({' '.join(str(e).split())}).") from None
  if not isinstance(value, dict):
    raise HFCheckpointError(f"{path}: not a JSON object.")
  return value


def _rope(hf: dict) -> tuple[float, tuple]:
  params = dict(hf.get("rope_parameters") or {})
  scaling = dict(hf.get("rope_scaling") or {})
  theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
  params = params or scaling
  kind = params.get("rope_type", params.get("type", "default"))
  if kind == "default":
    return theta, ()
  if kind != "llama3":
    raise HFCheckpointError(f"config.json: rope type {kind!r} is not supported "
                            "(supported: 'default', 'llama3').")
  keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
  missing = [k for k in keys if k not in params]
  if missing:
    raise HFCheckpointError(f"config.json: llama3 rope scaling lacks {missing}.")
  # transformers wants the original length as an int; the factors are floats.
  return theta, (("rope_type", "llama3"), *((k, float(params[k])) for k in keys[:3]),
                 (keys[3], int(params[keys[3]])))


def checkpoint_dtype(hf: dict) -> str:
  name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
  if name not in _DTYPES:
    raise HFCheckpointError(f"config.json: dtype {name!r} cannot be held "
                            f"(supported: {list(_DTYPES)}).")
  return name


def hf_lm_config(hf: dict, *, dtype=None, param_dtype=None, max_len=None) -> LMConfig:
  """The LMConfig of a Hugging Face causal-LM config dict (no memory branches).

  dtype, param_dtype default to the checkpoint's dtype; max_len to
  max_position_embeddings.
  """
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED:
    raise HFCheckpointError(f"config.json: model_type {model_type!r} is not supported "
                            f"(supported: {sorted(SUPPORTED)}).")
  arch, qkv_bias = SUPPORTED[model_type]
  archs = hf.get("architectures") or [arch]
  if archs != [arch]:
    raise HFCheckpointError(f"config.json: architectures {archs} is not supported for "
                            f"model_type {model_type!r} (supported: [{arch!r}]).")
  refused = [name for name, bad in (
      ("attention_bias", bool(hf.get("attention_bias")) and not qkv_bias),
      ("mlp_bias", bool(hf.get("mlp_bias"))),
      ("use_sliding_window", bool(hf.get("use_sliding_window"))),
      ("hidden_act", hf.get("hidden_act", "silu") != "silu")) if bad]
  if refused:
    raise HFCheckpointError(f"config.json: {', '.join(f'{k}={hf.get(k)!r}' for k in refused)}"
                            " not supported by the decoder.")
  with config_json_errors():
    n_heads = int(hf["num_attention_heads"])
    d_model = int(hf["hidden_size"])
    theta, scaling = _rope(hf)
    held = checkpoint_dtype(hf)
    moe = {}
    if model_type == qwen3_moe.MODEL_TYPE:   # Qwen3-MoE: sparse layers by its own rule
      layers = qwen3_moe.moe_layers(hf)
      moe = dict(moe_layers=layers, moe=MoEConfig(**qwen3_moe.moe_fields(hf)) if layers
                 else None)
    return LMConfig(
        vocab_size=int(hf["vocab_size"]), d_model=d_model,
        n_layers=int(hf["num_hidden_layers"]), n_heads=n_heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
        head_dim=int(hf.get("head_dim") or d_model // n_heads),
        ffn_dim=int(hf["intermediate_size"]),
        max_len=int(max_len or hf.get("max_position_embeddings", 2048)),
        rope_theta=theta, rope_scaling=scaling,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        init_std=float(hf.get("initializer_range", 0.02)),
        qkv_bias=qkv_bias, qk_norm=model_type in QK_NORM, norm_scale_in_dtype=True,
        dtype=dtype or held, param_dtype=param_dtype or held, **moe)


def check_matches(hf_config: LMConfig, config: LMConfig) -> None:
  """Refuses a run config whose backbone fields contradict the checkpoint's."""
  diffs = [f"{name}={getattr(config, name)!r} (config.json: {getattr(hf_config, name)!r})"
           for name in BACKBONE_FIELDS if getattr(config, name) != getattr(hf_config, name)]
  if diffs:
    raise HFCheckpointError("the model config contradicts the checkpoint's config.json: "
                            + "; ".join(diffs) + ".")
