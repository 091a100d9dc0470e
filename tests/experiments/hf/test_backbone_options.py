"""The pretrained-family options of the one decoder: off by default, no random draws, JSON."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.models import DecoderLM, LMConfig
from experiments.models.layers import rope_inv_freq
from experiments.trainer.optimizer import path_str

BASE = LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, ffn_dim=48,
                max_len=32)
LLAMA3 = (("rope_type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0),
          ("high_freq_factor", 4.0), ("original_max_position_embeddings", 16))


def flat(model):
  return {path_str(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(
      nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]}


def test_options_add_parameters_but_draw_the_same_weights():
  plain = flat(DecoderLM(BASE, rngs=nnx.Rngs(3)))
  config = BASE.replace(qk_norm=True, qkv_bias=True, rope_scaling=LLAMA3,
                        norm_scale_in_dtype=True)
  full = flat(DecoderLM(config, rngs=nnx.Rngs(3)))
  assert set(full) - set(plain) == {f"blocks/{i}/attn/{n}" for i in range(2) for n in
                                    ("b_q", "b_kv", "q_norm/scale", "k_norm/scale")}
  for name, value in plain.items():
    np.testing.assert_array_equal(full[name], value, err_msg=name)


def test_default_json_has_no_new_fields_and_options_round_trip():
  assert not {"qk_norm", "qkv_bias", "rope_scaling", "norm_scale_in_dtype"} & set(
      BASE.to_dict())
  config = BASE.replace(qk_norm=True, rope_scaling=LLAMA3)
  again = LMConfig.from_dict(json.loads(json.dumps(config.to_dict())))
  assert again == config and again.rope_scaling == LLAMA3
  hash(again)   # frozen configs stay hashable (tuples, not dicts)


def test_llama3_scaling_keeps_high_slows_low_and_blends_between():
  plain = rope_inv_freq(16, 500000.0)
  scaled = rope_inv_freq(16, 500000.0, dict(LLAMA3))
  wavelen = 2 * np.pi / plain
  high, low = wavelen < 16 / 4, wavelen > 16 / 1
  np.testing.assert_array_equal(scaled[high], plain[high])
  np.testing.assert_allclose(scaled[low], plain[low] / 8.0, rtol=1e-6)
  mid = ~high & ~low
  assert mid.any() and np.all((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 8))


@pytest.mark.parametrize("scaling, match", [
    ((("rope_type", "yarn"), ("factor", 2.0)), "'yarn' is not supported"),
    ((("rope_type", "llama3"),), "not usable"),
    ("llama3", "must be \\(\\) or \\(name, value\\) pairs"),
])
def test_bad_rope_scaling_is_refused(scaling, match):
  with pytest.raises(ValueError, match=match):
    BASE.replace(rope_scaling=scaling)
