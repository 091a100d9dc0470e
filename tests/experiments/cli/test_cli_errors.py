"""`lngram-exp` under user mistakes: one `error: ...` line and exit status 2 each.

The subprocess tests start a Python process (seconds each): marked slow. The
override parser, the config checks and the memory estimate are also tested
in-process (fast).
"""

import json
import re
import shutil
from pathlib import Path

import jax
import pytest
from cli_runner import run_cli

from experiments import cli
from experiments.cli.overrides import UsageError, parse_command_line
from experiments.configs import load_config
from experiments.jobs import job_of
from experiments.jobs.checks import (
  check_experiment_config,
  check_memory,
  lm_param_bytes,
  parse_bytes,
)

ROOT = Path(__file__).resolve().parents[3]
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


def _parse(*args, config=SMOKE, command="train"):
  """The config (and the FlagValues) that `lngram-exp <command> <config> *args` parses to."""
  argv = ["lngram-exp", command, *([config] if config else []), *args]
  fv = cli.define_flags(argv)
  rest = parse_command_line(fv, argv)
  assert rest == ["lngram-exp", command]
  return fv.config, fv


def _run_in_process(capsys, *args):
  """(exit status, stderr lines) of `lngram-exp *args` run in this process."""
  status = cli.run_main(["lngram-exp", *map(str, args)])
  return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_override_typo_names_the_closest_field():
  with pytest.raises(ValueError, match=r"^unknown field train\.stepz \(did you mean "
                                       r"train\.steps\?\)$"):
    _parse("--config.train.stepz=5")
  with pytest.raises(ValueError, match=r"unknown field nodel\.d_model \(did you mean "
                                       r"model\.d_model\?\)"):
    _parse("--config.nodel.d_model=5")
  with pytest.raises(ValueError, match=r"^unknown field zzz$"):
    _parse("--config.zzz=5")
  with pytest.raises(ValueError, match=r"^unknown field train\.steps\.x"):
    _parse("--config.train.steps.x=5")


def test_overrides_parse_as_the_field_type():
  config, _ = _parse(
      "--config.train.steps=7", "--config.optim.lr=1e-4", "--config.train.progress=false",
      "--config.model.memory_layers=0,1", "--config.model.memory.orders=2",
      "--config.data.path=some/texts", "--config.train.allow_config_change=true",
      "--config.train.profile_steps=3,5", "--config.optim.state_dtype=bfloat16",
      "--config.train.grad_accum=2")
  assert config.train.steps == 7 and config.optim.lr == 1e-4
  assert config.train.progress is False and config.model.memory_layers == (0, 1)
  assert config.model.memory.orders == (2,) and config.data.path == "some/texts"
  assert config.train.allow_config_change is True and config.train.profile_steps == (3, 5)
  assert config.optim.state_dtype == "bfloat16" and config.train.grad_accum == 2
  for arg, message in (("--config.train.steps=many", "^train.steps='many' is not an int.$"),
                       ("--config.optim.lr=fast", "^optim.lr='fast' is not a number.$"),
                       ("--config.train.progress=maybe", "train.progress='maybe' is not a bool"),
                       ("--config.model.memory=3", "model.memory is a block of fields"),
                       ("--config.model.memory={'routes': 4}", "is a block of fields")):
    with pytest.raises(ValueError, match=message):
      _parse(arg)


def test_config_and_overrides_in_both_spellings():
  # `--config <spec>` takes the next argument; a bare file name is found in experiments/configs.
  argv = ["lngram-exp", "train", "--config", "lm_lngram.py:smoke", "--config.train.steps", "3",
          "--config.data.path=x", "--workdir=w"]
  fv = cli.define_flags(argv)
  assert parse_command_line(fv, argv) == ["lngram-exp", "train"]
  assert fv.config.train.steps == 3 and fv.config.data.path == "x" and fv.workdir == "w"
  assert fv.config.model.memory_layers == (1,)   # the smoke arg reached get_config
  with pytest.raises(UsageError, match="overrides need --config"):
    _parse("--config.train.steps=3", config=None)
  with pytest.raises(ValueError, match="before a value for --config"):
    argv = ["lngram-exp", "train", "--config.train.steps=3", SMOKE]
    parse_command_line(cli.define_flags(argv), argv)
  with pytest.raises(FileNotFoundError, match="config file 'nope.py' not found"):
    _parse(config="--config=nope.py")
  with pytest.raises(ValueError, match=r"^lm_lngram: unknown config arg 'bogus'"):
    _parse(config="--config=experiments/configs/lm_lngram.py:bogus")


