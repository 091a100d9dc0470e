"""Every family's name table read both ways: import and export are inverse, bit for bit.

One table per family ({our path: Row}, experiments/hf/names.py) gives the
import targets, the shapes a checkpoint holds and the export. Here, for each
(the dense decoders, Qwen3-MoE in its three expert layouts, Qwen3-VL, the PVM and
Lngram v2 branches): the targets' keys are the table's, their sources are
the shapes' names; random arrays of the table's shapes go through the import
and back through the export unchanged (names, dtype, bytes); the import makes
exactly the model's parameters at their shapes, and random parameters of those
shapes go through the export and back unchanged.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.hf import qwen3_moe
from experiments.hf.memory_export import lngram_v2_table, module_tensors
from experiments.hf.names import hf_shapes, lm_table, param_targets, to_hf
from experiments.hf.pvm_format import pvm_table, pvm_targets, pvm_to_hf
from experiments.hf.qwen3vl.load import qwen3vl_config
from experiments.hf.qwen3vl.names import qwen3vl_shapes, qwen3vl_table, qwen3vl_targets
from experiments.hf.tables import table_shapes, table_targets, table_to_hf
from experiments.models.config import LMConfig
from experiments.models.lm import DecoderLM
from experiments.models.moe import MoEConfig
from experiments.trainer.optimizer import path_str

# Every width differs (Hq·Dh = 48, Hkv·Dh = 24, D = 32, F = 40), so a row with a wrong
# shape or axis order cannot pass by symmetry.
BASE = dict(d_model=32, ffn_dim=40, n_heads=4, n_kv_heads=2, head_dim=12, n_layers=3,
            vocab_size=56, max_len=32)
MOE = MoEConfig(d_model=32, n_experts=5, top_k=2, expert_ffn_dim=12, norm_topk_prob=True)
LM = {"llama": LMConfig(**BASE, tie_embeddings=False),
      "qwen2": LMConfig(**BASE, qkv_bias=True, tie_embeddings=False),
      "qwen3": LMConfig(**BASE, qk_norm=True, tie_embeddings=True),
      "qwen3_moe": LMConfig(**BASE, qk_norm=True, tie_embeddings=False, moe_layers=(0, 2),
                            moe=MOE)}
VL_TEXT = dict(vocab_size=60, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=12,
               max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
               rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                    mrope_section=[2, 2, 2], mrope_interleaved=True),
               pvm_layers=[0, 2], pvm_hidden_size=24)
VL = dict(model_type="qwen3_vl", architectures=["Qwen3VLForConditionalGeneration"],
          text_config=VL_TEXT, image_token_id=55, video_token_id=56, vision_start_token_id=57,
          vision_end_token_id=58, tie_word_embeddings=False,
          vision_config=dict(depth=2, hidden_size=16, intermediate_size=24, num_heads=2,
                             patch_size=2, temporal_patch_size=2, spatial_merge_size=2,
                             in_channels=3, out_hidden_size=32, num_position_embeddings=16,
                             deepstack_visual_indexes=[0, 1]))


def _lngram():
  from experiments.configs import load_config
  from experiments.models.config import lm_config
  return lm_config(load_config("lm_lngram.py:smoke"))


def _random(shapes: dict, seed: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


def _param_shapes(build) -> dict[str, tuple[int, ...]]:
  """{path: shape} of every parameter of the model `build()` makes (shape-only)."""
  state = nnx.state(nnx.eval_shape(build), nnx.Param)
  return {path_str(p): tuple(v.shape) for p, v in
          jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(state))[0]}


def _same_bits(got: dict, want: dict) -> None:
  assert set(got) == set(want)
  for name, a in want.items():
    b = np.asarray(got[name])
    assert (b.shape, b.dtype) == (a.shape, a.dtype), name
    assert b.tobytes() == np.ascontiguousarray(a).tobytes(), name


def _tables():
  """(family, table, the model's parameter shapes the table must cover, or None)."""
  for family, c in LM.items():
    params = _param_shapes(lambda c=c: DecoderLM(c, rngs=nnx.Rngs(0)))
    yield family, lm_table(c), params
    if c.moe_layers:
      yield family + "/fused", lm_table(c, "fused"), params
      yield family + "/fused_in_out", lm_table(c, "fused_in_out"), params
  vl = qwen3vl_config(VL)
  from experiments.vlm.qwen3vl.model import Qwen3VL
  params = _param_shapes(lambda: Qwen3VL(vl, rngs=nnx.Rngs(0)))
  yield "qwen3_vl", qwen3vl_table(vl), {p: s for p, s in params.items()
                                        if "/ffn_branch/" not in p}
  yield "pvm", pvm_table(vl.text, "lm/"), {p: s for p, s in params.items()
                                           if "/ffn_branch/" in p}
  lm = _lngram()
  params = _param_shapes(lambda: DecoderLM(lm, rngs=nnx.Rngs(0)))
  yield "lngram_v2", lngram_v2_table(lm), {p: s for p, s in params.items()
                                           if p.split("/")[2:3] == ["memory"]}


FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_moe/fused", "qwen3_moe/fused_in_out",
            "qwen3_vl", "pvm", "lngram_v2")


