"""What import-hf and export-hf read, keep and drop, said out loud.

* A directory with both `model.safetensors` and an index + shards reads the
  single file, as transformers does (two different weight sets tell which).
* tie_word_embeddings=true beside a distinct `lm_head.weight`: the head is kept
  (untied), as transformers 5 does; an equal head stays tied.
* A tokenizer.json with more ids than the embedding has rows is refused; a
  checkpoint without tokenizer.json whose vocabulary is not the 256 bytes is
  imported with a warning.
* export-hf of a run whose branch has no HF form names it and its size.
Reference logits come live from `transformers` (tests/experiments/hf/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from test_hf_atomic import _lm_run

from experiments.cli import run_main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[3]
TOKENS_BxT = np.random.default_rng(1).integers(3, 96, (2, 16))


def _tensors(folder: Path) -> dict:
  from safetensors.numpy import load_file
  out = {}
  for shard in sorted(folder.glob("*.safetensors")):
    out |= load_file(shard)
  return out


def _single_file(source: Path, folder: Path, tensors: dict) -> None:
  """`source`'s config files, with `tensors` as one model.safetensors."""
  from safetensors.numpy import save_file
  folder.mkdir()
  for path in source.glob("*.json"):
    if not path.name.endswith(".index.json"):
      shutil.copyfile(path, folder / path.name)
  save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _hf_logits(folder: Path, **kwargs) -> np.ndarray:
  hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                         **kwargs).eval()
  with torch.no_grad():
    return hf(torch.tensor(TOKENS_BxT)).logits.numpy()


def _our_logits(folder: Path) -> np.ndarray:
  from experiments.hf import load_hf
  model, _ = load_hf(folder)
  return np.asarray(model(jnp.asarray(TOKENS_BxT)))


def close(got, want):
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_single_file_beside_an_index_is_read_as_transformers_reads_it(hf_checkpoints,
                                                                       tmp_path):
  source, _ = hf_checkpoints["qwen3"]     # an index + shards: weights A
  both = tmp_path / "both"
  shutil.copytree(source, both)
  rng = np.random.default_rng(3)
  b = {k: (v * rng.uniform(0.5, 1.5, v.shape)).astype(v.dtype)   # weights B
       for k, v in _tensors(source).items()}
  from safetensors.numpy import save_file
  save_file(b, both / "model.safetensors", metadata={"format": "pt"})
  only_b = tmp_path / "only_b"
  _single_file(source, only_b, b)
  want = _hf_logits(both)
  close(want, _hf_logits(only_b))                  # transformers reads the single file
  assert np.abs(want - _hf_logits(source)).max() > 1e-2 * np.abs(want).max()
  with pytest.warns(UserWarning, match="holds both model.safetensors and") as caught:
    got = _our_logits(both)
  assert len(caught) == 1 and "\n" not in str(caught[0].message)
  close(got, want)


def test_tied_config_with_a_distinct_head_keeps_the_head(hf_checkpoints, tmp_path, capsys):
  from experiments import restore
  from experiments.hf import load_hf
  source, _ = hf_checkpoints["qwen3"]     # tie_word_embeddings=true, no lm_head.weight
  tensors = _tensors(source)
  embed = tensors["model.embed_tokens.weight"]
  head = np.random.default_rng(4).normal(size=embed.shape).astype(embed.dtype)
  distinct = tmp_path / "distinct"
  _single_file(source, distinct, tensors | {"lm_head.weight": head})
  assert json.loads((distinct / "config.json").read_text())["tie_word_embeddings"]
  want = _hf_logits(distinct, tie_word_embeddings=False)   # the reference with that head
  assert np.abs(want - _hf_logits(source)).max() > 1e-2 * np.abs(want).max()
  with pytest.warns(UserWarning, match="lm_head.weight differs") as caught:
    model, config = load_hf(distinct)
  assert len(caught) == 1 and "\n" not in str(caught[0].message)
  assert not config.tie_embeddings
  close(np.asarray(model(jnp.asarray(TOKENS_BxT))), want)
  # import-hf keeps it; the run restores untied with the same logits.
  run = tmp_path / "run"
  with pytest.warns(UserWarning, match="lm_head.weight differs"):
    assert run_main(["lngram-exp", "import-hf", f"--hf_dir={distinct}",
                     f"--workdir={run}"]) == 0
  restored, _ = restore(run)
  assert not restored.config.tie_embeddings
  close(np.asarray(restored(jnp.asarray(TOKENS_BxT))), want)
  # A tied model (init_from=hf:DIR) cannot hold that head: refused in one line.
  from flax import nnx

  from experiments.hf.load import fill_backbone
  from experiments.models import DecoderLM
  tied = DecoderLM(load_hf(source)[1], rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="lm_head.weight differs") as e:
    fill_backbone(tied, distinct)
  assert "\n" not in str(e.value)


