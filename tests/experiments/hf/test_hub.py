"""Hugging Face hub ids where a checkpoint or tokenizer directory is taken (experiments/hf/hub.py).

No network: a Hugging Face cache is laid out in tmp_path the way huggingface_hub
writes it (models--org--name/{refs/main, snapshots/<commit>/..., blobs/}), holding a
tiny Qwen3 checkpoint, and HF_HUB_OFFLINE=1 makes huggingface_hub read it alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from cli_runner import run_cli

from experiments import restore
from experiments.cli import run_main
from experiments.configs import load_config
from experiments.data.tokens import describe, prepare
from experiments.data.tokens.tokenizer import tokenizer_file
from experiments.hf import hub
from experiments.hf.backbone import with_hf_backbone
from experiments.jobs.hf_runs import import_hf
from experiments.jobs.lm.task import lm_task

huggingface_hub = pytest.importorskip("huggingface_hub")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKENS_BxT = np.random.default_rng(1).integers(3, 96, (2, 16))


def cache_repo(cache, repo_id: str, folder, *, commit: str = COMMIT, skip=()) -> None:
  """`folder`'s files as the `main` snapshot of hub model `repo_id` in the cache `cache`:
  content-addressed blobs, the snapshot's relative symlinks to them, refs/main."""
  storage = cache / f"models--{repo_id.replace('/', '--')}"
  (storage / "blobs").mkdir(parents=True, exist_ok=True)
  (storage / "refs").mkdir(exist_ok=True)
  snapshot = storage / "snapshots" / commit
  snapshot.mkdir(parents=True)
  for path in sorted(folder.iterdir()):
    if path.name in skip:
      continue
    data = path.read_bytes()
    blob = hashlib.sha256(data).hexdigest()
    (storage / "blobs" / blob).write_bytes(data)
    os.symlink(os.path.join("..", "..", "blobs", blob), snapshot / path.name)
  (storage / "refs" / "main").write_text(commit)


def scene_tokenizer(path):
  """A word-level tokenizer of 201 ids (w0..w199 and [UNK]), below the model's 256."""
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  trainer = tokenizers.trainers.WordLevelTrainer(vocab_size=300, special_tokens=["[UNK]"])
  tok.train_from_iterator([" ".join(f"w{i}" for i in range(200))] * 3, trainer)
  tok.save(str(path / "tokenizer.json"))


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
  """An empty Hugging Face cache, offline: the environment (for subprocesses) and
  huggingface_hub's constants, which it reads from the environment at import."""
  cache = tmp_path / "hf_cache"
  cache.mkdir()
  monkeypatch.setenv("HF_HUB_CACHE", str(cache))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(hub, "_resolved", {})
  return cache


@pytest.fixture
def hub_models(hf_checkpoints, offline_cache, tmp_path):
  """The cache holding the tiny Qwen3 as org/tiny (with a tokenizer.json), org/bare
  (without) and org/toks (its tokenizer files alone); returns the transformers model."""
  source, model = hf_checkpoints["qwen3"]
  folder = tmp_path / "checkpoint"
  shutil.copytree(source, folder)
  scene_tokenizer(folder)
  cache_repo(offline_cache, "org/tiny", folder)
  cache_repo(offline_cache, "org/bare", folder, skip=("tokenizer.json",))
  toks = tmp_path / "toks"
  toks.mkdir()
  shutil.copy(folder / "tokenizer.json", toks)
  cache_repo(offline_cache, "org/toks", toks)
  return model


def hf_logits(model):
  with torch.no_grad():
    return model(torch.tensor(TOKENS_BxT)).logits.numpy()


def close(got, want):
  np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5 * np.abs(want).max())


def one_line(e) -> str:
  text = str(e.value)
  assert "\n" not in text, text
  return text


def test_parse_hub_id():
  assert hub.parse_hub_id("Qwen/Qwen3-0.6B") == ("Qwen/Qwen3-0.6B", None)
  assert hub.parse_hub_id("Qwen/Qwen3-0.6B@main") == ("Qwen/Qwen3-0.6B", "main")
  assert hub.parse_hub_id(f"org/x_y.z@{COMMIT}") == ("org/x_y.z", COMMIT)
  for name in ("checkpoints", "/abs/org/name", "./org/name", "org/name/more", "-org/name",
               "org/name.", "org--x/name", "org/na..me", "org/name.git", "org/name@",
               "org/", "~/name"):
    assert hub.parse_hub_id(name) is None, name


def test_only_config_safetensors_and_tokenizer_files_are_fetched():
  from huggingface_hub.utils import filter_repo_objects

  repo = ["config.json", "generation_config.json", "model.safetensors.index.json",
          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
          "pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt",
          "flax_model.msgpack", "tf_model.h5", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja",
          "preprocessor_config.json", "README.md", ".gitattributes", "LICENSE",
          "original/consolidated.safetensors", "original/params.json", "onnx/model.onnx"]

  def fetched(what):
    return set(filter_repo_objects(repo, allow_patterns=hub.allow_patterns(what),
                                   ignore_patterns=list(hub.IGNORE_PATTERNS)))

  tokenizer = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "vocab.json", "merges.txt", "chat_template.jinja"}
  assert fetched("tokenizer") == tokenizer
  assert fetched("checkpoint") == tokenizer | {
      "config.json", "generation_config.json", "model.safetensors.index.json",
      "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
      "preprocessor_config.json"}
  with pytest.raises(ValueError, match="what='weights'"):
    hub.allow_patterns("weights")


