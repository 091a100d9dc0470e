"""`export-hf` and `import-hf` write their directory whole or not at all.

A kill -9 at any point of a write leaves nothing at the final path (and a
rerun works: the dead run's temporary sibling is cleared); two writers into
one path never mix, the loser says so in one line. Kills are real SIGKILLs: a
child process runs the CLI with one function wrapped to kill its own process
at its N-th call (exactly what kill -9 at that instruction does), or to wait
there for the test to let it go on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import run_main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[3]

# argv: module, function, N, action ("kill", or "wait:<dir>": touch <dir>/paused at the
# N-th call, go on once <dir>/go exists), then the lngram-exp arguments. The function is
# replaced wherever a module of experiments.hf bound it by name.
WRAPPER = r"""
import importlib, os, signal, sys, time
from pathlib import Path
module, name, n, action = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import experiments.hf.export, experiments.jobs.hf_runs, experiments.hf.qwen3vl.export
real = getattr(importlib.import_module(module), name)
calls = [0]
def wrapped(*args, **kwargs):
  calls[0] += 1
  if calls[0] == n:
    if action == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    folder = Path(action[len("wait:"):])
    (folder / "paused").touch()
    while not (folder / "go").exists():
      time.sleep(0.01)
  return real(*args, **kwargs)
for mod in list(sys.modules.values()):
  if getattr(mod, "__name__", "").startswith(("experiments", "shutil")):
    for attr, value in list(vars(mod).items()):
      if value is real:
        setattr(mod, attr, wrapped)
from experiments.cli import run_main
sys.exit(run_main(["lngram-exp", *sys.argv[5:]]))
"""


def _child(target: str, n: int, action: str, *args) -> subprocess.Popen:
  module, name = target.rsplit(".", 1)
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
  return subprocess.Popen([sys.executable, "-c", WRAPPER, module, name, str(n), action, *args],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def killed_at(target: str, n: int, *args) -> None:
  """Runs `lngram-exp *args` in a child killed (SIGKILL) at the n-th call of `target`."""
  child = _child(target, n, "kill", *args)
  _, err = child.communicate(timeout=300)
  assert child.returncode == -signal.SIGKILL, f"not killed at call {n} of {target}: {err}"


def _tokenizer(folder: Path) -> None:
  """A word-level tokenizer.json of 201 ids (below every test model's vocabulary)."""
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  trainer = tokenizers.trainers.WordLevelTrainer(vocab_size=300, special_tokens=["[UNK]"])
  tok.train_from_iterator([" ".join(f"w{i}" for i in range(200))] * 3, trainer)
  tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def runs(hf_checkpoints, tmp_path_factory):
  """{"a", "b"}: imported qwen3 runs with a tokenizer.json, of different weights."""
  from safetensors.numpy import load_file, save_file
  source, _ = hf_checkpoints["qwen3"]
  base = tmp_path_factory.mktemp("atomic_runs")
  out = {}
  for name, scale in (("a", 1.0), ("b", 2.0)):
    hf = base / f"hf_{name}"
    shutil.copytree(source, hf)
    _tokenizer(hf)
    for shard in hf.glob("*.safetensors"):
      save_file({k: v * np.float32(scale) for k, v in load_file(shard).items()}, shard)
    assert run_main(["lngram-exp", "import-hf", f"--hf_dir={hf}",
                     f"--workdir={base / name}"]) == 0
    out[name] = base / name
  return out


def _weights(folder: Path) -> dict:
  from experiments.hf.safetensors_io import Checkpoint
  ckpt = Checkpoint(folder)
  return {name: np.asarray(ckpt.tensor(name)) for name in ckpt.names()}


def _siblings(path: Path) -> list[str]:
  return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + "."))