@pytest.fixture(scope="module")
def tables():
  out = {family: (table, params) for family, table, params in _tables()}
  assert tuple(out) == FAMILIES
  return out


@pytest.mark.parametrize("family", FAMILIES)
def test_import_and_export_are_one_table_read_both_ways(tables, family):
  table, params = tables[family]
  targets, shapes = table_targets(table), table_shapes(table)
  assert set(targets) == set(table)
  assert {name for t in targets.values() for name in t.sources} == set(shapes)
  theirs = _random(shapes, seed=0)
  ours = {path: t.build(*(theirs[s] for s in t.sources)) for path, t in targets.items()}
  # The import makes exactly the model's parameters, at their shapes.
  assert {path: np.shape(a) for path, a in ours.items()} == params
  _same_bits(table_to_hf(table, ours), theirs)          # HF -> ours -> HF
  drawn = _random(params, seed=1)                         # ours -> HF -> ours
  exported = table_to_hf(table, drawn)
  _same_bits({path: t.build(*(exported[s] for s in t.sources))
              for path, t in targets.items()}, drawn)


def test_the_public_functions_are_the_tables(tables):
  for family, c in LM.items():
    assert hf_shapes(c) == table_shapes(lm_table(c))
    assert set(param_targets(c)) == set(lm_table(c))
    params = _random(tables[family][1], 2)
    _same_bits(to_hf(c, params), table_to_hf(lm_table(c), params))
  c = LM["qwen3_moe"]
  for layout in qwen3_moe.LAYOUTS:
    assert hf_shapes(c, layout) == table_shapes(lm_table(c, layout))
    layer = qwen3_moe.layer_shapes(c, 2, layout)
    assert layer == {k: v for k, v in hf_shapes(c, layout).items()
                     if k.startswith("model.layers.2.mlp.")}
  with pytest.raises(ValueError, match="layout='bogus'"):
    lm_table(c, "bogus")
  vl = qwen3vl_config(VL)
  assert qwen3vl_shapes(vl) == table_shapes(qwen3vl_table(vl))
  assert set(qwen3vl_targets(vl)) == set(qwen3vl_table(vl))
  assert all(n.startswith(("model.language_model.", "model.visual.", "lm_head."))
             for n in qwen3vl_shapes(vl))
  assert set(pvm_targets(vl.text, "lm/")) == set(pvm_table(vl.text, "lm/"))
  flat = _random(tables["pvm"][1], 3)
  _same_bits(pvm_to_hf(vl.text, flat, "lm/"), table_to_hf(pvm_table(vl.text, "lm/"), flat))
  lm = _lngram()
  layer = lm.memory_layers[0]
  prefix = f"blocks/{layer}/memory/"
  flat = _random(tables["lngram_v2"][1], 4)
  module = module_tensors(lm.memory, {k[len(prefix):]: v for k, v in flat.items()
                                      if k.startswith(prefix)})
  whole = table_to_hf(lngram_v2_table(lm), flat)
  _same_bits(module, {k[len(f"model.layers.{layer}.lngram."):]: v for k, v in whole.items()
                      if k.startswith(f"model.layers.{layer}.lngram.")})