def test_snapshot_download_is_asked_for_the_revision_and_the_patterns(tmp_path, monkeypatch):
  """The online call (huggingface_hub's cache, offline flag and token its own)."""
  calls = []

  def fake(repo_id, **kw):
    calls.append((repo_id, kw))
    (tmp_path / "snap").mkdir(exist_ok=True)
    (tmp_path / "snap" / "config.json").write_text("{}")
    (tmp_path / "snap" / "tokenizer.json").write_text("{}")
    return str(tmp_path / "snap")

  monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
  monkeypatch.setattr(hub, "_resolved", {})
  assert hub.resolve_checkpoint("Qwen/Qwen3-0.6B@v1") == tmp_path / "snap"
  assert hub.resolve_checkpoint("Qwen/Qwen3-0.6B", what="tokenizer") == tmp_path / "snap"
  (repo, kw), (_, kw_tok) = calls
  assert repo == "Qwen/Qwen3-0.6B" and kw["revision"] == "v1" and kw_tok["revision"] is None
  assert "cache_dir" not in kw and "local_files_only" not in kw
  assert "*.safetensors" in kw["allow_patterns"] and "config.json" in kw["allow_patterns"]
  assert not any(p.endswith((".bin", ".pt", ".msgpack", ".h5")) for p in kw["allow_patterns"])
  assert "*.bin" in kw["ignore_patterns"]
  assert kw_tok["allow_patterns"] == list(hub.TOKENIZER_PATTERNS)
  # Resolved once per process: a second call asks the hub nothing.
  hub.resolve_checkpoint("Qwen/Qwen3-0.6B@v1")
  assert len(calls) == 2


def test_a_local_directory_wins_and_a_non_id_is_not_a_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "org" / "name").mkdir(parents=True)
  assert hub.resolve_checkpoint("org/name") == tmp_path.joinpath("org", "name").relative_to(
      tmp_path)
  (tmp_path / "org" / "file").write_text("x")
  for name in (str(tmp_path / "absent"), "a/b/c", "org/file"):
    with pytest.raises(ValueError, match="not a directory") as e:
      hub.resolve_checkpoint(name)
    assert one_line(e).startswith(name)


def test_import_hf_of_a_hub_id(hub_models, tmp_path):
  out = import_hf("org/tiny", tmp_path / "run")
  assert "tokenizer.json" in out["kept"]
  model, config = restore(tmp_path / "run")
  assert config.restored_step == 0
  close(model(jnp.asarray(TOKENS_BxT)), hf_logits(hub_models))


@pytest.mark.slow   # a subprocess that imports jax, then imports the checkpoint
def test_import_hf_cli_of_a_hub_id_at_a_revision(hub_models, tmp_path):
  result = run_cli("import-hf", f"--hf_dir=org/tiny@{COMMIT}", f"--workdir={tmp_path / 'run'}")
  assert result.returncode == 0, result.stderr
  assert "step 0" in result.stdout and "tokenizer.json" in result.stdout
  assert (tmp_path / "run" / "tokenizer.json").is_file()


