"""Our decoder on Hugging Face checkpoints == `transformers` on the same files.

Reference numbers come live from `transformers` (dev dependency, CPU torch):
tests/experiments/hf/conftest.py builds each tiny checkpoint with
`transformers` and saves it sharded. `importorskip` only guards an install
without the dev extra; the dev install (and CI) runs these.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.hf import load_hf
from experiments.trainer.placement import make_train_mesh
from lngram_jax.config import LngramConfig

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

FAMILIES = ("qwen3", "llama", "qwen2")
TOKENS_BxT = np.random.default_rng(0).integers(3, 96, (2, 20))


def hf_logits(model, tokens_BxT):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(tokens_BxT))).logits.float().numpy()


def assert_logits_close(got, want):
  # float32 through two layers: differences are ~1e-6 of the logit scale; a
  # wrong transpose, norm or rope scaling moves them by O(1) (weights drawn large).
  scale = float(np.abs(want).max())
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(hf_checkpoints, family):
  path, hf = hf_checkpoints[family]
  model, config = load_hf(path)
  assert config.qk_norm == (family == "qwen3")
  assert config.qkv_bias == (family == "qwen2")
  assert config.tie_embeddings == (family == "qwen3")
  assert bool(config.rope_scaling) == (family == "llama")
  got = model(jnp.asarray(TOKENS_BxT))
  assert got.dtype == jnp.float32 and got.shape == (2, 20, config.vocab_size)
  assert_logits_close(got, hf_logits(hf, TOKENS_BxT))


def test_the_comparison_can_fail(hf_checkpoints):
  """A swapped pair of query heads (a wrong reshape) is caught by the tolerance."""
  path, hf = hf_checkpoints["qwen3"]
  model, _ = load_hf(path)
  w_q = model.blocks[0].attn.w_q
  w_q[...] = w_q[...][:, ::-1]
  got = np.asarray(model(jnp.asarray(TOKENS_BxT)))
  want = hf_logits(hf, TOKENS_BxT)
  assert np.abs(got - want).max() > 1e-2 * np.abs(want).max()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_with_cache_equals_transformers(hf_checkpoints, family, greedy_both):
  path, hf = hf_checkpoints[family]
  model, _ = load_hf(path)
  got, want = greedy_both(model, hf, TOKENS_BxT[:, :6], 16)
  np.testing.assert_array_equal(got, want)


def test_logits_on_an_8_device_mesh(hf_checkpoints):
  """Each parameter goes straight into its fsdp shard; the sharded forward agrees."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (tests/conftest.py exposes 8 host devices)")
  path, hf = hf_checkpoints["llama"]
  mesh = make_train_mesh({"fsdp": 8})
  model, _ = load_hf(path, mesh=mesh)
  w_gate = model.blocks[0].mlp.w_gate[...]
  assert len(w_gate.sharding.device_set) == 8
  assert w_gate.addressable_shards[0].data.size == w_gate.size // 8
  graphdef, state = nnx.split(model)
  logits = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.asarray(TOKENS_BxT))
  assert_logits_close(logits, hf_logits(hf, TOKENS_BxT))


def test_memory_inserted_at_step_0_leaves_the_logits(hf_checkpoints):
  """Lngram v2 in the memory slot starts at zero output: the HF model's logits exactly."""
  path, hf = hf_checkpoints["qwen3"]
  base, config = load_hf(path)
  lngram = LngramConfig(d_model=config.d_model, routes=4, bits=2, orders=(2, 3), mem_dim=8,
                        q_heads=4, kv_heads=2, head_dim=8)
  model, inserted = load_hf(path, config=config.replace(memory_layers=(1,), memory=lngram))
  assert inserted.memory_layers == (1,)
  tokens = jnp.asarray(TOKENS_BxT)
  np.testing.assert_array_equal(np.asarray(model(tokens)), np.asarray(base(tokens)))
  assert_logits_close(model(tokens), hf_logits(hf, TOKENS_BxT))


def test_bf16_checkpoint_loads_bit_exact(tmp_path, hf_checkpoints):
  _, hf = hf_checkpoints["qwen2"]
  hf.to(torch.bfloat16).save_pretrained(tmp_path)
  hf.to(torch.float32)
  model, config = load_hf(tmp_path)
  assert config.param_dtype == jnp.bfloat16
  w = hf.model.layers[1].self_attn.k_proj.weight.detach().to(torch.float32).numpy()
  ours = np.asarray(model.blocks[1].attn.w_kv[...][:, 0], np.float32)   # [D, Hkv, Dh]
  np.testing.assert_array_equal(ours.reshape(ours.shape[0], -1).T, w)
  assert model.blocks[1].attn.w_kv[...].dtype == jnp.bfloat16
  assert model(jnp.asarray(TOKENS_BxT)).dtype == jnp.float32
