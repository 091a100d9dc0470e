"""Qwen3-VL from a Hugging Face checkpoint: logits and greedy generation equal `transformers`'.

A tiny random `Qwen3VLForConditionalGeneration` (two ViT layers, two DeepStack
mergers, a 3-layer decoder with interleaved MRoPE), weights redrawn large so
that a wrong transpose or position changes logits by O(1). One batch holds a
row with one image, a row with two images of different grids and a text-only
row, left-padded as transformers' `generate` wants; inputs are built directly
(image pad tokens + pixel_values of the grids' shapes), not by a processor.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from experiments import restore
from experiments.cli import run_main
from experiments.hf import vlm_logits
from experiments.hf.qwen3vl.load import load_qwen3vl
from experiments.hf.safetensors_io import HFCheckpointError
from experiments.vlm.qwen3vl.generate import greedy_generate, greedy_generate_uncached, pack_right
from experiments.vlm.qwen3vl.model import Qwen3VL
from experiments.vlm.qwen3vl.positions import rope_index

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

V, IMAGE, VIDEO, START, END = 300, 290, 291, 288, 289
GRIDS = [(1, 4, 4), (1, 4, 4), (1, 8, 4)]     # row 0: one image; row 1: two of different size


# The tower and the ids; the decoder's shape (tests/experiments/hf/conftest.py's
# Qwen3-VL-MoE keeps it, its FFNs aside).
VISION_AND_IDS = dict(
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2,
                       patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                       out_hidden_size=64, num_position_embeddings=16,
                       deepstack_visual_indexes=[0, 1]),
    image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
    vision_end_token_id=END)
TEXT = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                 mrope_section=[2, 3, 3], mrope_interleaved=True))


def _hf_model():
  config = transformers.Qwen3VLConfig(text_config=TEXT, **VISION_AND_IDS,
                                      attn_implementation="eager")
  torch.manual_seed(0)
  return redraw_large(transformers.Qwen3VLForConditionalGeneration(config).eval())


def redraw_large(model):
  """`model` (a transformers Qwen3-VL or Qwen3-VL-MoE) with its weights redrawn large, so
  that a wrong transpose or position changes logits by O(1)."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        p.uniform_(0.5, 1.5)
      elif p.ndim == 1:
        p.normal_(0.0, 0.5)
      elif "embed_tokens" in name or "pos_embed" in name:
        p.normal_(0.0, 1.0)
      else:   # fan-in: a row of [out, ...]; fused experts [E, out, in]: their last axis
        p.normal_(0.0, 1.5 / (p.shape[-1] if ".experts." in name else p[0].numel()) ** 0.5)
  return model


