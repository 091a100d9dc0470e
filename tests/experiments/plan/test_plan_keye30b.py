"""`hf_lngram.py:keye30b`: Qwen3-VL-30B-A3B's decoder as the importer reads it, Table 13's
Keye30B Lngram (595M parameters), and a plan of its mesh at tiny widths on host CPUs."""

import ast
import json

import pytest

from experiments.configs import load_config
from experiments.hf.config import BACKBONE_FIELDS
from experiments.hf.qwen3vl.load import qwen3vl_config
from experiments.hf.safetensors_io import HFCheckpointError
from experiments.models.config import lm_config
from experiments.models.counts import param_count
from experiments.plan.report import plan_run
from experiments.tools.bench.tpu_plans import KEYE30B, KEYE30B_MESH, keye30b_depth
from experiments.trainer.placement import parse_mesh

# Qwen3-VL-30B-A3B's config.json: the fields the importer reads.
TEXT = dict(model_type="qwen3_vl_moe_text", hidden_size=2048, intermediate_size=6144,
            num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
            head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
            decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936, rms_norm_eps=1e-6,
            max_position_embeddings=262144, router_aux_loss_coef=0.001, dtype="bfloat16",
            rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20],
                          "mrope_interleaved": True}, rope_theta=5000000)
VISION = dict(model_type="qwen3_vl_moe", depth=27, hidden_size=1152, num_heads=16,
              intermediate_size=4304, patch_size=16, temporal_patch_size=2,
              spatial_merge_size=2, in_channels=3, out_hidden_size=2048,
              num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24])
CONFIG_JSON = dict(model_type="qwen3_vl_moe", architectures=["Qwen3VLMoeForConditionalGeneration"],
                   tie_word_embeddings=False, text_config=TEXT, vision_config=VISION,
                   image_token_id=151655, video_token_id=151656,
                   vision_start_token_id=151652, vision_end_token_id=151653)

def test_keye30b_is_the_imported_decoder_with_table_13s_lngram():
  config = load_config(KEYE30B)
  lm = lm_config(config)
  hf = qwen3vl_config(CONFIG_JSON).text
  for field in BACKBONE_FIELDS:
    ours, theirs = getattr(lm, field), getattr(hf, field)
    if field == "moe":   # the capacity is ours (the config's docstring)
      ours, theirs = ours.replace(capacity_factor=0.0), theirs.replace(d_model=lm.d_model)
    assert ours == theirs, field
  assert hf.mrope_interleaved and not lm.mrope_section   # text only: 1-D RoPE, same theta
  assert lm.memory_layers == (1, 23) and lm.moe.capacity_factor == 1.25
  m = lm.memory
  assert (m.routes, m.mem_dim, m.readout, m.route_chunk) == (256, 256, "streaming", 64)
  assert param_count(lm)["memory"] == pytest.approx(595e6, rel=2e-3)   # the paper's 595M
  assert (config.data.seq_len, config.data.batch_size, config.train.steps) == (32768, 32, 5000)
  assert (config.plan_devices, dict(config.mesh)) == (
      64, {**dict(config.mesh), **parse_mesh(KEYE30B_MESH)})
  assert lm.remat and config.model.dtype == "bfloat16"
  with pytest.raises(ValueError, match="keye2b and keye30b do not combine"):
    load_config("experiments/configs/hf_lngram.py:keye2b,keye30b")

def test_the_lm_path_refuses_a_qwen3_vl_moe_checkpoint(tmp_path):
  """init_from=hf:DIR reads Qwen3 / Qwen3-MoE / Llama / Qwen2 only (the docstring says so)."""

  from experiments.hf.backbone import with_hf_backbone
  (tmp_path / "config.json").write_text(json.dumps(CONFIG_JSON))
  config = load_config(KEYE30B)
  config.init_from = f"hf:{tmp_path}"
  with pytest.raises(HFCheckpointError, match="model_type 'qwen3_vl_moe' is not supported"):
    with_hf_backbone(config)

def test_keye30b_plans_on_its_mesh_at_tiny_widths():
  """The recipe's structure (every layer MoE with capacity, Lngram at the 2nd and last of
  4 layers, routes over table, rows over expert x fsdp) compiled on 8 host CPUs."""
  config = load_config(KEYE30B)
  for key, value in keye30b_depth(4):
    config.model[key.split(".")[1]] = ast.literal_eval(value)
  config.model.update(d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, vocab_size=256,
                      max_len=64)
  config.model.moe.update(n_experts=8, expert_ffn_dim=32)
  config.model.memory.update(routes=8, mem_dim=16, q_heads=2, kv_heads=1, head_dim=16,
                             route_chunk=4)
  config.data.update(seq_len=64, batch_size=4)
  r = plan_run(config, {"expert": 2, "fsdp": 2, "table": 2})
  assert r["devices"] == 8 and r["params"]["count"] == r["params"]["formula"]["total"]
  assert r["collectives"]["all-to-all"] > 0   # the experts' exchange


def test_the_experts_rest_over_fsdp_too():
  """Each device of expert=8 x fsdp=4 keeps a quarter of its 16 experts' widths (the
  exchange's shard_map gathers them); without fsdp whole experts, as before."""
  from jax.sharding import AbstractMesh
  from jax.sharding import PartitionSpec as P

  from experiments.models.layout import _experts_spec
  from experiments.trainer.placement import AXES
  mesh = AbstractMesh((1, 4, 1, 2, 8), AXES)
  assert _experts_spec((128, 2048, 768), mesh) == P("expert", "fsdp", None)   # w_gate, w_up
  assert _experts_spec((128, 768, 2048), mesh) == P("expert", None, "fsdp")   # w_down
  assert _experts_spec((128, 2048, 768), AbstractMesh((1, 1, 1, 1, 8), AXES)) == P(
      "expert", None, None)
