"""A run imported from Hugging Face samples with the checkpoint's tokenizer and stops at
its EOS: the prompt is encoded, the continuation decoded, both with tokenizer.json. The
reference continuation is transformers' own greedy decoding (tests/experiments/hf/conftest.py),
with a tiny word-level tokenizer trained here by `tokenizers`."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from experiments.cli import run_main
from experiments.jobs.lm.codec import cut_at_eos, eos_ids, hf_codec

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPTS = ("w3 w7 w11", "w9 w49 w89 w6", "w1 w2", "w120 w30 w77 w5", "w60 w61 w62")


def _tokenizer(path):
  """A word-level tokenizer of 201 ids (w0..w199 and [UNK]), below the model's 256."""
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  trainer = tokenizers.trainers.WordLevelTrainer(vocab_size=300, special_tokens=["[UNK]"])
  tok.train_from_iterator([" ".join(f"w{i}" for i in range(200))] * 3, trainer)
  tok.save(str(path / "tokenizer.json"))
  return tok


def _greedy(model, ids, n):
  ids = list(ids)
  with torch.no_grad():
    for _ in range(n):
      ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
  return ids


def test_sample_encodes_with_the_tokenizer_and_stops_at_eos(hf_checkpoints, tmp_path, capsys):
  source, hf = hf_checkpoints["qwen3"]
  hf_dir = tmp_path / "hf"
  shutil.copytree(source, hf_dir)
  tok = _tokenizer(hf_dir)

  def continuation(prompt):
    """(prompt, transformers' greedy continuation, where a fresh token could end it)."""
    ids = tok.encode(prompt).ids
    new = _greedy(hf, ids, 12)[len(ids):]
    cuts = [i for i in range(1, len(new)) if new[i] not in new[:i]
            and tok.decode(new[:i], skip_special_tokens=False)]
    return prompt, new, cuts

  # EOS: a token transformers generates later in the continuation, not before (the
  # random model's greedy rows often repeat one token: take a prompt where it does not).
  prompt, new, cuts = next(c for c in map(continuation, PROMPTS) if c[2])
  cut = cuts[0]
  (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [new[cut]]}))
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={hf_dir}", f"--workdir={run}"]) == 0
  capsys.readouterr()
  assert run_main(["lngram-exp", "sample", f"--workdir={run}", f"--prompt={prompt}",
                   "--greedy", "--max_new_tokens=12"]) == 0
  out = capsys.readouterr().out
  want = tok.decode(new[:cut], skip_special_tokens=False)
  assert want and out == f"--- {prompt!r}\n{prompt}{want}\n"


def test_eos_ids_from_generation_config_then_config_json(tmp_path):
  assert eos_ids(tmp_path) == () and hf_codec(tmp_path) is None
  (tmp_path / "hf_config.json").write_text(json.dumps({"eos_token_id": 2}))
  assert eos_ids(tmp_path) == (2,)
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
  assert eos_ids(tmp_path) == (5, 7)
  assert cut_at_eos(np.array([1, 3, 7, 5, 4]), (5, 7)) == [1, 3]
  assert cut_at_eos([1, 3], (5, 7)) == [1, 3]
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
  with pytest.raises(ValueError, match=r"eos_token_id='x' is not a token id"):
    eos_ids(tmp_path)
