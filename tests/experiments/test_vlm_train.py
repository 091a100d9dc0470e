"""Stage I leaves everything but the branch bit-for-bit unchanged; GRPO advantage and loss by hand."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.models.config import LMConfig
from experiments.vlm.config import VLMConfig
from experiments.vlm.grpo import group_advantages, grpo_objective
from experiments.vlm.model import VLM
from experiments.vlm.train import fit, flat_params, load_params, save_params
from pvm_jax.config import PVMConfig

LM = LMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
              max_len=32)
PVM_CFG = PVMConfig(d_model=32, latent_dim=32, head_dim=16, backbone_gqa_ratio=2,
                    backbone_ffn_dim=64)


class RandomData:
  """Stands in for SceneData: random images and byte rows, loss on the second half."""

  def __init__(self, n=8, T=12):
    rng = np.random.default_rng(0)
    self.images = rng.integers(0, 256, (n, 16, 16, 3)).astype(np.uint8)
    self.tokens = rng.integers(1, 256, (n, T)).astype(np.int32)
    self.T = T

  def __len__(self):
    return len(self.images)

  def batch(self, idx):
    loss_mask = np.zeros((len(idx), self.T), bool)
    loss_mask[:, self.T // 2:] = True
    return {"images": self.images[idx], "tokens": self.tokens[idx],
            "valid": np.ones((len(idx), self.T), bool), "loss_mask": loss_mask}


def test_stage1_trains_only_the_branch_bit_for_bit():
  config = VLMConfig(lm=LM, image_hw=(16, 16), patch_size=8, vit_dim=16, vit_layers=1,
                     vit_heads=2, vit_ffn=32, branch="pvm", branch_layers=(1,), pvm=PVM_CFG)
  model = VLM(config, rngs=nnx.Rngs(0))
  before = {k: np.asarray(v).copy() for k, v in flat_params(nnx.state(model, nnx.Param)).items()}
  losses = fit(model, RandomData(), trainable="branch", steps=3, batch_size=4, lr=1e-2,
               weight_decay=0.1, log=None)
  after = {k: np.asarray(v) for k, v in flat_params(nnx.state(model, nnx.Param)).items()}
  assert np.isfinite(losses).all()
  changed = {k for k in before if not np.array_equal(before[k], after[k])}
  frozen = [k for k in before if not k.startswith("branches/")]
  assert frozen and not changed & set(frozen), sorted(changed & set(frozen))
  for k in frozen:   # bit-for-bit, not just allclose
    assert before[k].tobytes() == after[k].tobytes(), k
  # The branch did train: λ moved at step 0, the rest once λ was nonzero.
  assert "branches/1/gate" in changed and "branches/1/w_q" in changed


def test_group_advantages_by_hand():
  r = np.array([[1.0, 0.0, 0.0, 1.0], [0.1, 0.1, 0.1, 0.1]], np.float32)
  adv = np.asarray(group_advantages(r, eps=1e-4))
  # group 1: mean 0.5, population std 0.5 -> ±0.5 / 0.5001
  np.testing.assert_allclose(adv[0], [0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001,
                                      0.5 / 0.5001], rtol=1e-6)
  np.testing.assert_array_equal(adv[1], 0.0)   # equal rewards: no signal


def test_grpo_objective_by_hand():
  logp = jnp.log(jnp.array([[0.5, 0.6, 0.9], [0.2, 0.3, 0.4]]))
  old = jnp.log(jnp.array([[0.25, 0.6, 0.9], [0.4, 0.3, 0.4]]))
  adv = jnp.array([2.0, -1.0])
  mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
  # ratios: row 0 [2, 1, 1] (last masked), row 1 [0.5, 1, 1]; clip ε = 0.2.
  # row 0, A = 2: min(2·2, 1.2·2) = 2.4; min(1·2, 1·2) = 2 -> mean over 2 tokens 2.2
  # row 1, A = -1: min(0.5·-1, 0.8·-1) = -0.8; -1; -1 -> mean -2.8/3
  want = -np.mean([2.2, -2.8 / 3])
  got = grpo_objective(logp, old, adv, mask, clip_eps=0.2)
  np.testing.assert_allclose(float(got), want, rtol=1e-6)
  # KL term (k3) with β = 0.5 against a reference equal to old.
  d = old - logp
  k3 = jnp.exp(d) - d - 1
  per = np.array([[2 * 1.2, 2, 0], [-0.8, -1, -1]]) - 0.5 * np.asarray(k3)
  m = np.asarray(mask, np.float64)
  want_kl = -np.mean((per * m).sum(1) / m.sum(1))
  got_kl = grpo_objective(logp, old, adv, mask, clip_eps=0.2, kl_coef=0.5, ref_logp_BxN=old)
  np.testing.assert_allclose(float(got_kl), want_kl, rtol=1e-5)


def test_cell_labels_and_cell_class_loss_by_hand():
  from experiments.vlm.cell_loss import cell_class_loss, cell_labels
  from pvm_jax.data.emoji_scenes import Scene

  scenes = [Scene(rows=2, cols=2, cells=(0, 3), classes=(2, 1), category=0),
            Scene(rows=2, cols=2, cells=(1,), classes=(0,), category=0)]
  labels = cell_labels(scenes, n_classes=3)   # 3 = empty
  np.testing.assert_array_equal(labels, [[2, 3, 3, 1], [3, 0, 3, 3]])
  # Features e_n one-hot in a 4-wide space, identity head into 4 classes, bias 0:
  # logit row = 5 · onehot(j) when feature j is on.
  feats = np.zeros((2, 4, 4), np.float32)
  feats[0, :, :] = np.eye(4)[[2, 3, 0, 1]]   # image 0 predicts 2, 3, 0, 1
  feats[1, :, :] = np.eye(4)[[3, 0, 3, 3]]   # image 1 predicts its labels exactly
  w = 5.0 * np.eye(4, dtype=np.float32)
  right = np.log(1 + 3 * np.exp(-5.0))       # CE when the label holds the 5
  wrong = 5.0 + np.log(1 + 3 * np.exp(-5.0))  # CE when another class holds it
  # image 0: cells 0, 1 right (2, 3); cell 2 predicts 0 but label 3; cell 3 right (1).
  want = (3 * right + wrong + 4 * right) / 8
  got = cell_class_loss(jnp.asarray(feats), jnp.asarray(w), jnp.zeros(4), jnp.asarray(labels))
  np.testing.assert_allclose(float(got), want, rtol=1e-6)
  # Zero weights: uniform logits, log(4) everywhere; a bias of +5 on class 3 then makes
  # the 5 empty cells "right" and the 3 object cells "wrong".
  zeros = jnp.zeros((4, 4))
  got0 = cell_class_loss(jnp.asarray(feats), zeros, jnp.zeros(4), jnp.asarray(labels))
  np.testing.assert_allclose(float(got0), np.log(4.0), rtol=1e-6)
  got_b = cell_class_loss(jnp.asarray(feats), zeros, jnp.array([0, 0, 0, 5.0]),
                          jnp.asarray(labels))
  np.testing.assert_allclose(float(got_b), (5 * right + 3 * wrong) / 8, rtol=1e-6)


def test_stage0_cell_loss_is_caption_plus_weighted_cell_loss_and_head_is_not_saved():
  from experiments.vlm.cell_loss import CellPretrainer

  config = VLMConfig(lm=LM, image_hw=(16, 16), patch_size=8, vit_dim=16, vit_layers=1,
                     vit_heads=2, vit_ffn=32)
  data = RandomData()
  labels = np.random.default_rng(1).integers(0, 4, (len(data), 4)).astype(np.int32)
  base_batch = data.batch
  data.batch = lambda idx: {**base_batch(idx), "cell_labels": labels[idx]}
  model = VLM(config, rngs=nnx.Rngs(0))
  keys = set(flat_params(nnx.state(model, nnx.Param)))
  batch = {k: jnp.asarray(v) for k, v in data.batch(np.arange(4)).items()}
  trainer = CellPretrainer(model, 3, 0.5, rngs=nnx.Rngs(1))
  from experiments.vlm.cell_loss import cell_class_loss
  from experiments.vlm.train import lm_loss
  want = float(lm_loss(model, batch)) + 0.5 * float(cell_class_loss(
      model.encoder(batch["images"]), trainer.w_head[...], trainer.b_head[...],
      batch["cell_labels"]))
  np.testing.assert_allclose(float(trainer.loss(batch, lm_loss)), want, rtol=1e-6)
  losses = fit(model, data, trainable="all", steps=3, batch_size=4, lr=1e-2, log=None,
               cell_loss_weight=0.5, n_classes=3)
  assert np.isfinite(losses).all()
  assert set(flat_params(nnx.state(model, nnx.Param))) == keys   # no head in the VLM


def test_load_params_keeps_branch_init_and_refuses_arrays_the_model_lacks(tmp_path):
  kw = dict(lm=LM, image_hw=(16, 16), patch_size=8, vit_dim=16, vit_layers=1, vit_heads=2,
            vit_ffn=32)
  base = VLM(VLMConfig(**kw, visual_pos=True), rngs=nnx.Rngs(0))
  save_params(base, tmp_path / "base" / "params.npz")
  sft = VLM(VLMConfig(**kw, visual_pos=True, branch="pvm", branch_layers=(1,), pvm=PVM_CFG),
            rngs=nnx.Rngs(1))
  missing = load_params(sft, tmp_path / "base" / "params.npz")
  assert missing and all(k.startswith("branches/1/") for k in missing)
  np.testing.assert_array_equal(sft.projector.pos[...], base.projector.pos[...])
  mismatched = VLM(VLMConfig(**kw, visual_pos=False), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"projector/pos.*lacks"):
    load_params(mismatched, tmp_path / "base" / "params.npz")
