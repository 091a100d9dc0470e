"""`init_from=hf:DIR`: an experiment config whose backbone is a Hugging Face checkpoint's.

    with_hf_backbone(config)   a copy whose model block describes the backbone
                               in DIR; the training run then copies its tensors
                               in (experiments/jobs/init_from.py)

DIR is a checkpoint directory or a hub id, `hf:Qwen/Qwen3-0.6B[@revision]`
(fetched into the Hugging Face cache, or found there: experiments/hf/hub.py);
the saved config keeps what was given.

Backbone shape fields of the experiment config (d_model, n_layers, n_heads,
n_kv_heads, head_dim, ffn_dim, vocab_size) are 0 ("from config.json") or must
equal config.json's, else the config is refused with the fields named; the
family options (RoPE, norms, biases, tied output) always come from
config.json (DESIGN.md §11). The memory and beside-FFN slots stay the
config's.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections

from experiments.hf.config import hf_lm_config, read_config_json
from experiments.hf.safetensors_io import HFCheckpointError
from experiments.models.config import LMConfig

HF_PREFIX = "hf:"
SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                "vocab_size")
FAMILY_FIELDS = ("rope_theta", "rope_scaling", "tie_embeddings", "norm_eps", "qkv_bias",
                 "qk_norm", "norm_scale_in_dtype")


def hf_source_of(init_from) -> str | None:
  """The DIR of `init_from=hf:DIR` as given (a directory or a hub id), else None."""
  text = str(init_from or "")
  return text[len(HF_PREFIX):] if text.startswith(HF_PREFIX) else None


def hf_dir_of(init_from) -> str | None:
  """The local checkpoint directory of `init_from=hf:DIR` (a hub id's snapshot in the
  Hugging Face cache, fetched if need be), else None."""
  source = hf_source_of(init_from)
  if source is None:
    return None
  from experiments.hf.hub import resolve_checkpoint
  return str(resolve_checkpoint(source))


def set_backbone(model_block, lm: LMConfig, *, check: bool) -> None:
  """Writes `lm`'s backbone into an experiment config's model block (in place);
  `check`: refuse nonzero shape fields that differ from `lm`'s, naming them."""
  if check:
    diffs = [f"model.{f}={model_block.get(f)!r} (config.json: {getattr(lm, f)!r})"
             for f in SHAPE_FIELDS if model_block.get(f) not in (0, None)
             and model_block.get(f) != getattr(lm, f)]
    if diffs:
      raise HFCheckpointError("the config contradicts the checkpoint's config.json: "
                              + "; ".join(diffs) + " (set them to 0 to take config.json's).")
  for field in SHAPE_FIELDS + FAMILY_FIELDS:
    model_block[field] = getattr(lm, field)
  if lm.moe_layers:   # Qwen3-MoE: its sparse layers and experts (config.json decides them)
    model_block["moe_layers"] = lm.moe_layers
    model_block["moe"] = {k: v for k, v in lm.moe.to_dict().items() if k != "d_model"}


def check_byte_data(init_from: str, hf_dir: str, vocab_size: int) -> None:
  """Refuses byte data (data.kind="bytes", the default) for a checkpoint whose ids are
  not bytes: one with its own tokenizer.json, or a vocabulary other than 256 (bytes
  would be read as the first 256 ids of a vocabulary that means something else)."""
  source = hf_source_of(init_from) or hf_dir
  tokens = ("prepare token data with it (lngram-exp prepare-data --tokenizer=" + source
            + " --input=... --out=DATA) and pass --config.data.kind=tokens "
            "--config.data.path=DATA")
  if (Path(hf_dir) / "tokenizer.json").is_file():
    raise HFCheckpointError(f"init_from={init_from}: the checkpoint has its own "
                            f"tokenizer.json ({vocab_size:,} ids) and this run reads byte "
                            f"data (data.kind=bytes, the default); {tokens}.")
  if vocab_size != 256:
    raise HFCheckpointError(f"init_from={init_from}: a vocabulary of {vocab_size} tokens "
                            "cannot read byte data (256 values); use data.kind=tokens with "
                            "the checkpoint's tokenizer.")


def with_hf_backbone(config):
  """A copy of `config` whose model block describes the `init_from=hf:DIR` backbone."""
  hf_dir = hf_dir_of(config.get("init_from", ""))
  if hf_dir is None:
    return config
  lm = hf_lm_config(read_config_json(hf_dir), dtype=config.model.get("dtype"),
                    param_dtype=config.model.get("param_dtype"))
  if config.get("data", {}).get("kind", "bytes") == "bytes":
    check_byte_data(config.init_from, hf_dir, lm.vocab_size)
  # A distinct lm_head.weight beside a tied config.json: untied, as the import reads it.
  from experiments.hf.load import untied_if_head_differs
  lm = untied_if_head_differs(lm, hf_dir)
  config = ml_collections.ConfigDict(config.to_dict())
  set_backbone(config.model, lm, check=True)
  return config
