"""The LM-side visual position embedding and the grounding probe, against direct computations."""

import types

import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.analysis.grounding import _rows, grounding_probe
from experiments.models.config import LMConfig
from experiments.vlm.emoji import SceneConfig, make_split
from experiments.vlm.emoji.emoji_classes import CLASS_NAMES
from experiments.vlm.tiny.config import VLMConfig
from experiments.vlm.tiny.model import VLM
from pvm_jax.config import PVMConfig

LM = LMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
              max_len=192)
PVM_CFG = PVMConfig(d_model=32, latent_dim=32, head_dim=16, backbone_gqa_ratio=2,
                    backbone_ffn_dim=64)
SCENES = SceneConfig(rows=2, cols=2, glyph_size=8)


def config(visual_pos=True, branch="pvm"):
  return VLMConfig(lm=LM, image_hw=(16, 16), patch_size=8, vit_dim=16, vit_layers=1,
                   vit_heads=2, vit_ffn=32, visual_pos=visual_pos, branch=branch,
                   branch_layers=(1,) if branch == "pvm" else (),
                   pvm=PVM_CFG if branch == "pvm" else None)


def fake_data(n=3):
  """The probe needs scenes and images only; random pixels stand in for the renderings."""
  scenes = make_split(SCENES, "validation", n, seed=0)
  images = np.random.default_rng(0).integers(0, 256, (n, 16, 16, 3)).astype(np.uint8)
  return types.SimpleNamespace(scenes=scenes, images=images), scenes


def test_visual_pos_is_one_learned_vector_per_slot_added_to_the_projection():
  assert VLMConfig.from_dict(config().to_dict()) == config()
  with_pos = VLM(config(True, "none"), rngs=nnx.Rngs(0))
  without = VLM(config(False, "none"), rngs=nnx.Rngs(0))
  assert with_pos.projector.pos[...].shape == (4, 32) and without.projector.pos is None
  images = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 16, 16, 3)), jnp.uint8)
  # Same seed, same draw order up to the extra parameter: copy the rest over to compare.
  nnx.update(without.encoder, nnx.state(with_pos.encoder))
  without.projector.w1[...] = with_pos.projector.w1[...]
  without.projector.w2[...] = with_pos.projector.w2[...]
  np.testing.assert_allclose(with_pos.visual(images),
                             without.visual(images) + with_pos.projector.pos[...][None],
                             rtol=1e-6, atol=1e-7)


def test_probe_rows_put_each_name_right_after_its_emit_position():
  _, scenes = fake_data()
  tokens, valid, items = _rows(scenes)
  assert len(items) == sum(s.k for s in scenes)
  for r, emit, name, cell in items:
    s = scenes[r]
    j = list(s.cells).index(cell)
    assert list(tokens[r, emit + 1:emit + 1 + len(name)]) == name
    assert bytes(name).decode() == CLASS_NAMES[s.classes[j]]
    assert bytes(tokens[r, emit - 1:emit + 1].tolist()) == b": "
    assert valid[r, emit + len(name) + 1]   # the "." after the name


def test_probe_matches_a_direct_forward():
  model = VLM(config(), rngs=nnx.Rngs(0))
  model.branch(1).gate[...] = jnp.asarray(0.5)
  data, scenes = fake_data()
  got = grounding_probe(model, data, n=3, batch=2)
  tokens, valid, items = _rows(scenes)
  logits, aux = model(jnp.asarray(data.images), jnp.asarray(tokens), valid=jnp.asarray(valid),
                      probe=True)
  Nv = 4
  first, whole, cell1, vis0, pvm1 = [], [], [], [], []
  for r, emit, name, cell in items:
    q = Nv + emit
    pred = np.asarray(logits[r, q:q + len(name)]).argmax(-1).tolist()
    first.append(pred[0] == name[0])
    whole.append(pred == name)
    cell1.append(float(aux["attn/1/probs"][r, :, q, cell].mean()))
    vis0.append(float(aux["attn/0/probs"][r, :, q, :Nv].sum(-1).mean()))
    pvm1.append(float(aux["ffn_branch/1/probs"][r, q, :, cell].mean()))
  assert got["n_items"] == len(items)
  assert got["first_byte_acc"] == np.mean(first) and got["name_acc"] == np.mean(whole)
  np.testing.assert_allclose(got["cell_attn"][1], np.mean(cell1), rtol=1e-5)
  np.testing.assert_allclose(got["visual_attn"][0], np.mean(vis0), rtol=1e-5)
  np.testing.assert_allclose(got["pvm_cell_attn"]["1"], np.mean(pvm1), rtol=1e-5)
  assert all(c <= v + 1e-6 for c, v in zip(got["cell_attn"], got["visual_attn"], strict=True))
  assert set(got["pvm_cell_attn"]) == {"1"}
  # The probes are probabilities: every query's backbone and PVM rows sum to 1.
  np.testing.assert_allclose(np.asarray(aux["attn/0/probs"]).sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(aux["ffn_branch/1/probs"]).sum(-1), 1.0, atol=1e-5)
  assert sorted(k for k in aux if k.startswith("block/")) == ["block/0/hidden", "block/1/hidden"]
