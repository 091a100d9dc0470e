"""PEFT LoRA adapters in and out (experiments/hf/peft_adapter.py), against peft itself.

A LoRA adapter made by peft on the tiny Qwen3 (all seven projections, nonzero B, k and v
with their own A) is imported onto the base (`import-hf --adapter`): our logits equal
peft's. The run exported with `export-hf --adapter` loads onto the base in peft with the
same logits; `export-hf` without it writes merged weights that transformers loads with
the same logits. Bad adapters (rank mismatch, unknown module, missing base) are one line.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from experiments import cli

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

TOKENS = np.array([[5, 17, 99, 3, 250, 42, 7, 8], [1, 2, 3, 4, 5, 6, 7, 9]])
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _theirs(model) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(TOKENS)).logits.numpy()


@pytest.fixture(scope="module")
def adapter(hf_checkpoints, tmp_path_factory):
  """(base dir, adapter dir, peft's logits) of a peft LoRA adapter on the tiny Qwen3."""
  from conftest import hf_model
  base_dir, _ = hf_checkpoints["qwen3"]
  config = peft.LoraConfig(r=4, lora_alpha=12, target_modules=MODULES, lora_dropout=0.0)
  model = peft.get_peft_model(hf_model("qwen3"), config)
  torch.manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "lora_" in name:
        p.normal_(0.0, 0.3)
  out = tmp_path_factory.mktemp("adapter")
  model.save_pretrained(out)
  return base_dir, out, _theirs(model.eval())


@pytest.fixture(scope="module")
def imported(adapter, tmp_path_factory):
  base_dir, adapter_dir, _ = adapter
  workdir = tmp_path_factory.mktemp("run") / "run"
  assert cli.run_main(["lngram-exp", "import-hf", f"--hf_dir={base_dir}",
                       f"--adapter={adapter_dir}", f"--workdir={workdir}"]) == 0
  return workdir


def test_a_peft_adapter_imports_with_peft_logits(adapter, imported):
  from experiments.jobs.restore import restore
  model, _ = restore(imported)
  # k and v hold their own A: the fused w_kv takes rank 2r, alpha 2α (the same scale).
  assert model.config.lora.rank == 8 and model.config.lora.alpha == 24.0
  np.testing.assert_allclose(np.asarray(model(TOKENS)), adapter[2], rtol=1e-4, atol=1e-4)


def test_export_adapter_loads_in_peft_and_merged_loads_in_transformers(adapter, imported,
                                                                       tmp_path):
  import transformers
  base_dir, _, want = adapter
  assert cli.run_main(["lngram-exp", "export-hf", f"--workdir={imported}",
                       f"--out={tmp_path / 'adapter'}", "--adapter"]) == 0
  written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
  assert written["r"] == 8 and sorted(written["target_modules"]) == sorted(MODULES)
  base = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
  loaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
  np.testing.assert_allclose(_theirs(loaded), want, rtol=1e-4, atol=1e-4)
  assert cli.run_main(["lngram-exp", "export-hf", f"--workdir={imported}",
                       f"--out={tmp_path / 'merged'}"]) == 0
  merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
  np.testing.assert_allclose(_theirs(merged), want, rtol=1e-4, atol=1e-4)


def _bad(adapter, tmp_path, capsys, edit, base=None) -> str:
  base_dir, adapter_dir, _ = adapter
  bad = tmp_path / "bad"
  shutil.copytree(adapter_dir, bad)
  edit(bad)
  assert cli.run_main(["lngram-exp", "import-hf", f"--hf_dir={base or base_dir}",
                       f"--adapter={bad}", f"--workdir={tmp_path / 'run'}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error:") and "\n" not in err and not (tmp_path / "run").exists()
  return err


def test_bad_adapters_are_one_line(adapter, tmp_path, capsys):
  def rank(d):
    c = json.loads((d / "adapter_config.json").read_text())
    (d / "adapter_config.json").write_text(json.dumps(c | {"r": 5}))

  def unknown(d):
    from safetensors.numpy import load_file, save_file
    t = load_file(str(d / "adapter_model.safetensors"))
    save_file({k.replace("layers.0.mlp.up_proj", "layers.0.mlp.in_proj"): v
               for k, v in t.items()}, str(d / "adapter_model.safetensors"))

  assert "rank mismatch" in _bad(adapter, tmp_path / "r", capsys, rank)
  assert "unknown target module model.layers.0.mlp.in_proj" in _bad(
      adapter, tmp_path / "u", capsys, unknown)
  assert "no_base: not a directory" in _bad(adapter, tmp_path / "m", capsys, lambda d: None,
                                           base=tmp_path / "no_base")