def test_main_runs_twice_in_one_process(capsys):
  """Flags live on a FlagValues per call: a second parse with other overrides works."""
  for steps in ("5", "6"):
    config, _ = _parse(f"--config.train.steps={steps}")
    assert config.train.steps == int(steps)
  for _ in range(2):
    status, lines = _run_in_process(capsys, "train", SMOKE, "--config.train.stepz=5",
                                    "--workdir=/nonexistent-never-made")
    assert status == 2 and lines == ["error: unknown field train.stepz (did you mean "
                                     "train.steps?)"]


@pytest.mark.parametrize("args, fragment", [
    (("eval", "--prompt=x"), "eval does not take --prompt (a flag of sample)"),
    (("eval", "--greedy"), "eval does not take --greedy"),
    (("train", SMOKE, "--greedy"), "train does not take --greedy (a flag of sample)"),
    (("train", SMOKE, "--step=3"), "train does not take --step"),
    (("sample", "--max_memory=8GiB"), "sample does not take --max_memory (a flag of train)"),
    (("eval", SMOKE, "--config.data.path=other"), "eval does not take --config"),
    (("sample", "--config.data.path=other"), "sample does not take --config"),
    (("configs", "--workdir=x"), "configs does not take --workdir"),
    (("eval", "--coordinator=h:1"), "eval does not take --coordinator"),
    (("sample", "--greedy", "--temperature=0.5"),
     "sample --greedy does not take --temperature (argmax decoding draws nothing)"),
    (("sample", "--greedy", "--top_k=5"), "sample --greedy does not take --top_k"),
])
def test_flags_a_command_does_not_take_are_refused(capsys, tmp_path, args, fragment):
  status, lines = _run_in_process(capsys, *args, f"--workdir={tmp_path}")
  assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
  assert fragment in lines[0], lines


def test_prompt_that_is_not_utf8_is_named_before_the_restore(capsys, tmp_path):
  # Bytes that are not UTF-8 in argv reach Python as lone surrogates.
  status, lines = _run_in_process(capsys, "sample", f"--workdir={tmp_path}",
                                  "--prompt=ab\udcff")
  assert status == 2 and len(lines) == 1, lines
  assert "--prompt" in lines[0] and "not UTF-8" in lines[0] and "position 2" in lines[0]


def test_workdir_that_is_a_file_is_one_clear_line(capsys, tmp_path):
  path = tmp_path / "afile"
  path.write_text("x")
  for args in (("train", SMOKE), ("eval",), ("sample",)):
    status, lines = _run_in_process(capsys, *args, f"--workdir={path}")
    assert status == 2 and lines == [f"error: --workdir={path} is a file, not a run "
                                     "directory."], lines
  status, lines = _run_in_process(capsys, "train", SMOKE, f"--workdir={path}/run")
  assert status == 2 and "is a file, not a directory" in lines[0] and "Errno" not in lines[0]


@pytest.mark.parametrize("arg, fragment", [
    ("--config.optim.lr=1e99", "optim.lr=1e+99 must be"),
    ("--config.model.dtype=int32", "dtype='int32' is not one of"),
    ("--config.model.param_dtype=int8", "param_dtype='int8' is not one of"),
])
def test_unusable_config_is_refused_before_the_workdir_is_made(capsys, tmp_path, arg, fragment):
  workdir = tmp_path / "new"
  status, lines = _run_in_process(capsys, "train", SMOKE, arg, f"--workdir={workdir}")
  assert status == 2 and len(lines) == 1 and fragment in lines[0], lines
  assert not workdir.exists()


def test_refused_runs_leave_nothing_behind(capsys, tmp_path):
  new = tmp_path / "deep" / "new"
  status, lines = _run_in_process(capsys, "train", SMOKE,
                                  f"--config.data.path={tmp_path / 'missing'}",
                                  f"--workdir={new}")
  assert status == 2 and "data.path" in lines[0], lines
  assert not (tmp_path / "deep").exists()
  empty = tmp_path / "texts"
  empty.mkdir()
  (empty / "image.bin").write_bytes(b"\x00\x01")
  existing = tmp_path / "existing"
  existing.mkdir()
  status, lines = _run_in_process(capsys, "train", SMOKE, f"--config.data.path={empty}",
                                  f"--workdir={existing}")
  assert status == 2 and str(empty) in lines[0], lines
  assert existing.is_dir() and not any(existing.iterdir())


