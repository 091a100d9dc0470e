"""Qwen3-VL-MoE checkpoints (Qwen3-VL-30B-A3B's class) in and out: logits equal `transformers'`.

The tiny random `Qwen3VLMoeForConditionalGeneration` of conftest.py (float32,
weights drawn large; layer 1 dense through `mlp_only_layers`) is read in both
fused expert layouts: transformers 5's `save_pretrained` and the Hub's. The
batch is test_qwen3vl_parity.py's (a row with one image, a row with two, a
text-only row, left-padded); routing is dropless (no capacity), as transformers'.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx
from test_qwen3vl_parity import IMAGE, _inputs, assert_logits_equal, close

from experiments.cli import run_main
from experiments.hf import qwen3_moe, vlm_logits
from experiments.hf.qwen3vl.export import qwen3vl_config_json
from experiments.hf.qwen3vl.load import experts_layout_of, load_qwen3vl, qwen3vl_config
from experiments.hf.safetensors_io import Checkpoint, HFCheckpointError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
# The tiny checkpoint has no tokenizer.json: import-hf says so.
pytestmark = pytest.mark.filterwarnings("ignore:.*has no tokenizer.json:UserWarning")


def hf_logits(model, inputs):
  with torch.no_grad():
    return model(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()


@pytest.fixture(scope="module")
def setup(qwen3vl_moe_checkpoint):
  path, hf = qwen3vl_moe_checkpoint
  inputs = _inputs()
  model, config = load_qwen3vl(path)
  return dict(path=path, hub=path.parent / "hub", hf=hf, inputs=inputs, model=model,
              config=config, hf_logits=hf_logits(hf, inputs))


def params(model) -> dict:
  return {path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_config_mapping(setup):
  text = setup["config"].text
  assert text.moe_layers == (0, 2) and text.ffn_dim == 96 and text.qk_norm
  assert text.mrope_section == (2, 3, 3) and text.mrope_interleaved
  assert (text.moe.n_experts, text.moe.top_k, text.moe.expert_ffn_dim) == (5, 2, 24)
  # Always renormalised (transformers' router); its balance loss is k times ours.
  assert text.moe.norm_topk_prob and text.moe.n_shared_experts == 0
  assert text.moe.balance_coef == 0.002
  hf = json.loads((setup["path"] / "config.json").read_text())
  assert hf["text_config"]["tie_word_embeddings"] and not text.tie_embeddings
  step2 = dict(hf, text_config=dict(hf["text_config"], decoder_sparse_step=2, mlp_only_layers=[]))
  assert qwen3vl_config(step2).text.moe_layers == (1,)
  # Tying is the top-level flag alone (default false), as transformers reads it.
  assert qwen3vl_config(dict(hf, tie_word_embeddings=True)).text.tie_embeddings
  del hf["tie_word_embeddings"]
  assert not qwen3vl_config(hf).text.tie_embeddings
  # A config.json written from the config alone (a run with no source) reads back to it.
  fresh = qwen3vl_config_json(setup["config"])
  assert fresh["model_type"] == "qwen3_vl_moe" and "norm_topk_prob" not in fresh["text_config"]
  assert qwen3vl_config(fresh) == setup["config"]
  # What the class cannot express is refused by the export, in one line.
  plain = text.replace(moe=text.moe.replace(norm_topk_prob=False))
  with pytest.raises(HFCheckpointError, match="always renormalises"):
    qwen3vl_config_json(setup["config"].replace(text=plain))


def test_logits_equal_transformers(setup):
  real = assert_logits_equal(setup["model"], setup["inputs"], setup["hf_logits"])
  inputs = setup["inputs"]
  # Text alone (no pixel_values): the batch with its image tokens made text (same shapes,
  # so the decoder's compiled operations are reused).
  ids = np.where(inputs["input_ids"] == IMAGE, 7, inputs["input_ids"])
  text = dict(input_ids=ids, attention_mask=inputs["attention_mask"])
  text_want = hf_logits(setup["hf"], text)
  close(vlm_logits(setup["model"], text)[real], text_want[real])
  # The comparison can fail: two experts swapped in one layer move the logits by O(1).
  model, _ = load_qwen3vl(setup["path"])
  w = model.lm.blocks[2].mlp.w_up
  w[...] = w[...][::-1]
  moved = vlm_logits(model, text)[real] - text_want[real]
  assert np.abs(moved).max() > 1e-2 * np.abs(text_want[real]).max()


def test_the_hubs_expert_layout_reads_the_same(setup):
  hub = setup["hub"]
  assert Checkpoint(hub).shape("model.language_model.layers.0.mlp.experts.gate_up_proj") == (
      5, 64, 48)
  assert experts_layout_of(Checkpoint(hub), setup["config"]) == "fused_in_out"
  assert experts_layout_of(Checkpoint(setup["path"]), setup["config"]) == "fused"
  got, want = params(load_qwen3vl(hub)[0]), params(setup["model"])
  assert got.keys() == want.keys()
  for path in want:
    np.testing.assert_array_equal(got[path], want[path], err_msg=str(path))


def _subset(source, out, where="config.json"):
  """Every field of `source` is in `out` with the same value (the export may add fields)."""
  for key, value in source.items():
    assert key in out, f"{where}: {key} dropped"
    if isinstance(value, dict):
      _subset(value, out[key], f"{where}.{key}")
    else:
      assert out[key] == value, f"{where}.{key}: {out[key]!r} != {value!r}"


@pytest.mark.parametrize("layout", ["hf", "hub"])
def test_import_export_round_trip_is_bit_exact(setup, layout, tmp_path):
  """import-hf then export-hf gives back every tensor (names, dtypes, bits: the layout
  read is the layout written) and the config.json's fields; transformers loads it."""
  source = setup["path"] if layout == "hf" else setup["hub"]
  run, out = tmp_path / "run", tmp_path / "out"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={source}", f"--workdir={run}"]) == 0
  assert run_main(["lngram-exp", "export-hf", f"--workdir={run}", f"--out={out}"]) == 0
  exported, original = Checkpoint(out), Checkpoint(source)
  assert exported.names() == original.names()
  for name in sorted(original.names()):
    a, b = exported.tensor(name), original.tensor(name)
    assert a.dtype == b.dtype and a.shape == b.shape, name
    np.testing.assert_array_equal(a, b, err_msg=name)
  config = json.loads((out / "config.json").read_text())
  _subset(json.loads((source / "config.json").read_text()), config)
  assert config["architectures"] == ["Qwen3VLMoeForConditionalGeneration"]
  if layout == "hf":   # transformers reads the export (the Hub layout: the test above)
    reloaded = transformers.Qwen3VLMoeForConditionalGeneration.from_pretrained(
        out, attn_implementation="eager").eval()
    real = setup["inputs"]["attention_mask"].astype(bool)
    close(hf_logits(reloaded, setup["inputs"])[real], setup["hf_logits"][real])


@pytest.mark.parametrize("d_model, width", [(32, 16), (16, 16)])
def test_the_layouts_are_told_apart_where_one_tensor_is_square(d_model, width):
  """D = 2h squares gate_up_proj, h = D down_proj: the other tensor decides."""
  from experiments.hf.qwen3vl import moe
  from experiments.models.config import LMConfig
  from experiments.models.moe import MoEConfig
  lm = LMConfig(d_model=d_model, n_layers=1, moe_layers=(0,),
                moe=MoEConfig(d_model=d_model, n_experts=3, top_k=1, expert_ffn_dim=width))

  class Files:   # a checkpoint's names and shapes alone
    dir = "ckpt"

    def __init__(self, shapes):
      self.shapes = shapes

    def names(self):
      return set(self.shapes)

    def shape(self, name):
      return self.shapes[name]

  for layout in moe.LAYOUTS:
    files = Files(qwen3_moe.layer_shapes(lm, 0, layout))
    assert moe.experts_layout(files, lm, lambda name: name) == layout
