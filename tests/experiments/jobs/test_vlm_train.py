"""VLM stages in the one loop: Stage I leaves everything but the branch bit-for-bit unchanged;
the scene sampler keeps the old draws and resumes; GRPO advantage and loss, cell loss by hand."""

import json

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from experiments.jobs import run_train, saved_config
from experiments.jobs.grpo import group_advantages, grpo_objective
from experiments.jobs.init_from import flat_params, init_from
from experiments.jobs.restore import restore
from experiments.jobs.vlm.loss import trainable_mask, vlm_loss
from experiments.models.config import LMConfig
from experiments.trainer import Task
from experiments.trainer.checkpoint import run_checkpointer
from experiments.vlm.tiny.config import VLMConfig
from experiments.vlm.tiny.data import SceneSampler
from experiments.vlm.tiny.model import VLM
from pvm_jax.config import PVMConfig

LM = LMConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
              max_len=32)
PVM_CFG = PVMConfig(d_model=32, latent_dim=32, head_dim=16, backbone_gqa_ratio=2,
                    backbone_ffn_dim=64)
VLM_KW = dict(lm=LM, image_hw=(16, 16), patch_size=8, vit_dim=16, vit_layers=1, vit_heads=2,
              vit_ffn=32)


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


def _run_config(steps):
  c = ml_collections.ConfigDict()
  c.optim = dict(lr=1e-2, table_lr_mult=4.0, weight_decay=0.1, b1=0.9, b2=0.95, eps=1e-8,
                 warmup_steps=0, warmup_frac=0.1, min_lr_ratio=0.1, clip_norm=1.0)
  c.train = dict(steps=steps, seed=0, log_every=1, eval_every=100, ckpt_every=100,
                 max_to_keep=2, async_checkpoint=False, progress=False)
  return c


def _vlm_task(config, model, trainable, phases=(3,)):
  return Task(module=model, saved_config=saved_config("vlm", config, model.config),
              batches=SceneSampler([RandomData()] * len(phases), list(phases), batch_size=4,
                                   seed=0),
              loss=vlm_loss, optim=config.optim, phases=phases,
              trainable=trainable_mask(trainable))


def test_stage1_in_the_loop_trains_only_the_branch_bit_for_bit(tmp_path):
  model = VLM(VLMConfig(**VLM_KW, branch="pvm", branch_layers=(1,), pvm=PVM_CFG),
              rngs=nnx.Rngs(0))
  before = {k: np.asarray(v).copy() for k, v in flat_params(nnx.state(model, nnx.Param)).items()}
  config = _run_config(3)
  result = run_train(config, tmp_path, task=_vlm_task(config, model, "branch"))
  assert result["step"] == 3
  trained, _ = restore(tmp_path)
  after = {k: np.asarray(v) for k, v in flat_params(nnx.state(trained, nnx.Param)).items()}
  assert set(after) == set(before)
  frozen = [k for k in before if "/ffn_branch/" not in k]
  assert frozen and any(k.startswith("encoder/") for k in frozen)
  for k in frozen:   # bit-for-bit, not just allclose
    assert before[k].tobytes() == after[k].tobytes(), k
  changed = {k for k in before if not np.array_equal(before[k], after[k])}
  # The branch did train: λ moved at step 0, the rest once λ was nonzero.
  assert {"lm/blocks/1/ffn_branch/gate", "lm/blocks/1/ffn_branch/w_q"} <= changed
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3] and all(np.isfinite(r["train/loss"])
                                                         for r in rows)


def test_trainable_masks_by_path():
  paths = ["encoder/patch/kernel", "projector/pos", "lm/embed/table",
           "lm/blocks/1/ffn_branch/gate", "lm/blocks/1/mlp/w_up"]
  chosen = {name: [p for p in paths if (trainable_mask(name) or (lambda _: True))(p)]
            for name in ("all", "branch", "lm", "lm+branch")}
  assert chosen == {"all": paths, "branch": ["lm/blocks/1/ffn_branch/gate"],
                    "lm": ["lm/embed/table", "lm/blocks/1/mlp/w_up"],
                    "lm+branch": paths[2:]}
  wrapped = trainable_mask("branch", prefix="model/")
  assert wrapped("model/lm/blocks/1/ffn_branch/gate") and not wrapped("w_head")
  with pytest.raises(ValueError, match="trainable='nope'"):
    trainable_mask("nope")


