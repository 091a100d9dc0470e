"""The `lngram-exp` command line (as `python -m experiments`), end to end in subprocesses.

Every test starts a Python process (seconds each): all are marked slow.
"""

import pytest
from cli_runner import run_cli

_cli = run_cli

pytestmark = pytest.mark.slow


def test_configs_lists_files_with_purpose():
  out = _cli("configs")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert any(line.startswith("lm_lngram.py") and "Lngram" in line for line in lines)
  assert any(line.startswith("lm_baseline.py") and "baseline" in line for line in lines)
  assert any(line.startswith("vlm_pvm_sft.py") and "Stage I" in line for line in lines)


def test_usage_errors():
  out = _cli("fly")
  assert out.returncode != 0 and "usage: lngram-exp" in out.stderr
  out = _cli("train", "--workdir=/nonexistent-never-created")
  assert out.returncode != 0 and "--config" in out.stderr


def test_train_eval_sample_on_a_folder(tmp_path):
  """The folder source (`--config.data.path`), then eval and sample of that run."""
  texts = tmp_path / "texts"
  texts.mkdir()
  for i in range(40):
    (texts / f"doc{i}.txt").write_text(f"line {i}: the quick brown fox\n" * 8)
  workdir = tmp_path / "run"
  out = _cli("train", "--config=experiments/configs/lm_baseline.py:smoke",
             "--config.train.steps=2", "--config.data.seq_len=16", f"--config.data.path={texts}",
             "--config.data.max_files=0", "--config.data.val_fraction=0.2",
             f"--workdir={workdir}")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "validation bits per byte:" in out.stdout
  assert "step 2/2" in out.stderr and "tok/s" in out.stderr and "ETA" in out.stderr
  bpb = float(out.stdout.rsplit("validation bits per byte:", 1)[1].split()[0])
  manifest = (workdir / "corpus_manifest.json").read_text()
  assert '"source": "folder"' in manifest and "doc0.txt" in manifest

  out = _cli("eval", f"--workdir={workdir}")
  assert out.returncode == 0, out.stderr[-3000:]
  values = dict(line.split() for line in out.stdout.splitlines())
  assert float(values["eval/bits_per_byte"]) == pytest.approx(bpb, abs=1e-4)

  out = _cli("sample", f"--workdir={workdir}", "--prompt=line ", "--max_new_tokens=6",
             "--greedy")
  assert out.returncode == 0, out.stderr[-3000:]
  # The command prints what the library's greedy sampler gives for the restored run.
  from experiments.jobs.lm.sample import sample_text
  from experiments.jobs.restore import restore

  model, _ = restore(workdir)
  [expected] = sample_text(model, ["line "], max_new_tokens=6, greedy=True)
  assert out.stdout == f"--- 'line '\nline {expected}\n"


def test_lm_commands_on_a_vlm_run_say_so(tmp_path):
  from flax import nnx

  from experiments.configs import load_config
  from experiments.jobs import saved_config
  from experiments.trainer.checkpoint import run_checkpointer
  from experiments.vlm.tiny.config import vlm_config
  from experiments.vlm.tiny.model import VLM

  config = load_config("experiments/configs/vlm_base.py:smoke")
  model = VLM(vlm_config(config), rngs=nnx.Rngs(0))
  with run_checkpointer(tmp_path, async_save=False) as ckpt:
    ckpt.save(1, params=nnx.to_pure_dict(nnx.state(model, nnx.Param)),
              config=saved_config("vlm", config, model.config))
  for command in ("eval", "sample"):
    out = _cli(command, f"--workdir={tmp_path}")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "is an LM command" in out.stderr and "lngram-exp analyze" in out.stderr


def test_help_into_a_closed_pipe_prints_no_traceback():
  """`lngram-exp --help | head -1`: the reader leaves before the help is written."""
  import os
  import subprocess
  import sys

  from cli_runner import ROOT
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.Popen([sys.executable, "-m", "experiments", "--help"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()   # long before the child has started Python
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=300) == 1 and "Traceback" not in err, err


def test_main_in_process_leaves_logging_as_it_was(tmp_path, capsys):
  """A command run in-process (a notebook, a test) puts the loggers and warnings back."""
  import logging
  import warnings

  from experiments import cli
  ours = logging.getLogger("experiments")
  before = (list(ours.handlers), ours.level, ours.propagate, warnings.formatwarning)
  assert cli.run_main(["lngram-exp", "eval", f"--workdir={tmp_path}"]) == 2
  assert (list(ours.handlers), ours.level, ours.propagate, warnings.formatwarning) == before
  assert capsys.readouterr().err.startswith("error: ")
