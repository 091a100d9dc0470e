"""PVM on the whole Qwen3-VL against the authors' model, and the authors' checkpoint format.

The reference: transformers' `Qwen3VLForConditionalGeneration` (tiny, random
weights drawn large) with the authors' `PVMMemoryBlock` (rebuilt in
pvm_authors_torch.py) attached where their modified decoder layer has it:
`layers.<i>.pvm_block`, reading the post-attention residual, added beside the
MLP, its visual context the merged image embeddings before DeepStack, padded
per row. Its `save_pretrained` plus their `pvm_layers` / `pvm_hidden_size` in
text_config is a checkpoint in their format. With nonzero gates, two images
of different sizes and a text-only row:

  * our import of that checkpoint gives their logits;
  * our export of it loads into their model strictly by name, and our import of
    the export holds the same parameters bit for bit;
  * PVM added to the base checkpoint (gate 0) computes the base model's logits.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pvm_authors_torch import PVMMemoryBlock, authors_visual_context, block_kwargs  # noqa: E402

from experiments.hf.config import read_config_json  # noqa: E402
from experiments.hf.qwen3vl.export import qwen3vl_config_json, qwen3vl_to_hf  # noqa: E402
from experiments.hf.qwen3vl.load import load_qwen3vl, qwen3vl_config, vlm_logits  # noqa: E402
from experiments.hf.safetensors_io import write_file  # noqa: E402
from experiments.jobs.init_from import flat_params  # noqa: E402
from experiments.vlm.qwen3vl.pvm import with_pvm  # noqa: E402

IMG, VID, VS, VE = 90, 91, 92, 93
TEXT = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=128, hidden_act="silu",
            rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                 mrope_section=[4, 2, 2], mrope_interleaved=True))
VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, in_channels=3, out_hidden_size=64,
              num_position_embeddings=16, deepstack_visual_indexes=[0],
              hidden_act="gelu_pytorch_tanh")
PVM = dict(pvm_layers=[1, 2], pvm_hidden_size=32)


def _inputs():
  """Row 0: a 4-token image; row 1: an 8-token image; row 2: text only (right-padded)."""
  rows = [[5, 6, VS, *[IMG] * 4, VE, 7, 8, 9, 10],
          [5, VS, *[IMG] * 8, VE, 11, 12, 13],
          [5, 14, 15, 16, 17, 18, 19, 20, 21]]
  T = max(map(len, rows))
  ids = np.zeros((3, T), np.int64)
  mask = np.zeros((3, T), np.int64)
  for b, r in enumerate(rows):
    ids[b, :len(r)], mask[b, :len(r)] = r, 1
  grid = np.array([[1, 4, 4], [1, 4, 8]], np.int64)
  pixels = np.random.default_rng(0).normal(size=(48, 96)).astype(np.float32)
  return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels,
          "image_grid_thw": grid, "mm_token_type_ids": (ids == IMG).astype(np.int64)}


def _hf_model(seed=0):
  config = transformers.Qwen3VLConfig(text_config=TEXT, vision_config=VISION,
                                      image_token_id=IMG, video_token_id=VID,
                                      vision_start_token_id=VS, vision_end_token_id=VE,
                                      tie_word_embeddings=False,
                                      attn_implementation="eager")
  torch.manual_seed(seed)
  model = transformers.Qwen3VLForConditionalGeneration(config).eval()
  _redraw(model)
  return model


def _redraw(module):
  """Weights large enough that a wrong transpose or mask shows (std 0.02 hides them)."""
  with torch.no_grad():
    for name, p in module.named_parameters():
      if name.endswith("norm.weight") or name.endswith(("q_norm.weight", "k_norm.weight")):
        p.uniform_(0.5, 1.5)
      elif name.endswith("gate_alpha"):
        p.uniform_(0.5, 1.0)
      elif p.ndim == 1:
        p.normal_(0.0, 0.5)
      elif "embed" in name:
        p.normal_(0.0, 1.0)
      else:
        p.normal_(0.0, 1.5 / p[0].numel() ** 0.5)


def _attach_pvm(model, seed=1):
  """The authors' blocks at PVM["pvm_layers"], wired as their decoder layer does."""
  lm = model.model.language_model
  state = {}

  def visual_memory(module, args, kwargs):
    # What their PVMQwen3VLModel.forward hands every layer: the image embeddings
    # before DeepStack, padded per row, and the image-position mask.
    state["context"], state["mask"] = authors_visual_context(kwargs["inputs_embeds"],
                                                             kwargs["visual_pos_masks"])
    state["visual"] = kwargs["visual_pos_masks"]

  lm.register_forward_pre_hook(visual_memory, with_kwargs=True)
  torch.manual_seed(seed)
  for i in PVM["pvm_layers"]:
    layer = lm.layers[i]
    layer.pvm_block = PVMMemoryBlock(**block_kwargs({**TEXT, **PVM}))
    _redraw(layer.pvm_block)
    layer.post_attention_layernorm.register_forward_pre_hook(
        lambda m, args, i=i: state.__setitem__(f"residual{i}", args[0]))
    layer.mlp.register_forward_hook(
        lambda m, args, out, i=i, block=layer.pvm_block: out + block(
            state[f"residual{i}"], state["context"], state["mask"], state["visual"]))
  return model


