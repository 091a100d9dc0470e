"""Every damaged or unsupported Hugging Face checkpoint is refused in one line that names it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from experiments.hf import HFCheckpointError, load_hf
from experiments.hf.safetensors_io import Checkpoint

safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture
def qwen3_dir(hf_checkpoints, tmp_path):
  """A single-file copy of the tiny Qwen3 checkpoint, free to damage."""
  src, _ = hf_checkpoints["qwen3"]
  ckpt = Checkpoint(src)
  out = tmp_path / "ckpt"
  out.mkdir()
  shutil.copy(src / "config.json", out / "config.json")
  save(out, {name: np.array(ckpt.tensor(name)) for name in ckpt.names()})
  return out


def save(path, tensors):
  safetensors_numpy.save_file(tensors, str(path / "model.safetensors"))


def tensors(path):
  return safetensors_numpy.load_file(str(path / "model.safetensors"))


def refused(path, *needles, load=load_hf, **kw):
  with pytest.raises(HFCheckpointError) as e:
    load(path, **kw)
  message = str(e.value)
  assert "\n" not in message, message
  for needle in needles:
    assert needle in message, message
  return message


def test_the_intact_copy_loads(qwen3_dir):
  load_hf(qwen3_dir)


def test_directory_without_config_or_weights(tmp_path, qwen3_dir):
  refused(tmp_path / "absent", "not a directory")
  (tmp_path / "empty").mkdir()
  refused(tmp_path / "empty", "no config.json")
  (qwen3_dir / "model.safetensors").unlink()
  (qwen3_dir / "pytorch_model.bin").write_bytes(b"")
  refused(qwen3_dir, "no weights", "pytorch_model.bin")


def test_unsupported_model_type_names_the_supported(qwen3_dir):
  config = json.loads((qwen3_dir / "config.json").read_text())
  config["model_type"] = "gpt2"
  (qwen3_dir / "config.json").write_text(json.dumps(config))
  refused(qwen3_dir, "'gpt2'", "llama", "qwen2", "qwen3")


def test_unsupported_options_are_named(qwen3_dir):
  config = json.loads((qwen3_dir / "config.json").read_text())
  (qwen3_dir / "config.json").write_text(json.dumps(config | {"use_sliding_window": True}))
  refused(qwen3_dir, "use_sliding_window")
  rope = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6}
  (qwen3_dir / "config.json").write_text(json.dumps(config | {"rope_parameters": rope}))
  refused(qwen3_dir, "'yarn'", "llama3")
  (qwen3_dir / "config.json").write_text(json.dumps(config | {"dtype": "int8"}))
  refused(qwen3_dir, "'int8'")


def test_missing_and_unexpected_tensors_are_named(qwen3_dir):
  full = tensors(qwen3_dir)
  save(qwen3_dir, {k: v for k, v in full.items() if k != "model.layers.1.self_attn.q_norm.weight"})
  refused(qwen3_dir, "missing tensors", "model.layers.1.self_attn.q_norm.weight")
  save(qwen3_dir, full | {"model.layers.0.mlp.extra.weight": np.zeros((2,), np.float32)})
  refused(qwen3_dir, "unexpected tensors", "model.layers.0.mlp.extra.weight")


def test_shape_mismatch_names_tensor_and_shapes(qwen3_dir):
  full = tensors(qwen3_dir)
  full["model.layers.0.mlp.up_proj.weight"] = np.zeros((111, 64), np.float32)
  save(qwen3_dir, full)
  refused(qwen3_dir, "model.layers.0.mlp.up_proj.weight", "[111, 64]", "[112, 64]")


def test_truncated_and_corrupt_files(qwen3_dir):
  path = qwen3_dir / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[:-100])
  refused(qwen3_dir, "truncated", "model.safetensors")
  path.write_bytes(data[:4])
  refused(qwen3_dir, "truncated")
  path.write_bytes(data[:8] + b"\xff" * 16 + data[24:])
  refused(qwen3_dir, "corrupt")
  path.unlink()   # beside model.safetensors an index is not read (transformers' order)
  (qwen3_dir / "model.safetensors.index.json").write_text("{")
  refused(qwen3_dir, "model.safetensors.index.json")


def test_a_shard_listed_but_missing(hf_checkpoints, tmp_path):
  src, _ = hf_checkpoints["llama"]
  shutil.copytree(src, tmp_path / "c")
  shard = sorted((tmp_path / "c").glob("model-*.safetensors"))[-1]
  shard.unlink()
  refused(tmp_path / "c", shard.name, "missing")


def test_a_dtype_we_cannot_hold(qwen3_dir):
  full = tensors(qwen3_dir)
  full["model.norm.weight"] = full["model.norm.weight"].astype(np.int32)
  save(qwen3_dir, full)
  refused(qwen3_dir, "model.norm.weight", "I32")


def test_a_config_that_contradicts_config_json(qwen3_dir):
  _, config = load_hf(qwen3_dir)
  refused(qwen3_dir, "contradicts", "d_model=32", "(config.json: 64)", "n_layers=3",
          config=config.replace(d_model=32, n_layers=3))


# -- Qwen3-VL-MoE -------------------------------------------------------------------------

GATE_UP = "model.language_model.layers.2.mlp.experts.gate_up_proj"


@pytest.fixture
def vl_moe_dir(qwen3vl_moe_checkpoint, tmp_path):
  """A copy of the tiny Qwen3-VL-MoE checkpoint (conftest.py), free to damage."""
  src, _ = qwen3vl_moe_checkpoint
  shutil.copytree(src, tmp_path / "vl_moe")
  return tmp_path / "vl_moe"


def vl_refused(path, *needles):
  from experiments.hf.qwen3vl.load import load_qwen3vl
  refused(path, *needles, load=load_qwen3vl)


def edit_config(path, change):
  config = json.loads((path / "config.json").read_text())
  change(config)
  (path / "config.json").write_text(json.dumps(config))


def test_qwen3vl_moe_missing_or_misshapen_experts_are_named(vl_moe_dir):
  full = tensors(vl_moe_dir)
  save(vl_moe_dir, {k: v for k, v in full.items() if k != GATE_UP})
  vl_refused(vl_moe_dir, "missing tensors", GATE_UP)
  save(vl_moe_dir, full | {GATE_UP: full[GATE_UP][:4]})            # 4 experts, not 5
  vl_refused(vl_moe_dir, GATE_UP, "[4, 48, 64]", "[5, 48, 64]")
  router = "model.language_model.layers.0.mlp.gate.weight"
  save(vl_moe_dir, full | {router: full[router][:, :32]})
  vl_refused(vl_moe_dir, router, "[5, 32]", "[5, 64]")
  # Per-expert names (no transformers reader for this model): one line saying so.
  per_expert = {k: v for k, v in full.items() if ".experts." not in k}
  per_expert |= {f"model.language_model.layers.{i}.mlp.experts.{e}.down_proj.weight":
                 np.zeros((64, 24), np.float32) for i in (0, 2) for e in range(5)}
  save(vl_moe_dir, per_expert)
  vl_refused(vl_moe_dir, "per-expert tensors", "gate_up_proj")


def test_qwen3vl_moe_config_fields_are_checked(vl_moe_dir):
  edit_config(vl_moe_dir, lambda c: c["text_config"].update(num_local_experts=6))
  vl_refused(vl_moe_dir, "model.language_model.layers.0.mlp.", "[5, 64, 24]", "[6, 64, 24]")
  edit_config(vl_moe_dir, lambda c: c["text_config"].pop("num_local_experts"))
  vl_refused(vl_moe_dir, "config.json", "'num_experts'")
  edit_config(vl_moe_dir, lambda c: c["text_config"].update(num_experts=5,
                                                            mlp_only_layers=[7]))
  vl_refused(vl_moe_dir, "mlp_only_layers has [7]")
  edit_config(vl_moe_dir, lambda c: c["text_config"].update(mlp_only_layers=[1],
                                                            norm_topk_prob=False))
  vl_refused(vl_moe_dir, "norm_topk_prob=False", "renormalises")
  edit_config(vl_moe_dir, lambda c: c["text_config"].update(norm_topk_prob=True,
                                                            model_type="qwen3_vl_text"))
  vl_refused(vl_moe_dir, "text_config.model_type 'qwen3_vl_text'", "'qwen3_vl_moe_text'")
  edit_config(vl_moe_dir, lambda c: c.update(architectures=["Qwen3VLForConditionalGeneration"]))
  vl_refused(vl_moe_dir, "architectures", "Qwen3VLMoeForConditionalGeneration")


def test_qwen3vl_moe_refusals_are_one_line_from_the_cli(vl_moe_dir, tmp_path, capsys):
  from experiments.cli import run_main
  edit_config(vl_moe_dir, lambda c: c.update(model_type="qwen3_vl_moe_text"))
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={vl_moe_dir}",
                   f"--workdir={run}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "text decoder alone" in err and "\n" not in err
  assert not run.exists()