def test_an_uncached_id_offline_is_one_line(hub_models, tmp_path, capsys):
  with pytest.raises(ValueError) as e:
    hub.resolve_checkpoint("org/absent")
  text = one_line(e)
  assert "'org/absent'" in text and "not in the local cache" in text
  assert "HF_HUB_OFFLINE is set" in text
  with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set") as e:
    tokenizer_file("org/absent")
  one_line(e)
  assert run_main(["lngram-exp", "import-hf", "--hf_dir=org/absent",
                   f"--workdir={tmp_path / 'run'}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: org/absent") and "\n" not in err
  assert "not in the local cache" in err and not (tmp_path / "run").exists()


def test_a_tokenizer_only_snapshot_is_no_checkpoint(hub_models):
  with pytest.raises(ValueError, match="holds no config.json") as e:
    hub.resolve_checkpoint("org/toks")
  assert one_line(e).startswith("org/toks: ")
  assert tokenizer_file("org/toks").name == "tokenizer.json"


def test_init_from_hf_of_a_hub_id(hub_models, tmp_path):
  config = load_config("lm_lngram.py:smoke")
  config.model.update(d_model=0, n_layers=0, n_heads=0, n_kv_heads=0, head_dim=0, ffn_dim=0,
                      vocab_size=0, max_len=64)
  config.init_from = "hf:org/bare"
  model = lm_task(config, tmp_path / "probe").module
  assert model.config.d_model == 64 and model.config.vocab_size == 256
  close(model(jnp.asarray(TOKENS_BxT)), hf_logits(hub_models))
  # A checkpoint with its own tokenizer refuses byte data, naming the id to prepare with.
  config.init_from = "hf:org/tiny"
  with pytest.raises(ValueError, match="--tokenizer=org/tiny ") as e:
    with_hf_backbone(config)
  one_line(e)


def test_prepare_data_with_a_hub_tokenizer(hub_models, tmp_path):
  assert describe("org/tiny").vocab_size == 201
  path = tmp_path / "in.jsonl"
  path.write_text("".join(json.dumps({"text": f"w{i} w{i + 1} w{i + 2}"}) + "\n"
                          for i in range(40)))
  manifest = prepare(str(path), "org/tiny", str(tmp_path / "data"), progress=False)
  assert manifest["tokenizer"]["vocab_size"] == 201 and manifest["docs"] == 40
  assert (tmp_path / "data" / "tokenizer.json").read_text() == tokenizer_file(
      "org/toks").read_text()


def test_init_from_a_hub_id_compares_the_snapshots_tokenizer(hub_models, tmp_path):
  """init_from=hf:org/name on token data: the id's cached snapshot is compared, not a
  relative path org/name that is not there (which read as a byte-level source)."""
  from experiments.data.tokens.format import TokenDataError
  from experiments.data.tokens.rows import TokenCorpus
  from experiments.data.tokens.run import check_init_from
  path = tmp_path / "in.jsonl"
  path.write_text("".join(json.dumps({"text": f"w{i} w{i + 1} w{i + 2}"}) + "\n"
                          for i in range(40)))
  prepare(str(path), "org/tiny", str(tmp_path / "own"), progress=False)
  prepare(str(path), "bytes", str(tmp_path / "bytes"), progress=False)
  check_init_from(TokenCorpus(str(tmp_path / "own")), "hf:org/tiny")   # docs/pretrained.md's recipe
  with pytest.raises(TokenDataError) as e:   # byte ids into a 201-id tokenizer's model
    check_init_from(TokenCorpus(str(tmp_path / "bytes")), "hf:org/tiny")
  assert "hf:org/tiny" in one_line(e) and "vocabulary 201" in one_line(e)
  check_init_from(TokenCorpus(str(tmp_path / "bytes")), "hf:org/bare")   # 256 ids, no tokenizer


def test_qwen3vl_hf_dir_takes_a_hub_id(hub_models, offline_cache, tmp_path):
  """`qwen3vl.hf_dir=org/name`: the job's check puts the cached snapshot in its place (the
  caller's config is left as given); a text-only checkpoint is refused naming its
  model_type and the id as given; an uncached id offline is one line."""
  from experiments.configs import load_config
  from experiments.jobs import job_of
  vl = tmp_path / "vl"
  vl.mkdir()
  (vl / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
  cache_repo(offline_cache, "org/vl", vl)
  config = load_config("experiments/configs/qwen3vl_pvm_sft.py:smoke")
  config.qwen3vl.hf_dir = "org/vl"
  checked = job_of(config).check(config)
  snapshot = Path(checked.config.qwen3vl.hf_dir)
  assert snapshot.is_dir() and (snapshot / "config.json").is_file()
  assert snapshot.name == COMMIT and config.qwen3vl.hf_dir == "org/vl"
  config.qwen3vl.hf_dir = "org/tiny"   # a Qwen3 text model: not "no processor"
  with pytest.raises(ValueError, match="model_type 'qwen3'") as e:
    job_of(config).check(config)
  assert one_line(e).startswith("qwen3vl.hf_dir=org/tiny: ") and "hf:org/tiny" in one_line(e)
  config.qwen3vl.hf_dir = "org/absent"
  with pytest.raises(ValueError) as e:
    job_of(config).check(config)
  assert "org/absent" in one_line(e) and "HF_HUB_OFFLINE" in one_line(e)


def test_import_hf_of_a_qwen3vl_moe_hub_id(qwen3vl_moe_checkpoint, offline_cache, tmp_path):
  """A Qwen3-VL-MoE hub id (its experts in the Hub's layout, as Qwen3-VL-30B-A3B's files)
  imports from the cache, and export-hf writes that layout back."""
  from experiments.hf.safetensors_io import Checkpoint
  from experiments.jobs.hf_runs import export_hf
  source, _ = qwen3vl_moe_checkpoint
  cache_repo(offline_cache, "org/vl-moe", source.parent / "hub")
  with pytest.warns(UserWarning, match="no tokenizer.json"):
    out = import_hf("org/vl-moe", tmp_path / "run")
  assert out["qwen3vl"].text.moe_layers == (0, 2)
  export_hf(tmp_path / "run", tmp_path / "out")
  name = "model.language_model.layers.2.mlp.experts.gate_up_proj"
  assert Checkpoint(tmp_path / "out").shape(name) == (5, 64, 48)
  np.testing.assert_array_equal(Checkpoint(tmp_path / "out").tensor(name),
                                Checkpoint(source.parent / "hub").tensor(name))