def _torch_logits(model, inputs):
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(inputs["input_ids"]),
                attention_mask=torch.from_numpy(inputs["attention_mask"]),
                pixel_values=torch.from_numpy(inputs["pixel_values"]),
                image_grid_thw=torch.from_numpy(inputs["image_grid_thw"]),
                mm_token_type_ids=torch.from_numpy(inputs["mm_token_type_ids"]))
  return out.logits.numpy()


def _with_pvm_fields(path):
  config = json.loads((path / "config.json").read_text())
  config["text_config"].update(PVM)
  (path / "config.json").write_text(json.dumps(config))


def _params(model):
  return {k: np.asarray(v) for k, v in flat_params(nnx.state(model, nnx.Param)).items()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  root = tmp_path_factory.mktemp("pvm_authors")
  hf = _hf_model()
  hf.save_pretrained(root / "base")
  _attach_pvm(hf)
  hf.save_pretrained(root / "pvm")   # their layout: pvm_block tensors beside the backbone
  _with_pvm_fields(root / "pvm")
  return root, hf


def _close(got, want, mask):
  real = mask.astype(bool)
  scale = np.abs(want[real]).max()
  np.testing.assert_allclose(got[real], want[real], rtol=0, atol=2e-5 * scale)


def test_authors_checkpoint_gives_their_logits(checkpoints):
  root, hf = checkpoints
  inputs = _inputs()
  want = _torch_logits(hf, inputs)
  model, config = load_qwen3vl(root / "pvm")
  assert config.text.ffn_branch_layers == (1, 2)
  assert float(model.lm.blocks[1].ffn_branch.gate[...]) > 0.4   # their gate, nonzero
  got = vlm_logits(model, inputs)
  _close(got, want, inputs["attention_mask"])
  # The branches matter at this scale: without them the logits differ by O(1).
  base = _torch_logits(_hf_model(), inputs)
  assert np.abs(base - want)[inputs["attention_mask"].astype(bool)].max() > 0.1


def test_a_checkpoint_saved_by_their_class_name_imports(checkpoints, tmp_path):
  """Their PVMQwen3VLForConditionalGeneration writes its own name in `architectures`:
  read like transformers' class, the same logits; any other name is refused."""
  root, _ = checkpoints
  theirs = tmp_path / "theirs"
  shutil.copytree(root / "pvm", theirs)
  config = json.loads((theirs / "config.json").read_text())
  config["architectures"] = ["PVMQwen3VLForConditionalGeneration"]
  (theirs / "config.json").write_text(json.dumps(config))
  inputs = _inputs()
  want = vlm_logits(load_qwen3vl(root / "pvm")[0], inputs)
  np.testing.assert_array_equal(vlm_logits(load_qwen3vl(theirs)[0], inputs), want)
  config["architectures"] = ["SomethingElseForConditionalGeneration"]
  (theirs / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="PVMQwen3VLForConditionalGeneration"):
    load_qwen3vl(theirs)


def test_export_loads_into_their_model_and_imports_back_bit_for_bit(checkpoints, tmp_path):
  root, _ = checkpoints
  model, config = load_qwen3vl(root / "pvm")
  out = tmp_path / "export"
  out.mkdir()
  tensors = qwen3vl_to_hf(model)
  write_file(out / "model.safetensors", tensors, {"format": "pt"})
  exported = qwen3vl_config_json(config, read_config_json(root / "pvm"))
  (out / "config.json").write_text(json.dumps(exported))
  assert exported["text_config"]["pvm_layers"] == [1, 2]
  assert exported["text_config"]["pvm_hidden_size"] == 32
  back, back_config = load_qwen3vl(out)
  assert back_config == config
  a, b = _params(model), _params(back)
  assert set(a) == set(b)
  for key in a:
    assert a[key].tobytes() == b[key].tobytes(), key
  # Their model (HF + PVMMemoryBlock) takes exactly these names and shapes.
  theirs = _attach_pvm(_hf_model(seed=5), seed=6)
  theirs.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()},
                         strict=True)
  inputs = _inputs()
  _close(vlm_logits(model, inputs), _torch_logits(theirs, inputs), inputs["attention_mask"])


def test_pvm_added_to_the_base_checkpoint_is_the_base_model_at_step_0(checkpoints):
  root, _ = checkpoints
  base, config = load_qwen3vl(root / "base")
  assert not config.text.ffn_branch_layers
  with_branches = with_pvm(qwen3vl_config(read_config_json(root / "base")), (1, 2), 32)
  model, _ = load_qwen3vl(root / "base", config=with_branches)
  assert float(model.lm.blocks[1].ffn_branch.gate[...]) == 0.0
  inputs = _inputs()
  np.testing.assert_array_equal(vlm_logits(model, inputs), vlm_logits(base, inputs))
