"""`lngram-exp` under user mistakes: one `error: ...` line and exit status 2 each.

The subprocess tests start a Python process (seconds each): marked slow. The
override parser, the config checks and the memory estimate are also tested
in-process (fast).
"""

import json
import shutil
from pathlib import Path

import jax
import pytest
from cli_runner import run_cli

from experiments import cli
from experiments.configs import load_config
from experiments.train.task import (
  check_experiment_config,
  check_memory,
  memory_estimate,
  parse_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "--config=experiments/configs/lm_lngram.py:smoke"


_cli = run_cli

def _one_error_line(out, *fragments):
  """Exit status 2, stderr exactly one `error: ...` line holding every fragment."""
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith("error: "), lines
  for fragment in fragments:
    assert fragment in lines[0], lines[0]
  assert "Traceback" not in out.stderr
  return lines[0]


# --- in-process: overrides, checks, memory -------------------------------------------------


def test_override_typo_names_the_closest_field():
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  with pytest.raises(ValueError, match=r"^unknown field train\.stepz \(did you mean "
                                       r"train\.steps\?\)$"):
    cli.apply_overrides(config, [("train.stepz", "5")])
  with pytest.raises(ValueError, match=r"unknown field nodel\.d_model \(did you mean "
                                       r"model\.d_model\?\)"):
    cli.apply_overrides(config, [("nodel.d_model", "5")])
  with pytest.raises(ValueError, match=r"^unknown field zzz$"):
    cli.apply_overrides(config, [("zzz", "5")])


def test_overrides_parse_as_the_field_type():
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  cli.apply_overrides(config, [
      ("train.steps", "7"), ("optim.lr", "1e-4"), ("train.progress", "false"),
      ("model.memory_layers", "0,1"), ("model.memory.orders", "2"),
      ("data.path", "some/texts"), ("train.allow_config_change", "true")])
  assert config.train.steps == 7 and config.optim.lr == 1e-4
  assert config.train.progress is False and config.model.memory_layers == (0, 1)
  assert config.model.memory.orders == (2,) and config.data.path == "some/texts"
  assert config.train.allow_config_change is True
  for field, text, message in (("train.steps", "many", "train.steps='many' is not an int"),
                               ("optim.lr", "fast", "optim.lr='fast' is not a number"),
                               ("train.progress", "maybe", "is not a bool"),
                               ("model.memory", "3", "is a block of fields")):
    with pytest.raises(ValueError, match=message):
      cli.apply_overrides(config, [(field, text)])


def test_split_config_args():
  spec, overrides, rest = cli.split_config_args(
      ["train", "--config", "a.py:smoke", "--config.train.steps", "3", "--config.data.path=x",
       "--workdir=w"])
  assert spec == "a.py:smoke"
  assert overrides == [("train.steps", "3"), ("data.path", "x")]
  assert rest == ["train", "--workdir=w"]


@pytest.mark.parametrize("field, value, message", [
    ("train.steps", 0, "train.steps=0 must be a positive int"),
    ("train.steps", -5, "train.steps=-5"),
    ("optim.lr", -1e-3, "optim.lr=-0.001 must be a number > 0"),
    ("optim.lr", 0.0, "optim.lr=0.0"),
    ("data.batch_size", 0, "data.batch_size=0"),
    ("data.seq_len", -1, "data.seq_len=-1"),
    ("train.eval_every", 0, "train.eval_every=0"),
    ("train.ckpt_every", 0, "train.ckpt_every=0"),
    ("train.log_every", -2, "train.log_every=-2"),
    ("optim.warmup_steps", -1, "optim.warmup_steps=-1 must be an int >= 0"),
    ("optim.b2", 1.0, "optim.b2=1.0"),
    ("optim.weight_decay", float("nan"), "optim.weight_decay=nan"),
    ("data.val_fraction", 1.5, "data.val_fraction=1.5"),
])
def test_bad_numbers_are_rejected_naming_the_field(field, value, message):
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  block, name = field.split(".")
  config[block][name] = value
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
    check_experiment_config(config)


def test_model_numbers_are_rejected_naming_the_field():
  from experiments.models.config import lm_config
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  config.model.d_model = 0
  with pytest.raises(ValueError, match="d_model=0"):
    lm_config(config)
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  config.data.seq_len = 4096
  with pytest.raises(ValueError, match=r"data\.seq_len=4096 exceeds model\.max_len=128"):
    check_experiment_config(config)


def test_parse_bytes():
  assert parse_bytes("8GiB") == 8 * 2**30
  assert parse_bytes("512MB") == 512 * 10**6
  assert parse_bytes("1e9") == 10**9
  for bad in ("lots", "-3GiB", "0", "8 parsecs"):
    with pytest.raises(ValueError, match="max_memory"):
      parse_bytes(bad)


def test_memory_estimate_is_params_plus_two_moments():
  from flax import nnx

  from experiments.models import DecoderLM
  from experiments.models.config import lm_config
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(0))
  n_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert memory_estimate(config) == 3 * n_bytes
  with pytest.raises(ValueError, match=r"needs about .* more than the --max_memory limit"):
    check_memory(config, limit=n_bytes)
  assert check_memory(config, limit=4 * n_bytes) == 3 * n_bytes