def _lm_run(workdir: Path, arm: str) -> None:
  """A step-0 run directory of the LM config `arm` (drawn weights), without training."""
  from flax import nnx

  from experiments.configs import load_config
  from experiments.jobs.saved import saved_config
  from experiments.models import DecoderLM
  from experiments.models.config import lm_config
  from experiments.trainer.checkpoint import run_checkpointer
  experiment = load_config(arm)
  lm = lm_config(experiment)
  params = nnx.to_pure_dict(nnx.state(DecoderLM(lm, rngs=nnx.Rngs(0)), nnx.Param))
  ckpt = run_checkpointer(workdir, async_save=False)
  try:
    ckpt.save(0, params=params, config=saved_config("lm", experiment, lm))
    ckpt.wait()
  finally:
    ckpt.close()


def test_export_killed_while_copying_the_tokenizer_leaves_nothing(runs, tmp_path, capsys):
  out = tmp_path / "exported"
  killed_at("shutil.copyfile", 1, "export-hf", f"--workdir={runs['a']}", f"--out={out}")
  assert not out.exists()
  # The rerun is not refused, and clears the dead run's temporary directory.
  assert run_main(["lngram-exp", "export-hf", f"--workdir={runs['a']}", f"--out={out}"]) == 0
  assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
  assert _siblings(out) == []


def test_lngram_export_killed_before_its_memory_file_leaves_nothing(tmp_path, capsys):
  run, out = tmp_path / "run", tmp_path / "exported"
  _lm_run(run, "lm_lngram.py:smoke")
  killed_at("experiments.hf.safetensors_io.write_file", 2, "export-hf", f"--workdir={run}",
            f"--out={out}")
  assert not out.exists()
  assert run_main(["lngram-exp", "export-hf", f"--workdir={run}", f"--out={out}"]) == 0
  assert (out / "lngram_v2.safetensors").is_file() and _siblings(out) == []


def test_an_lngram_export_without_its_memory_file_is_refused(tmp_path, capsys):
  """config.json of an Lngram v2 export declares the memory: a copy that lost
  lngram_v2.safetensors is refused as incomplete, not read as a plain backbone."""
  run, out = tmp_path / "run", tmp_path / "exported"
  _lm_run(run, "lm_lngram.py:smoke")
  assert run_main(["lngram-exp", "export-hf", f"--workdir={run}", f"--out={out}"]) == 0
  assert json.loads((out / "config.json").read_text())["lngram_v2"]["weights"] == (
      "lngram_v2.safetensors")
  partial = tmp_path / "partial"
  shutil.copytree(out, partial)
  (partial / "lngram_v2.safetensors").unlink()
  capsys.readouterr()
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={partial}",
                   f"--workdir={tmp_path / 'back'}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "lngram_v2.safetensors" in err and "\n" not in err
  assert "incomplete" in err and not (tmp_path / "back").exists()
  # The whole export: transformers reads its config.json; import-hf reads the backbone
  # and says that the memory is not read.
  transformers = pytest.importorskip("transformers")
  transformers.AutoModelForCausalLM.from_pretrained(out)
  with pytest.warns(UserWarning, match=r"Lngram v2 memory \(lngram_v2.safetensors, layers "
                    r"\[1\]\) that is not read"):
    assert run_main(["lngram-exp", "import-hf", f"--hf_dir={out}",
                     f"--workdir={tmp_path / 'back'}"]) == 0


def test_import_killed_while_copying_the_tokenizer_leaves_nothing(runs, tmp_path):
  hf = runs["a"].parent / "hf_a"
  workdir = tmp_path / "run"
  killed_at("shutil.copyfile", 1, "import-hf", f"--hf_dir={hf}", f"--workdir={workdir}")
  assert not workdir.exists()
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={hf}", f"--workdir={workdir}"]) == 0
  assert (workdir / "tokenizer.json").is_file() and (workdir / "hf_config.json").is_file()
  assert _siblings(workdir) == []
  from experiments import restore
  model, config = restore(workdir)
  assert config.restored_step == 0