def test_leave_no_trace_keeps_results_and_what_was_there(tmp_path):
  from experiments.cli.preflight import leave_no_trace
  kept = tmp_path / "kept"
  kept.mkdir()
  (kept / "notes.txt").write_text("mine")
  with pytest.raises(ValueError), leave_no_trace(kept):
    (kept / ".lock").write_text("1")
    (kept / "corpus_manifest.json").write_text("{}")
    raise ValueError("refused")
  assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
  ran = tmp_path / "ran"
  with pytest.raises(FloatingPointError), leave_no_trace(ran):
    ran.mkdir()
    (ran / "corpus_manifest.json").write_text("{}")
    (ran / "metrics.jsonl").write_text("{}")   # a result: nothing is removed
    raise FloatingPointError("nan at step 3")
  assert sorted(p.name for p in ran.iterdir()) == ["corpus_manifest.json", "metrics.jsonl"]
  # A resumed run whose save failed: its log (the failure's full text) and all else stay.
  resumed = tmp_path / "resumed"
  (resumed / "checkpoints" / "2").mkdir(parents=True)
  with pytest.raises(OSError), leave_no_trace(resumed):
    (resumed / "checkpoints.log").write_text("read-only file system")
    (resumed / ".lock").write_text("1")
    raise OSError("step 4 could not be saved")
  assert sorted(p.name for p in resumed.iterdir()) == [".lock", "checkpoints", "checkpoints.log"]
  fresh = tmp_path / "fresh"
  with pytest.raises(OSError), leave_no_trace(fresh):
    (fresh / "checkpoints").mkdir(parents=True)
    (fresh / "checkpoints.log").write_text("details")
    raise OSError("step 1 could not be saved")
  assert (fresh / "checkpoints.log").read_text() == "details"


@pytest.mark.parametrize("field, value, message", [
    ("train.steps", 0, "train.steps=0 must be a positive int"),
    ("train.steps", -5, "train.steps=-5"),
    ("optim.lr", -1e-3, "optim.lr=-0.001 must be a number in (0, 1]"),
    ("optim.lr", 0.0, "optim.lr=0.0"),
    ("optim.lr", 1e99, "optim.lr=1e+99 must be a number in (0, 1]"),
    ("optim.lr", float("inf"), "optim.lr=inf"),
    ("optim.table_lr_mult", 1e6, "optim.table_lr_mult=1000000.0 must be a number in (0, 1000]"),
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
  with pytest.raises(ValueError, match=re.escape(message)):
    check_experiment_config(config)


def test_model_numbers_are_rejected_naming_the_field():
  from experiments.models.config import lm_config
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  config.model.d_model = 0
  with pytest.raises(ValueError, match="d_model=0"):
    lm_config(config)
  config = load_config("experiments/configs/lm_lngram.py:smoke")
  config.data.seq_len = 4096   # checked once, where the model config is built
  with pytest.raises(ValueError, match=r"data\.seq_len=4096 exceeds model\.max_len=128"):
    lm_config(config)


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
  checked = job_of(config).check(config)
  with pytest.raises(ValueError, match=r"needs about .* more than the --max_memory limit"):
    check_memory(checked, limit=n_bytes)
  assert check_memory(checked, limit=4 * n_bytes) == 3 * n_bytes


def test_memory_estimate_allocates_nothing():
  """A 128+ GiB config is estimated from shapes alone, in well under a minute."""
  import time
  config = load_config("experiments/configs/lm_lngram.py")
  config.model.memory.update(routes=2**20, orders=(2,), mem_dim=128)
  start = time.perf_counter()
  checked = job_of(config).check(config)
  need = 3 * lm_param_bytes(checked.model)
  assert need > 128 * 2**30
  assert time.perf_counter() - start < 30
  with pytest.raises(ValueError, match=r"GiB for parameters \+ optimizer state"):
    check_memory(checked, limit=2**30)


def test_cap_new_tokens():
  from experiments.jobs.lm.sample import cap_new_tokens
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
  # A refused run leaves neither an empty workdir nor a lone corpus manifest.
  assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


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


@pytest.mark.slow
def test_eval_of_a_run_refuses_config_overrides_and_foreign_flags(smoke_run_copy, tmp_path):
  """`eval` reads the run's saved config: an override would be silently ignored, so it is
  refused (before the config file is read), as is a flag of another command."""
  workdir, _ = smoke_run_copy
  out = _cli("eval", f"--workdir={workdir}", SMOKE, f"--config.data.path={tmp_path}")
  _one_error_line(out, "eval does not take --config")
  assert "eval/bits_per_byte" not in out.stdout
  _one_error_line(_cli("eval", f"--workdir={workdir}", "--prompt=x"),
                  "eval does not take --prompt")
  _one_error_line(_cli("analyze", f"--workdir={workdir}", "--n=4"),
                  "analyze of an LM run does not take --n (a flag of analyze of VLM runs)")


@pytest.mark.slow
def test_prompt_bytes_that_are_not_utf8_are_named_before_the_restore(smoke_run_copy):
  workdir, _ = smoke_run_copy
  out = _cli("sample", f"--workdir={workdir}", b"--prompt=ab\xff")
  line = _one_error_line(out, "--prompt", "not UTF-8", "position 2")
  assert "checkpoint step" not in out.stderr and "codec" not in line
