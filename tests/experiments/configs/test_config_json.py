"""Every model config's JSON form (one helper, lngram_jax.dataclass_json).

Checkpoints store `to_dict()` as JSON and rebuild the model from it alone:
what runs saved before must load unchanged and be written back key for key.
"""

import json

import pytest

from experiments.models.arms.engram import EngramConfig
from experiments.models.config import LMConfig
from experiments.vlm.tiny.config import VLMConfig
from pvm_jax import PVMConfig

# json.dumps(VLMConfig.to_dict()) as written before the shared helper: an LM
# with an Engram arm in its memory slot, and a PVM branch config.
SAVED_VLM = (
    '{"lm": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, '
    '"ffn_dim": 64, "max_len": 64, "vocab_size": 256, "rope_theta": 10000.0, '
    '"tie_embeddings": true, "dtype": "float32", "param_dtype": "float32", "remat": false, '
    '"memory_layers": [1], "memory": {"kind": "engram", "d_model": 32, "orders": [2, 3], '
    '"heads": 2, "head_dim": 4, "table_base": 31, "vocab_size": 256, "case_fold": true, '
    '"hash_seed": 0, "conv_kernel": 4, "zero_init": false, "eps": 1e-06, "init_std": 0.02, '
    '"table_init_std": 0.02, "dtype": "float32", "param_dtype": "float32"}, '
    '"ffn_branch_layers": [], "ffn_branch": null, "norm_eps": 1e-06, "init_std": 0.02}, '
    '"image_hw": [32, 32], "patch_size": 16, "vit_dim": 64, "vit_layers": 2, "vit_heads": 2, '
    '"vit_ffn": 128, "visual_pos": false, "branch": "pvm", "branch_layers": [0], '
    '"pvm": {"d_model": 32, "latent_dim": 16, "head_dim": 8, "backbone_gqa_ratio": 1, '
    '"backbone_ffn_dim": 64, "latent_ffn_dim": null, "visual_dim": null, "eps": 1e-06, '
    '"dtype": "float32", "param_dtype": "float32", "init_std": 0.02, "up_init": "normal"}, '
    '"pvm_source": "raw", "mlp_dim": null}')



def test_saved_vlm_json_with_an_arm_and_pvm_loads_and_is_written_back():
  config = VLMConfig.from_dict(json.loads(SAVED_VLM))
  assert isinstance(config.lm.memory, EngramConfig) and config.lm.memory.orders == (2, 3)
  assert type(config.pvm) is PVMConfig and config.image_hw == (32, 32)
  assert json.dumps(config.to_dict()) == SAVED_VLM
  decoder = config.decoder   # PVM in the beside-FFN slot, written with its kind
  assert decoder.to_dict()["ffn_branch"]["kind"] == "pvm"
  assert LMConfig.from_dict(json.loads(json.dumps(decoder.to_dict()))) == decoder


def _with_typo(where):
  d = json.loads(SAVED_VLM)
  {"vlm": d, "pvm": d["pvm"], "lm": d["lm"], "arm": d["lm"]["memory"]}[where]["typo_field"] = 1
  return d


@pytest.mark.parametrize("where, load", [
    ("vlm", VLMConfig.from_dict),
    ("pvm", lambda d: PVMConfig.from_dict(d["pvm"])),
    ("lm", lambda d: LMConfig.from_dict(d["lm"])),
    ("arm", lambda d: LMConfig.from_dict(d["lm"])),
])
def test_unknown_fields_are_refused_by_every_config(where, load):
  with pytest.raises(ValueError, match=r"unknown fields \['typo_field'\]"):
    load(_with_typo(where))


@pytest.mark.parametrize("make", [
    lambda: PVMConfig(d_model=32, latent_dim=16, head_dim=8, latent_ffn_dim=8,
                      param_dtype="int8"),
    lambda: EngramConfig(d_model=16, dtype="int32"),
    lambda: LMConfig(dtype="int32"),
], ids=["pvm", "engram", "lm"])
def test_an_integer_dtype_is_refused_up_front(make):
  """dtype=int32 used to fail only at call time, deep inside jax."""
  with pytest.raises(ValueError, match=r"dtype='int(32|8)' is not one of"):
    make()