def test_tied_config_with_an_equal_head_stays_tied(hf_checkpoints, tmp_path, recwarn):
  from experiments.hf import load_hf
  source, _ = hf_checkpoints["qwen3"]
  tensors = _tensors(source)
  equal = tmp_path / "equal"
  _single_file(source, equal, tensors | {"lm_head.weight": tensors["model.embed_tokens.weight"]})
  model, config = load_hf(equal)
  assert config.tie_embeddings
  assert not [w for w in recwarn if "lm_head" in str(w.message)]
  close(np.asarray(model(jnp.asarray(TOKENS_BxT))), _hf_logits(source))


def _word_tokenizer(folder: Path, words: int) -> None:
  """A word-level tokenizer.json of words + 1 ids."""
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  trainer = tokenizers.trainers.WordLevelTrainer(vocab_size=words + 1, special_tokens=["[UNK]"])
  tok.train_from_iterator([" ".join(f"w{i}" for i in range(words))] * 3, trainer)
  tok.save(str(folder / "tokenizer.json"))
  assert tok.get_vocab_size() == words + 1


def test_a_tokenizer_larger_than_the_embedding_is_refused(hf_checkpoints, tmp_path, capsys):
  source, _ = hf_checkpoints["qwen3"]     # 256 embedding rows
  hf = tmp_path / "hf"
  shutil.copytree(source, hf)
  _word_tokenizer(hf, 319)                # 320 ids
  run = tmp_path / "run"
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={hf}", f"--workdir={run}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err
  assert "320" in err and "256" in err and "tokenizer.json" in err
  assert not run.exists()
  _word_tokenizer(hf, 255)                # 256 ids: fits
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={hf}", f"--workdir={run}"]) == 0
  assert (run / "tokenizer.json").is_file()


def test_no_tokenizer_and_not_bytes_is_said(hf_checkpoints, tmp_path, recwarn):
  llama, _ = hf_checkpoints["llama"]      # 96 tokens, no tokenizer.json
  with pytest.warns(UserWarning, match="no tokenizer.json") as caught:
    assert run_main(["lngram-exp", "import-hf", f"--hf_dir={llama}",
                     f"--workdir={tmp_path / 'llama'}"]) == 0
  (message,) = [str(w.message) for w in caught if "tokenizer" in str(w.message)]
  assert "96" in message and "\n" not in message
  qwen3, _ = hf_checkpoints["qwen3"]      # 256 tokens: byte ids are its ids, nothing to say
  recwarn.clear()
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={qwen3}",
                   f"--workdir={tmp_path / 'qwen3'}"]) == 0
  assert not [w for w in recwarn if "tokenizer" in str(w.message)]


def _cli(*args) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
  return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


def test_export_of_a_branch_without_hf_form_names_what_it_leaves_out(tmp_path):
  run = tmp_path / "pkm"
  _lm_run(run, "lm_pkm.py:smoke")
  done = _cli("export-hf", f"--workdir={run}", f"--out={tmp_path / 'out'}")
  assert done.returncode == 0, done.stderr
  lines = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
  assert lines == ["warning: the pkm memory (layer 1, 8,976 parameters) has no Hugging "
                      "Face form and is not exported; the export holds the backbone only."]
  assert "done: 20 tensors" in done.stdout
  # An Lngram v2 run's memory is exported (lngram_v2.safetensors): nothing to warn.
  lngram = tmp_path / "lngram"
  _lm_run(lngram, "lm_lngram.py:smoke")
  from experiments.jobs.hf_runs import export_hf
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    export_hf(lngram, tmp_path / "lngram_out")