def test_scene_sampler_keeps_the_old_draws_and_resumes_through_json():
  data = RandomData(n=3)   # fewer scenes than the batch: drawn with replacement
  sampler = SceneSampler([data, RandomData(n=8)], [2, 3], batch_size=4, seed=7)
  rng = np.random.default_rng(7)
  want = [rng.choice(3, 4, replace=True) for _ in range(2)]
  rng = np.random.default_rng(7)   # every phase restarts the draw at the seed
  want += [rng.choice(8, 4, replace=False) for _ in range(3)]
  got, state = [], None
  for i in range(5):
    if i == 3:
      state = json.loads(json.dumps(sampler.get_state()))
    got.append(next(sampler)["tokens"])
  for idx, (g, w) in enumerate(zip(got, want, strict=True)):
    src = data if idx < 2 else sampler.data(1)
    np.testing.assert_array_equal(g, src.tokens[w], err_msg=f"draw {idx}")
  resumed = SceneSampler([data, RandomData(n=8)], [2, 3], batch_size=4, seed=7)
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["tokens"], got[3])
  np.testing.assert_array_equal(next(resumed)["tokens"], got[4])
  other = SceneSampler([data, data], [2, 3], batch_size=2, seed=7)
  with pytest.raises(ValueError, match="other settings"):
    other.set_state(state)


def test_init_from_keeps_branch_init_and_refuses_arrays_the_model_lacks(tmp_path):
  base = VLM(VLMConfig(**VLM_KW, visual_pos=True), rngs=nnx.Rngs(0))
  with run_checkpointer(tmp_path / "base", async_save=False) as ckpt:
    ckpt.save(1, params=nnx.to_pure_dict(nnx.state(base, nnx.Param)),
              config=saved_config("vlm", _run_config(1), base.config))
  sft = VLM(VLMConfig(**VLM_KW, visual_pos=True, branch="pvm", branch_layers=(1,), pvm=PVM_CFG),
            rngs=nnx.Rngs(1))
  init = {k: np.asarray(v).copy() for k, v in flat_params(nnx.state(sft, nnx.Param)).items()}
  missing = init_from(sft, tmp_path / "base", kind="vlm")["missing"]
  assert missing and all("/ffn_branch/" in k for k in missing)
  loaded = flat_params(nnx.state(sft, nnx.Param))
  for k, v in flat_params(nnx.state(base, nnx.Param)).items():
    np.testing.assert_array_equal(loaded[k], v, err_msg=k)
  for k in missing:
    np.testing.assert_array_equal(loaded[k], init[k], err_msg=k)
  mismatched = VLM(VLMConfig(**VLM_KW, visual_pos=False), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"projector/pos.*lacks"):
    init_from(mismatched, tmp_path / "base", kind="vlm")


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
  from experiments.vlm.emoji.emoji_scenes import Scene
  from experiments.vlm.tiny.cell_loss import cell_class_loss, cell_labels

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


def test_stage0_cell_loss_is_caption_plus_weighted_cell_loss():
  from experiments.jobs.vlm.loss import cell_pretrainer_loss, lm_loss
  from experiments.vlm.tiny.cell_loss import CellPretrainer, cell_class_loss

  data = RandomData()
  labels = np.random.default_rng(1).integers(0, 4, (len(data), 4)).astype(np.int32)
  batch = {k: jnp.asarray(v) for k, v in data.batch(np.arange(4)).items()}
  batch["cell_labels"] = jnp.asarray(labels[:4])
  model = VLM(VLMConfig(**VLM_KW), rngs=nnx.Rngs(0))
  trainer = CellPretrainer(model, 3, 0.5, rngs=nnx.Rngs(1))
  want = float(lm_loss(model, batch)) + 0.5 * float(cell_class_loss(
      model.encoder(batch["images"]), trainer.w_head[...], trainer.b_head[...],
      batch["cell_labels"]))
  loss, _ = cell_pretrainer_loss(trainer, batch)
  np.testing.assert_allclose(float(loss), want, rtol=1e-6)
  # The head sits beside the VLM: the VLM's own parameter tree has none of it.
  head = set(flat_params(nnx.state(trainer, nnx.Param))) - {
      f"model/{k}" for k in flat_params(nnx.state(model, nnx.Param))}
  assert head == {"w_head", "b_head"}