def test_memory_estimate_allocates_nothing():
  """A 128+ GiB config is estimated from shapes alone, in well under a minute."""
  import time
  config = load_config("experiments/configs/lm_lngram.py")
  config.model.memory.update(routes=2**20, orders=(2,), mem_dim=128)
  start = time.perf_counter()
  need = memory_estimate(config)
  assert need > 128 * 2**30
  assert time.perf_counter() - start < 30
  with pytest.raises(ValueError, match=r"GiB for parameters \+ optimizer state"):
    check_memory(config, limit=2**30)


def test_cap_new_tokens():
  from experiments.train.evaluate import cap_new_tokens
  assert cap_new_tokens(128, ["def "], 50) == (50, "")
  n, note = cap_new_tokens(128, ["def ", "import os\n"], 200)
  assert n == 118 and "capped to 118" in note and "max_len=128" in note
  with pytest.raises(ValueError, match="shorter --prompt"):
    cap_new_tokens(8, ["x" * 8], 5)
  with pytest.raises(ValueError, match="max_new_tokens=0"):
    cap_new_tokens(128, ["def "], 0)


def test_notebook_finds_its_run_from_any_directory(tmp_path, monkeypatch):
  """The parameter cell resolves a relative WORKDIR against the repository."""
  nb = json.loads((ROOT / "experiments/notebooks/restore_checkpoint.ipynb").read_text())
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  assert "parameters" in code[0]["metadata"].get("tags", [])
  # The parameter cell holds only the parameters (papermill replaces it); the next one resolves.
  source = "".join(code[0]["source"]) + "\n" + "".join(code[1]["source"])
  run = ROOT / "runs" / "_test_notebook_cwd"
  (run / "checkpoints").mkdir(parents=True, exist_ok=True)
  try:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LNGRAM_WORKDIR", "runs/_test_notebook_cwd")
    scope = {}
    exec(source, scope)
    assert scope["WORKDIR"] == run
    monkeypatch.setenv("LNGRAM_WORKDIR", "runs/_no_such_run")
    with pytest.raises(FileNotFoundError, match="set WORKDIR"):
      exec(source, {})
  finally:
    shutil.rmtree(run)
    if not any((ROOT / "runs").iterdir()):
      (ROOT / "runs").rmdir()


# --- subprocess: what a user sees ----------------------------------------------------------