def test_a_second_export_while_one_writes_is_refused_and_changes_nothing(runs, tmp_path,
                                                                          capsys):
  """Writer A waits inside its first weights write; B, into the same --out, is refused in
  one line; A then finishes with its own weights and tokenizer, unmixed."""
  out, gate = tmp_path / "exported", tmp_path / "gate"
  gate.mkdir()
  a = _child("experiments.hf.safetensors_io.write_file", 1, f"wait:{gate}", "export-hf",
             f"--workdir={runs['a']}", f"--out={out}")
  try:
    deadline = time.time() + 300
    while not (gate / "paused").exists():
      assert a.poll() is None and time.time() < deadline, a.communicate()
      time.sleep(0.01)
    capsys.readouterr()
    assert run_main(["lngram-exp", "export-hf", f"--workdir={runs['b']}",
                     f"--out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "another" in err
  finally:
    (gate / "go").touch()
    _, a_err = a.communicate(timeout=300)
  assert a.returncode == 0, a_err
  want = _weights(runs["a"].parent / "hf_a")
  got = _weights(out)
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value)
  assert (out / "tokenizer.json").read_bytes() == (runs["a"] / "tokenizer.json").read_bytes()
  assert _siblings(out) == []


def test_an_export_that_loses_the_race_at_the_end_changes_nothing(runs, tmp_path, capsys,
                                                                   monkeypatch):
  """Both writers passed the first check; the other one finished first: this one's
  rename fails, in one line, and what the other wrote stays as it was."""
  out = tmp_path / "exported"
  real = shutil.copyfile

  def other_writer_finishes(src, dst, *args, **kwargs):
    if not out.exists():
      out.mkdir()
      (out / "theirs.txt").write_text("the other export")
    return real(src, dst, *args, **kwargs)

  monkeypatch.setattr(shutil, "copyfile", other_writer_finishes)
  assert run_main(["lngram-exp", "export-hf", f"--workdir={runs['b']}", f"--out={out}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err and "another" in err
  assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
  assert _siblings(out) == []


@pytest.mark.parametrize("command,flag", [("export-hf", "out"), ("import-hf", "workdir")])
def test_an_empty_regular_file_is_named_a_file(runs, tmp_path, capsys, command, flag):
  target = tmp_path / "afile"
  target.touch()
  source = (f"--workdir={runs['a']}" if command == "export-hf"
            else f"--hf_dir={runs['a'].parent / 'hf_a'}")
  assert run_main(["lngram-exp", command, source, f"--{flag}={target}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err
  assert "is a file, not a directory" in err and "not empty" not in err
  assert target.is_file() and target.stat().st_size == 0


def _qwen3vl_checkpoint(folder: Path) -> None:
  """A tiny random Qwen3-VL checkpoint with a tokenizer.json and a processor file."""
  transformers = pytest.importorskip("transformers")
  config = transformers.Qwen3VLConfig(
      text_config=dict(vocab_size=300, hidden_size=32, intermediate_size=48,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=16, max_position_embeddings=64,
                       rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                            mrope_section=[2, 3, 3], mrope_interleaved=True)),
      vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                         patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                         out_hidden_size=32, num_position_embeddings=16,
                         deepstack_visual_indexes=[0]),
      image_token_id=290, video_token_id=291, vision_start_token_id=288,
      vision_end_token_id=289)
  torch.manual_seed(0)
  transformers.Qwen3VLForConditionalGeneration(config).save_pretrained(folder)
  _tokenizer(folder)
  (folder / "preprocessor_config.json").write_text(json.dumps({"patch_size": 4}))


def test_qwen3vl_export_killed_while_copying_the_processor_leaves_nothing(tmp_path):
  hf, run, out = tmp_path / "hf", tmp_path / "run", tmp_path / "exported"
  _qwen3vl_checkpoint(hf)
  assert run_main(["lngram-exp", "import-hf", f"--hf_dir={hf}", f"--workdir={run}"]) == 0
  assert (run / "preprocessor_config.json").is_file()
  killed_at("shutil.copyfile", 1, "export-hf", f"--workdir={run}", f"--out={out}")
  assert not out.exists()
  assert run_main(["lngram-exp", "export-hf", f"--workdir={run}", f"--out={out}"]) == 0
  assert (out / "tokenizer.json").is_file() and (out / "preprocessor_config.json").is_file()
  assert _siblings(out) == []