def test_cell_features_average_each_cells_patches_in_reading_order():
  from experiments.vlm.tiny.cell_loss import cell_features, check_cell_geometry

  # A 4x6 patch grid (reading order) over 2x3 cells of 2x2 patches.
  feats = np.arange(2 * 24 * 3, dtype=np.float64).reshape(2, 24, 3)
  got = np.asarray(cell_features(jnp.asarray(feats), (4, 6), (2, 3)))
  grid = feats.reshape(2, 4, 6, 3)
  want = np.stack([grid[:, 2 * r:2 * r + 2, 2 * c:2 * c + 2].mean(axis=(1, 2))
                   for r in range(2) for c in range(3)], axis=1)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # One patch per cell: the features themselves.
  np.testing.assert_array_equal(np.asarray(cell_features(jnp.asarray(feats), (4, 6), (4, 6))),
                                feats)
  with pytest.raises(ValueError, match="whole patches"):
    cell_features(jnp.asarray(feats), (4, 6), (3, 3))
  assert check_cell_geometry(16, 8) == 2 and check_cell_geometry(16, 16) == 1
  with pytest.raises(ValueError, match="whole multiple"):
    check_cell_geometry(16, 6)


def test_stage0_cell_loss_pools_several_patches_per_cell():
  """16x16 images in 8x8 patches with one 16-pixel cell: the head reads the mean of
  its four patch features; a cell count that does not tile the patches is refused."""
  from experiments.jobs.vlm.loss import cell_pretrainer_loss, lm_loss
  from experiments.vlm.tiny.cell_loss import CellPretrainer, cell_class_loss

  data = RandomData()
  batch = {k: jnp.asarray(v) for k, v in data.batch(np.arange(4)).items()}
  batch["cell_labels"] = jnp.asarray([[0], [1], [3], [2]], jnp.int32)
  model = VLM(VLMConfig(**VLM_KW), rngs=nnx.Rngs(0))
  trainer = CellPretrainer(model, 3, 0.5, rngs=nnx.Rngs(1))
  pooled = model.encoder(batch["images"]).mean(axis=1, keepdims=True)
  want = float(lm_loss(model, batch)) + 0.5 * float(cell_class_loss(
      pooled, trainer.w_head[...], trainer.b_head[...], batch["cell_labels"]))
  loss, _ = cell_pretrainer_loss(trainer, batch)
  np.testing.assert_allclose(float(loss), want, rtol=1e-6)
  batch["cell_labels"] = jnp.zeros((4, 3), jnp.int32)
  with pytest.raises(ValueError, match="k x k whole patches"):
    cell_pretrainer_loss(trainer, batch)


@pytest.mark.slow   # compiles the cached sampler
def test_grpo_hooks_start_at_ratio_one_and_zero_kl():
  """At the first step the sampling policy is the trained one: the teacher-forced
  log-probs of the sampled completions equal the sampler's (ratio 1), and against
  a reference equal to the policy the KL term vanishes."""
  from experiments.jobs.vlm.grpo import grpo_hooks, token_logp

  model = VLM(VLMConfig(**VLM_KW, branch="pvm", branch_layers=(1,), pvm=PVM_CFG),
              rngs=nnx.Rngs(0))
  data = RandomData()
  data.examples = [{"answer": i % 3} for i in range(len(data))]
  idx = np.repeat(np.array([1, 5]), 2)
  batch = {"images": data.images[idx], "tokens": data.tokens[idx, :6],
           "lengths": np.array([6, 6, 4, 4], np.int32), "idx": idx}
  grpo = ml_collections.ConfigDict(dict(group_size=2, max_new_tokens=5, clip_eps=0.2,
                                        kl_coef=0.5, temperature=1.0))
  prepare, loss = grpo_hooks(data, grpo, seed=3, ref_model=model)
  prepared = prepare(model, batch, step=1)
  assert prepared["completion"].shape == (4, 5) and prepared["reward"].shape == (4,)
  logp = token_logp(model, prepared["images"], prepared["prompt"], prepared["lengths"],
                    prepared["completion"])
  np.testing.assert_allclose(logp, prepared["old_logp"], atol=2e-5)
  np.testing.assert_allclose(prepared["ref_logp"], prepared["old_logp"], atol=2e-5)
  value, metrics = loss(model, prepared)
  # ratio 1, KL 0: L = -mean_g A_g (each row's masked mean of a constant A_g;
  # the mask always holds the first token).
  np.testing.assert_allclose(float(value), -np.mean(prepared["adv"]), atol=1e-4)
  assert float(metrics["train/reward"]) == pytest.approx(float(prepared["reward"].mean()))
  # Step s draws with fold_in(key(seed), s - 1): the same step draws the same tokens.
  np.testing.assert_array_equal(prepare(model, batch, step=1)["completion"],
                                prepared["completion"])
