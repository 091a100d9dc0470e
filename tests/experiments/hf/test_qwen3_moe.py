"""Qwen3-MoE checkpoints in our decoder == `transformers`' Qwen3MoeForCausalLM on the same files.

The checkpoint is made live by transformers (dev dependency, CPU torch), its
weights redrawn large as in tests/experiments/hf/conftest.py, and saved with
`save_pretrained` (per-expert tensor names, as on the Hub). Layer 1 is dense
through `mlp_only_layers`; `decoder_sparse_step` is checked on the config alone.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.hf import load_hf, qwen3_moe
from experiments.hf.config import hf_lm_config
from experiments.hf.safetensors_io import HFCheckpointError, write_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# 3 layers, layer 1 dense (mlp_only_layers), 6 experts of width 16, top-2, renormalised
# gates, untied embeddings; q/k norms as every Qwen3.
CONFIG = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
              decoder_sparse_step=1, tie_word_embeddings=False, rope_theta=10000.0,
              rms_norm_eps=1e-6, max_position_embeddings=64, router_aux_loss_coef=0.001)
TOKENS_BxT = np.random.default_rng(0).integers(3, 96, (2, 12))


def _hf_model(**changes):
  config = transformers.Qwen3MoeConfig(**(CONFIG | changes), attn_implementation="eager",
                                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
  torch.manual_seed(0)
  model = transformers.Qwen3MoeForCausalLM(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.uniform_(0.5, 1.5)
      elif "embed_tokens" in name:
        p.normal_(0.0, 1.0)
      else:   # 2-D [out, in] and the fused 3-D experts [E, out, in]
        p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
  return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  model = _hf_model()
  path = tmp_path_factory.mktemp("qwen3_moe")
  model.save_pretrained(path, max_shard_size="40KB")
  return path, model


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, tokens_BxT):
  return nnx.merge(graphdef, state)(tokens_BxT)


def our_logits(model, tokens_BxT=TOKENS_BxT):
  # One compiled forward for every model of this file (eager runs op by op: slower here).
  return _logits(*nnx.split(model), jnp.asarray(tokens_BxT))


def hf_logits(model, tokens_BxT):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(tokens_BxT))).logits.float().numpy()


def assert_logits_close(got, want):
  # As the dense families' parity test: float32, weights drawn large, ~1e-6 of the scale.
  scale = float(np.abs(want).max())
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5 * scale)


def test_config_mapping(checkpoint):
  path, _ = checkpoint
  hf = json.loads((path / "config.json").read_text())
  assert "num_local_experts" in hf   # what transformers 5 writes for num_experts
  config = hf_lm_config(hf)
  assert config.moe_layers == (0, 2) and config.ffn_dim == 48 and config.qk_norm
  moe = config.moe
  assert (moe.n_experts, moe.top_k, moe.expert_ffn_dim, moe.n_shared_experts) == (6, 2, 16, 0)
  # transformers' balance loss is k times ours: the same weight is coef · k.
  assert moe.norm_topk_prob and moe.router == "softmax" and moe.balance_coef == 0.002
  # init_from=hf:DIR: the run's model block takes the sparse layers and experts too.
  from experiments.configs import load_config
  from experiments.hf.backbone import with_hf_backbone
  from experiments.models.config import lm_config
  run = load_config("experiments/configs/lm_baseline.py:smoke")
  run.data.update(kind="tokens", path="unused")
  run.model.update(d_model=0, n_layers=0, n_heads=0, n_kv_heads=0, head_dim=0, ffn_dim=0)
  run.init_from = f"hf:{path}"
  resolved = lm_config(with_hf_backbone(run))
  assert resolved.moe_layers == (0, 2) and resolved.moe == moe
  # decoder_sparse_step: 1-based layer index divisible by the step; Hub files say num_experts.
  step2 = dict(hf, decoder_sparse_step=2, mlp_only_layers=[], num_experts=6)
  del step2["num_local_experts"]
  assert qwen3_moe.moe_layers(step2) == (1,)
  with pytest.raises(HFCheckpointError, match="mlp_only_layers has"):
    qwen3_moe.moe_layers(dict(hf, mlp_only_layers=[7]))


def test_logits_equal_transformers(checkpoint):
  path, hf = checkpoint
  names = {n for n in json.loads((path / "model.safetensors.index.json").read_text())[
      "weight_map"]}
  assert "model.layers.0.mlp.experts.5.down_proj.weight" in names   # the Hub's layout
  model, config = load_hf(path)
  got = our_logits(model)
  assert got.dtype == jnp.float32 and got.shape == (2, 12, 96)
  want = hf_logits(hf, TOKENS_BxT)
  assert_logits_close(got, want)
  # The comparison can fail: two experts swapped in one layer move the logits by O(1).
  w = model.blocks[2].mlp.w_up
  w[...] = w[...][::-1]
  assert np.abs(np.asarray(our_logits(model)) - want).max() > 1e-2 * np.abs(want).max()


def test_greedy_generation_with_cache_equals_transformers(checkpoint, greedy_both):
  """Decode through the KV cache routes each new token alone: its experts must be the ones
  transformers picks for it (an argmax tie could differ; drawn large, none occurs here)."""
  path, hf = checkpoint
  model, _ = load_hf(path)
  got, want = greedy_both(model, hf, TOKENS_BxT[:, :6], 12)
  np.testing.assert_array_equal(got, want)
  assert len(set(want.ravel().tolist())) > 3     # not one token repeated: a real check
  assert len(set(want.ravel().tolist())) > 3     # not one token repeated: a real check


def test_fused_expert_tensors_load_the_same(checkpoint, tmp_path):
  """transformers 5's in-memory layout (experts.gate_up_proj / down_proj) reads equally."""
  path, hf = checkpoint
  tensors = {n: p.detach().numpy() for n, p in hf.state_dict().items()}
  fused = {n: v for n, v in tensors.items() if ".experts." in n}
  assert {n.rsplit(".", 1)[-1] for n in fused} == {"gate_up_proj", "down_proj"}
  write_file(tmp_path / "model.safetensors", tensors, {"format": "pt"})
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  assert qwen3_moe.layout_of(tensors) == "fused"
  model, _ = load_hf(tmp_path)
  assert_logits_close(our_logits(model), hf_logits(hf, TOKENS_BxT))


def test_import_hf_cli_and_export_round_trip(checkpoint, tmp_path):
  """`lngram-exp import-hf` writes a run; `export-hf` of it gives the checkpoint's tensors
  bit for bit (so the run holds exactly the parameters `load_hf` builds), and
  transformers reads the exported config.json."""
  from experiments import cli
  from experiments.hf.safetensors_io import Checkpoint

  path, hf = checkpoint
  run = tmp_path / "run"
  assert cli.run_main(["lngram-exp", "import-hf", f"--hf_dir={path}", f"--workdir={run}"]) == 0
  out = tmp_path / "export"
  assert cli.run_main(["lngram-exp", "export-hf", f"--workdir={run}", f"--out={out}"]) == 0
  exported, source = Checkpoint(out), Checkpoint(path)
  assert exported.names() == source.names()
  for name in sorted(source.names()):
    np.testing.assert_array_equal(exported.tensor(name), source.tensor(name), err_msg=name)
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == "qwen3_moe" and config["mlp_only_layers"] == [1]
  reloaded = transformers.Qwen3MoeForCausalLM.from_pretrained(out).eval()
  # Same tensors; transformers may pick another experts kernel on load (last-bit changes).
  assert_logits_close(hf_logits(reloaded, TOKENS_BxT), hf_logits(hf, TOKENS_BxT))
