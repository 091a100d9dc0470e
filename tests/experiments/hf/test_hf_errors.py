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


def refused(path, *needles, **kw):
  with pytest.raises(HFCheckpointError) as e:
    load_hf(path, **kw)
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