@pytest.mark.slow
def test_help_and_no_command_list_the_subcommands():
  for args, status in (((), 2), (("--help",), 0)):
    out = _cli(*args)
    assert out.returncode == status, out.stderr[-3000:]
    for command in cli.COMMANDS:
      assert any(line.strip().startswith(command) for line in out.stdout.splitlines()), \
          out.stdout
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_typo_override_is_one_line():
  out = _cli("train", SMOKE, "--config.train.stepz=5", "--workdir=/nonexistent-never-made")
  line = _one_error_line(out)
  assert line == "error: unknown field train.stepz (did you mean train.steps?)"
  out = _cli("train", SMOKE, "--config.train.stepz=5", "--workdir=/x", "--debug")
  assert out.returncode != 0 and "Traceback" in out.stderr


@pytest.mark.slow
def test_bad_numbers_are_one_line(tmp_path):
  out = _cli("train", SMOKE, "--config.train.steps=-5", f"--workdir={tmp_path / 'a'}")
  _one_error_line(out, "train.steps=-5")
  assert not (tmp_path / "a" / "checkpoints").exists()
  out = _cli("train", SMOKE, "--config.optim.lr=-1", f"--workdir={tmp_path / 'b'}")
  _one_error_line(out, "optim.lr=-1")


@pytest.mark.slow
def test_data_errors_are_one_line(tmp_path):
  out = _cli("train", SMOKE, f"--config.data.path={tmp_path / 'missing'}",
             f"--workdir={tmp_path / 'a'}")
  _one_error_line(out, "data.path", "missing")
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "image.bin").write_bytes(b"\x00\x01")
  out = _cli("train", SMOKE, f"--config.data.path={empty}", f"--workdir={tmp_path / 'b'}")
  _one_error_line(out, str(empty))


@pytest.mark.slow
def test_eval_and_sample_on_an_empty_workdir_are_one_line(tmp_path):
  for command in ("eval", "sample"):
    out = _cli(command, f"--workdir={tmp_path}")
    _one_error_line(out, str(tmp_path))


@pytest.mark.slow
def test_huge_tables_fail_in_seconds_with_the_estimate(tmp_path):
  out = _cli("train", "--config=experiments/configs/lm_lngram.py",
             "--config.model.memory.routes=1048576", "--config.model.memory.orders=2,",
             "--config.model.memory.mem_dim=128", f"--workdir={tmp_path}", timeout=120)
  _one_error_line(out, "GiB for parameters + optimizer state")
  out = _cli("train", SMOKE, "--max_memory=100KiB", f"--workdir={tmp_path / 'b'}")
  _one_error_line(out, "--max_memory limit (100.0 KiB)")


@pytest.mark.slow
def test_eval_and_sample_name_their_step_and_sample_caps_tokens(smoke_run_copy):
  workdir, result = smoke_run_copy
  out = _cli("sample", f"--workdir={workdir}", "--greedy")   # 200 > the smoke max_len 128
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"checkpoint step {result['step']}" in out.stderr
  assert "note: max_new_tokens=200 capped to 124" in out.stderr
  assert out.stdout.startswith("--- 'def '\n")
  out = _cli("eval", f"--workdir={workdir}", "--step=1")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "checkpoint step 1" in out.stderr and "eval/bits_per_byte" in out.stdout
  out = _cli("sample", f"--workdir={workdir}", "--step=7")
  _one_error_line(out, "7")


@pytest.mark.slow
def test_flag_and_config_file_mistakes_are_one_line(tmp_path):
  _one_error_line(_cli("eval", f"--workdir={tmp_path}", "--stepp=3"), "stepp")
  _one_error_line(_cli("eval", f"--workdir={tmp_path}", "--step=abc"), "abc")
  _one_error_line(_cli("train", "--config=nope.py", f"--workdir={tmp_path}"), "nope.py")
  _one_error_line(_cli("train", "--config=experiments/configs/lm_lngram.py:bogus",
                       f"--workdir={tmp_path}"), "bogus")
  _one_error_line(_cli("sample", f"--workdir={tmp_path}", "--max_new_tokens=0"),
                  "--max_new_tokens=0")
  out = _cli("fly")
  assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
  assert out.stderr.startswith("usage: lngram-exp")
