"""The authors' PVM layout (experiments/hf/pvm_format.py) against their block rebuilt in torch.

One branch, float32, weights drawn large and a nonzero gate so every parameter
shows in the output: our `PVMBranch` and `PVMMemoryBlock` loaded (strictly,
by name) from our export compute the same output, with two rows whose images
differ in size (padded visual memory) and image positions silenced.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.hf.pvm_format import (
  NAMES,
  PREFIX,
  PVM_FIELDS,
  authors_mismatch,
  authors_pvm_config,
  pvm_config_from_hf,
  pvm_targets,
  pvm_text_fields,
  pvm_to_hf,
)
from experiments.hf.safetensors_io import HFCheckpointError
from experiments.models.config import LMConfig
from pvm_jax.module import PVM

TEXT = dict(hidden_size=32, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, rms_norm_eps=1e-6, num_hidden_layers=3, pvm_layers=[1, 2],
            pvm_hidden_size=16)


def _lm():
  t = TEXT
  return LMConfig(d_model=t["hidden_size"], ffn_dim=t["intermediate_size"],
                  n_heads=t["num_attention_heads"], n_kv_heads=t["num_key_value_heads"],
                  head_dim=t["head_dim"], n_layers=t["num_hidden_layers"], norm_eps=1e-6,
                  vocab_size=64)


@pytest.fixture(scope="module")
def lm_config():
  layers, pvm = pvm_config_from_hf(TEXT, _lm())
  return _lm().replace(ffn_branch_layers=layers, ffn_branch=pvm)


def _random_flat(lm_config, seed=0):
  """Our parameters of every PVM layer, drawn large; norm scales near 1; gate nonzero."""
  rng = np.random.default_rng(seed)
  flat = {}
  shapes = {k: v.shape for k, v in PVM(lm_config.ffn_branch, rngs=nnx.Rngs(0))
            .param_arrays().items()}
  for layer in lm_config.ffn_branch_layers:
    for name, shape in shapes.items():
      if name.endswith("norm"):
        value = rng.uniform(0.5, 1.5, shape)
      elif name == "gate":
        value = np.asarray(rng.uniform(0.5, 1.5))
      else:
        value = rng.normal(0, 1.5 / shape[0] ** 0.5, shape)
      flat[f"blocks/{layer}/ffn_branch/{name}"] = value.astype(np.float32)
  return flat


def test_config_fields_round_trip(lm_config):
  fields = pvm_text_fields(lm_config)
  assert set(fields) == set(PVM_FIELDS)
  assert fields == {"pvm_layers": [1, 2], "pvm_hidden_size": 16}
  layers, pvm = pvm_config_from_hf({**TEXT, **fields}, _lm())
  assert layers == (1, 2) and pvm == lm_config.ffn_branch
  # Their block's widths: Hq = 16/8 = 2, Hkv = max(1, 2 // (4/2)) = 1, F = int(16·80/32) = 40.
  assert (pvm.q_heads, pvm.kv_heads, pvm.ffn_dim) == (2, 1, 40)
  assert pvm_config_from_hf({**TEXT, "pvm_layers": None}, _lm()) is None
  assert authors_mismatch(lm_config) == []


def test_bad_fields_and_mismatches_are_one_line(lm_config):
  for bad in ({"pvm_layers": [5]}, {"pvm_layers": "1"}, {"pvm_hidden_size": 12}):
    with pytest.raises(HFCheckpointError) as e:
      pvm_config_from_hf({**TEXT, **bad}, _lm())
    assert "\n" not in str(e.value)
  odd = lm_config.replace(ffn_branch=lm_config.ffn_branch.replace(latent_ffn_dim=7))
  assert authors_mismatch(odd) == ["ffn_dim=7 (theirs: 40)"]
  with pytest.raises(HFCheckpointError, match="ffn_dim=7"):
    pvm_to_hf(odd, _random_flat(lm_config))


def test_export_import_is_identity(lm_config):
  flat = _random_flat(lm_config)
  tensors = pvm_to_hf(lm_config, flat)
  assert len(tensors) == len(NAMES) * 2
  assert tensors[PREFIX.format(layer=1) + "gate_alpha"].shape == (1,)
  assert tensors[PREFIX.format(layer=2) + "text_reducer.weight"].shape == (16, 32)
  back = {path: t.build(*(tensors[s] for s in t.sources))
          for path, t in pvm_targets(lm_config).items()}
  assert set(back) == set(flat)
  for path, value in flat.items():
    assert back[path].shape == value.shape and np.array_equal(back[path], value), path
  assert set(pvm_targets(lm_config, "lm/")) == {"lm/" + p for p in flat}


def test_branch_equals_the_authors_block(lm_config):
  torch = pytest.importorskip("torch")
  from pvm_authors_torch import PVMMemoryBlock, authors_visual_context, block_kwargs
  flat = _random_flat(lm_config, seed=1)
  layer = 2
  prefix = PREFIX.format(layer=layer)
  state = {k[len(prefix):]: torch.from_numpy(np.asarray(v))
           for k, v in pvm_to_hf(lm_config, flat).items() if k.startswith(prefix)}
  block = PVMMemoryBlock(**block_kwargs(TEXT))
  block.load_state_dict(state, strict=True)   # every name and shape of theirs, nothing more

  B, T, D = 2, 7, TEXT["hidden_size"]
  rng = np.random.default_rng(2)
  x_BxTxD = rng.normal(size=(B, T, D)).astype(np.float32)
  embeds_BxTxD = rng.normal(size=(B, T, D)).astype(np.float32)
  # Row 0 holds 3 image tokens, row 1 holds 5 (images of different sizes).
  visual_BxT = np.zeros((B, T), bool)
  visual_BxT[0, 1:4] = True
  visual_BxT[1, 0:5] = True
  context, mask = authors_visual_context(torch.from_numpy(embeds_BxTxD),
                                         torch.from_numpy(visual_BxT))
  with torch.no_grad():
    want = block(torch.from_numpy(x_BxTxD), context, mask,
                 torch.from_numpy(visual_BxT)).numpy()

  ours = PVM(lm_config.ffn_branch, rngs=nnx.Rngs(0))
  for name in NAMES:
    getattr(ours, name)[...] = jnp.asarray(flat[f"blocks/{layer}/ffn_branch/{name}"])
  valid_BxNv = jnp.asarray(np.arange(context.shape[1])[None] < visual_BxT.sum(1)[:, None])
  got = ours(jnp.asarray(x_BxTxD), visual=jnp.asarray(context.numpy()),
             visual_valid=valid_BxNv, text_mask=jnp.asarray(~visual_BxT))
  assert np.abs(want).max() > 0.3   # the gate is open: the comparison sees the branch
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
  assert np.all(np.asarray(got)[visual_BxT] == 0)


def test_authors_config_matches_their_widths_at_qwen3_vl_8b():
  lm = LMConfig(d_model=4096, ffn_dim=12288, n_heads=32, n_kv_heads=8, head_dim=128,
                n_layers=36, vocab_size=256)
  pvm = authors_pvm_config(lm, 512)
  assert (pvm.q_heads, pvm.kv_heads, pvm.ffn_dim, pvm.vis_dim) == (4, 1, 1536, 4096)
