"""Tiny random Hugging Face checkpoints, made by `transformers` itself in the test run.

The reference numbers of tests/experiments/hf/ come live from `transformers`
(a dev dependency, with the CPU build of torch): each family's model is
built from a small config, its weights redrawn large (HF's default std 0.02
gives near-uniform logits that would hide a wrong transpose or a missing
norm), and saved sharded with `save_pretrained`.
"""

from __future__ import annotations

import pytest

FAMILIES = {
    # Qwen3: per-head q/k norms, head_dim != hidden / heads, tied embeddings; 256 tokens
    # so that byte data can train it (init_from=hf:DIR).
    "qwen3": dict(model_type="qwen3", vocab_size=256, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                  intermediate_size=112, tie_word_embeddings=True, rope_theta=1e6,
                  rms_norm_eps=1e-6, max_position_embeddings=64),
    # Llama 3: llama3 rope scaling (an original length this short rescales most
    # frequencies), untied embeddings, 4 query heads on one KV head.
    "llama": dict(model_type="llama", vocab_size=96, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, intermediate_size=128,
                  tie_word_embeddings=False, rms_norm_eps=1e-5, max_position_embeddings=64,
                  rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0,
                                    original_max_position_embeddings=16)),
    # Qwen2: q/k/v biases, untied.
    "qwen2": dict(model_type="qwen2", vocab_size=96, hidden_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=80,
                  tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6,
                  max_position_embeddings=64),
}


def hf_model(family: str, seed: int = 0):
  """A transformers *ForCausalLM of `family`, float32, eager attention, weights redrawn."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  kw = dict(FAMILIES[family])
  kind = kw.pop("model_type")
  cls = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
         "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
         "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
  config = cls[0](**kw, attn_implementation="eager", pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
  torch.manual_seed(seed)
  model = cls[1](config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.uniform_(0.5, 1.5)
      elif p.ndim == 1:
        p.normal_(0.0, 0.5)
      elif "embed_tokens" in name:
        p.normal_(0.0, 1.0)
      else:
        p.normal_(0.0, 1.5 / p.shape[1] ** 0.5)
  return model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
  """{family: (directory, the transformers model)}, each saved in several shards."""
  out = {}
  for family in FAMILIES:
    model = hf_model(family)
    path = tmp_path_factory.mktemp(f"hf_{family}")
    model.save_pretrained(path, max_shard_size="40KB")
    out[family] = (path, model)
  return out


@pytest.fixture
def greedy_both():
  """greedy_both(ours, hf, prompt_BxT, n) -> (ours, transformers') n greedy tokens after
  the prompt, ours decoded through the KV cache, as int arrays [B, n]."""
  torch = pytest.importorskip("torch")
  import jax
  import jax.numpy as jnp
  import numpy as np

  from experiments.models import generate

  def run(model, hf, prompt_BxT, n: int):
    with torch.no_grad():
      want = hf.generate(torch.tensor(prompt_BxT), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, pad_token_id=0).numpy()[:, prompt_BxT.shape[1]:]
    got = generate(model, jnp.asarray(prompt_BxT), max_new_tokens=n, rng=jax.random.key(0),
                   greedy=True, use_cache=True)
    return np.asarray(got), want
  return run


# Qwen3-VL-MoE: test_qwen3vl_parity.py's Qwen3-VL (two ViT layers, two DeepStack
# mergers, a 3-layer decoder with interleaved MRoPE) with Qwen3-MoE FFNs: layer 1 dense
# (mlp_only_layers), 5 experts of width 24 (2h = 48 is not D = 64: both fused expert
# layouts are told apart), top-2, untied output.
QWEN3VL_MOE_TEXT = dict(moe_intermediate_size=24, num_experts=5, num_experts_per_tok=2,
                        decoder_sparse_step=1, mlp_only_layers=[1])


def to_hub_expert_layout(tensors: dict) -> dict:
  """transformers 5's fused experts ([E, out, in]) in the Hub's Qwen3-VL-MoE layout
  ([E, in, out])."""
  import numpy as np
  return {name: np.ascontiguousarray(np.swapaxes(value, 1, 2))
          if name.endswith(("experts.gate_up_proj", "experts.down_proj")) else value
          for name, value in tensors.items()}


@pytest.fixture(scope="session")
def qwen3vl_moe_checkpoint(tmp_path_factory):
  """(directory, the transformers Qwen3VLMoeForConditionalGeneration, float32, weights
  redrawn large), saved by `save_pretrained` (transformers 5's fused expert layout);
  directory.parent / "hub" holds the same model in the Hub's expert layout."""
  transformers = pytest.importorskip("transformers")
  torch = pytest.importorskip("torch")
  import shutil

  from safetensors.numpy import load_file, save_file
  from test_qwen3vl_parity import TEXT, VISION_AND_IDS, redraw_large

  config = transformers.Qwen3VLMoeConfig(text_config=TEXT | QWEN3VL_MOE_TEXT, **VISION_AND_IDS,
                                         attn_implementation="eager")
  torch.manual_seed(0)
  model = redraw_large(transformers.Qwen3VLMoeForConditionalGeneration(config).eval())
  root = tmp_path_factory.mktemp("qwen3vl_moe")
  model.save_pretrained(root / "hf")
  (root / "hub").mkdir()
  shutil.copy(root / "hf" / "config.json", root / "hub" / "config.json")
  save_file(to_hub_expert_layout(load_file(root / "hf" / "model.safetensors")),
            root / "hub" / "model.safetensors", {"format": "pt"})
  return root / "hf", model
