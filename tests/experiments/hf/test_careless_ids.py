"""Ids that meet a model they do not belong to are refused in one line (careless-user
cases): `sample` on an imported run without its tokenizer (bytes would be read as the
checkpoint's ids), a prompt whose ids lie past the vocabulary, byte decoding of ids that
are not bytes, and `train --config.init_from=hf:DIR` on byte data with a checkpoint that
has its own tokenizer or a vocabulary other than 256."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from test_hf_runs import hf_lngram_config

from experiments.cli import run_main
from experiments.hf.backbone import with_hf_backbone
from experiments.jobs.lm.sample import decode

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_run(hf_checkpoints, tmp_path_factory):
  """import-hf of the 96-token Llama checkpoint, which has no tokenizer.json."""
  path, _ = hf_checkpoints["llama"]
  run = tmp_path_factory.mktemp("careless") / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={path}", f"--workdir={run}"]) == 0
  return run


def test_sampling_a_run_without_its_tokenizer_is_refused(llama_run, capsys):
  capsys.readouterr()
  assert run_main(["lngram-exp", "sample", f"--workdir={llama_run}", "--prompt=def ",
                   "--max_new_tokens=4", "--greedy"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err
  assert "no tokenizer.json" in err and "96" in err


def test_prompt_ids_past_the_vocabulary_are_refused(llama_run):
  from experiments import restore
  from experiments.jobs.lm.sample import sample_text
  model, _ = restore(llama_run)

  class Wide:   # a tokenizer larger than the model's 96 ids
    unit = "tokens"

    def encode(self, text):
      return np.asarray([5, 300], np.int32)

    def decode(self, ids):
      return ""

  with pytest.raises(ValueError, match="id 300, outside the model's vocabulary of 96"):
    sample_text(model, ["x"], max_new_tokens=2, greedy=True, codec=Wide())


def test_byte_decoding_refuses_ids_that_are_not_bytes():
  assert decode([104, 105]) == "hi"
  with pytest.raises(ValueError, match="token id 291 is not a byte"):
    decode([104, 291])


def test_init_from_hf_on_byte_data_needs_a_byte_checkpoint(hf_checkpoints, tmp_path):
  qwen3, _ = hf_checkpoints["qwen3"]   # 256 ids, no tokenizer: byte data is fine
  with_hf_backbone(hf_lngram_config(qwen3))
  with_tokenizer = tmp_path / "q"
  shutil.copytree(qwen3, with_tokenizer)
  (with_tokenizer / "tokenizer.json").write_text("{}")
  with pytest.raises(ValueError, match="has its own tokenizer.json .*data.kind=tokens"):
    with_hf_backbone(hf_lngram_config(with_tokenizer))


def test_init_from_hf_follows_a_distinct_head_beside_a_tied_config(hf_checkpoints, tmp_path):
  """config.json ties but the files hold another lm_head.weight: the run is untied (as
  the import and transformers 5 read it), not refused and not silently tied."""
  from test_hf_checkpoint_checks import _single_file, _tensors
  source, _ = hf_checkpoints["qwen3"]
  tensors = _tensors(source)
  head = np.random.default_rng(4).normal(size=tensors["model.embed_tokens.weight"].shape)
  distinct = tmp_path / "distinct"
  _single_file(source, distinct, tensors | {"lm_head.weight": head.astype(np.float32)})
  assert with_hf_backbone(hf_lngram_config(source)).model.tie_embeddings
  assert not with_hf_backbone(hf_lngram_config(distinct)).model.tie_embeddings