def _inputs():
  rng = np.random.default_rng(0)

  def row(grids, n_text):
    ids = [5, 6]
    for _, h, w in grids:
      ids += [START] + [IMAGE] * (h * w // 4) + [END, 7]
    return ids + list(rng.integers(0, 280, n_text))

  rows = [row(GRIDS[:1], 3), row(GRIDS[1:], 2), row([], 9)]
  T = max(map(len, rows))
  ids, mask = np.zeros((3, T), np.int64), np.zeros((3, T), np.int64)
  for b, r in enumerate(rows):        # left padding, as transformers' generate wants
    ids[b, T - len(r):], mask[b, T - len(r):] = r, 1
  n_patches = sum(t * h * w for t, h, w in GRIDS)
  return dict(input_ids=ids, attention_mask=mask,
              pixel_values=rng.normal(size=(n_patches, 3 * 2 * 4 * 4)).astype(np.float32),
              image_grid_thw=np.array(GRIDS, np.int64),
              mm_token_type_ids=(ids == IMAGE).astype(np.int64))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  hf = _hf_model()
  path = tmp_path_factory.mktemp("qwen3vl") / "hf"
  hf.save_pretrained(path)
  inputs = _inputs()
  with torch.no_grad():
    logits = hf(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()
  model, config = load_qwen3vl(path)
  return dict(hf=hf, path=path, inputs=inputs, hf_logits=logits, model=model, config=config)


def close(got, want):
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def assert_logits_equal(model, inputs, want):
  """vlm_logits of `inputs` equal transformers' `want` at the real tokens (returned)."""
  real = inputs["attention_mask"].astype(bool)
  got = vlm_logits(model, inputs)
  assert got.dtype == np.float32 and got.shape == want.shape
  assert np.abs(want[real]).max() > 3      # large weights: errors would show
  close(got[real], want[real])
  return real


def test_logits_equal_transformers(setup):
  inputs, want = setup["inputs"], setup["hf_logits"]
  real = assert_logits_equal(setup["model"], inputs, want)
  # The same rows padded on the right give the same logits at the real tokens.
  packed = pack_right(inputs)
  right = vlm_logits(setup["model"], {k: packed[k] for k in inputs})
  close(right[packed["attention_mask"].astype(bool)], want[real])


def test_rope_index_equals_transformers(setup):
  inputs = setup["inputs"]
  want, want_deltas = setup["hf"].model.get_rope_index(
      torch.tensor(inputs["input_ids"]), torch.tensor(inputs["mm_token_type_ids"]),
      image_grid_thw=torch.tensor(inputs["image_grid_thw"]),
      attention_mask=torch.tensor(inputs["attention_mask"]))
  got, deltas = rope_index(inputs["input_ids"], inputs["image_grid_thw"],
                           inputs["attention_mask"], setup["config"])
  np.testing.assert_array_equal(got, want.numpy())
  np.testing.assert_array_equal(deltas, want_deltas.numpy()[:, 0])
  # Without mm_token_type_ids the types come from the image token id: the same.
  again, _ = rope_index(inputs["input_ids"], inputs["image_grid_thw"],
                        inputs["attention_mask"], setup["config"],
                        mm_token_type_ids=inputs["mm_token_type_ids"])
  np.testing.assert_array_equal(again, got)


def test_greedy_generation_with_cache_equals_transformers(setup):
  inputs = setup["inputs"]
  T = inputs["input_ids"].shape[1]
  with torch.no_grad():
    want = setup["hf"].generate(**{k: torch.tensor(v) for k, v in inputs.items()},
                                max_new_tokens=16, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[:, T:].numpy()
  got = greedy_generate(setup["model"], inputs, 16)
  np.testing.assert_array_equal(got, want)
  # The cached path equals its uncached twin (the whole forward per token).
  np.testing.assert_array_equal(greedy_generate_uncached(setup["model"], inputs, 2), got[:, :2])


def test_import_hf_run_restores_the_vlm(setup, tmp_path, capsys):
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={setup['path']}",
                   f"--workdir={run}"]) == 0
  assert "step 0" in capsys.readouterr().out
  model, config = restore(run)
  assert isinstance(model, Qwen3VL) and config.restored_step == 0
  assert model.config == setup["config"]
  # Every parameter is the loaded model's, bit for bit (whose logits are HF's above).
  from flax import nnx
  got = nnx.to_flat_state(nnx.state(model, nnx.Param))
  want = dict(nnx.to_flat_state(nnx.state(setup["model"], nnx.Param)))
  assert len(got) == len(want)
  for path, value in got:
    np.testing.assert_array_equal(np.asarray(value[...]), np.asarray(want[path][...]))


def test_a_checkpoint_without_a_vision_tower_is_refused(setup, tmp_path, capsys):
  # config.json without vision_config: one line, exit 2, nothing written.
  no_config = tmp_path / "no_vision_config"
  shutil.copytree(setup["path"], no_config)
  hf = json.loads((no_config / "config.json").read_text())
  del hf["vision_config"]
  (no_config / "config.json").write_text(json.dumps(hf))
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={no_config}",
                   f"--workdir={run}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "vision tower" in err and "\n" not in err
  assert not run.exists()
  # Weights without model.visual.* tensors (a text-only save): one line too.
  from safetensors.numpy import load_file, save_file
  no_tensors = tmp_path / "no_vision_tensors"
  shutil.copytree(setup["path"], no_tensors)
  weights = load_file(no_tensors / "model.safetensors")
  save_file({k: v for k, v in weights.items() if not k.startswith("model.visual.")},
            no_tensors / "model.safetensors")
  with pytest.raises(HFCheckpointError, match="vision tower") as e:
    load_qwen3vl(no_tensors)
  assert "\n" not in str(e.value)


def test_mrope_options_are_validated_and_off_by_default():
  from experiments.models.config import LMConfig
  from experiments.models.layers import mrope_axes
  assert "mrope_section" not in LMConfig().to_dict()    # saved configs keep their JSON
  with pytest.raises(ValueError, match="must sum to head_dim/2"):
    LMConfig(head_dim=16, mrope_section=(2, 2, 2))
  # Interleaved: t h w t h w ... then t once h and w run out; blocks otherwise.
  np.testing.assert_array_equal(mrope_axes(16, (2, 3, 3), True), [0, 1, 2, 0, 1, 2, 0, 1])
  np.testing.assert_array_equal(mrope_axes(16, (4, 2, 2), False), [0] * 4 + [1] * 2 + [2] * 2)
