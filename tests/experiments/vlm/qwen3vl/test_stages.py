"""Stage I / Stage II of PVM on Qwen3-VL (`smoke`: tiny random model, emoji JSONL) through the CLI.

Per stage one reference run (`lngram-exp train`, 2 steps) and one run stopped
after step 1 (SIGTERM: save and stop) and resumed by the same CLI command:
the batches and every parameter agree bit for bit. Stage I trains the PVM
branches only: every other parameter is still the initial model's, bit for
bit, while the branches moved. Stage II starts from the Stage I run, samples
with the KV and visual caches and trains decoder + PVM (vision tower frozen).
"""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from flax import nnx

from experiments import cli
from experiments.configs import load_config

SFT = "experiments/configs/qwen3vl_pvm_sft.py:smoke"
GRPO = "experiments/configs/qwen3vl_pvm_grpo.py:smoke"
STEPS = ["--config.train.steps=2", "--config.train.progress=false"]


def _params(workdir) -> dict:
  from experiments.jobs.init_from import flat_params
  from experiments.jobs.restore import restore
  model, _ = restore(workdir)
  return {k: np.asarray(v) for k, v in flat_params(nnx.state(model, nnx.Param)).items()}


def _train(config_arg, workdir, init_from=None):
  extra = [f"--config.qwen3vl.init_from={init_from}"] if init_from else []
  return cli.run_main(["lngram-exp", "train", f"--config={config_arg}",
                       f"--workdir={workdir}", *STEPS, *extra])


def _stopped_then_resumed(config_arg, workdir, init_from=None) -> None:
  """Step 1 in-process, stopped by SIGTERM (the loop saves and stops), then the CLI resumes."""
  from experiments.jobs import run_train
  config = load_config(config_arg)
  config.train.update(steps=2, progress=False)
  if init_from:
    config.qwen3vl.init_from = str(init_from)

  def stop_after_one(step, batch):
    if step == 1:
      signal.raise_signal(signal.SIGTERM)

  first = run_train(config, workdir, callback=stop_after_one)
  assert first["interrupted"] and first["step"] == 1
  assert _train(config_arg, workdir, init_from) == 0


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
  root = tmp_path_factory.mktemp("qwen3vl_stage1")
  assert _train(SFT, root / "a") == 0
  _stopped_then_resumed(SFT, root / "b")
  return root


def test_stage1_resumes_bit_exactly_and_trains_only_the_branches(stage1):
  a, b = _params(stage1 / "a"), _params(stage1 / "b")
  assert set(a) == set(b)
  for key in a:
    assert a[key].tobytes() == b[key].tobytes(), key
  # The initial model: the smoke config's, drawn from the run's seed.
  from experiments.jobs.init_from import flat_params
  from experiments.jobs.restore import restore
  from experiments.vlm.qwen3vl.model import Qwen3VL
  model, config = restore(stage1 / "a")
  init = {k: np.asarray(v) for k, v in flat_params(nnx.state(
      Qwen3VL(model.config, rngs=nnx.Rngs(config.train.seed)), nnx.Param)).items()}
  branch = [k for k in a if "/ffn_branch/" in k]
  assert branch and all(k.startswith("lm/blocks/1/ffn_branch/") for k in branch)
  for key in a:
    if key not in branch:
      assert a[key].tobytes() == init[key].tobytes(), key
  assert a["lm/blocks/1/ffn_branch/gate"] != 0   # λ left 0: the branch trains
  metrics = json.loads((stage1 / "a" / "metrics.json").read_text())
  assert metrics["stage"] == "sft" and len(metrics["loss"]) == 2
  # The run keeps its processor (tokenizer, template) for Stage II and sampling.
  assert (stage1 / "a" / "processor" / "tokenizer.json").is_file()


def test_stage2_from_stage1_resumes_bit_exactly(stage1, tmp_path):
  assert _train(GRPO, tmp_path / "a", init_from=stage1 / "a") == 0
  _stopped_then_resumed(GRPO, tmp_path / "b", init_from=stage1 / "a")
  a, b = _params(tmp_path / "a"), _params(tmp_path / "b")
  for key in a:
    assert a[key].tobytes() == b[key].tobytes(), key
  start = _params(stage1 / "a")
  moved = [k for k in a if a[k].tobytes() != start[k].tobytes()]
  assert moved == [] or all(k.startswith("lm/") for k in moved)
  assert all(a[k].tobytes() == start[k].tobytes() for k in a if k.startswith("visual/"))
  metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
  assert metrics["stage"] == "grpo" and len(metrics["reward"]) == 2
  assert all(0.0 <= r <= 1.0 for r in metrics["reward"])


def test_config_checks_are_one_line(tmp_path, capsys):
  assert cli.run_main(["lngram-exp", "train", f"--config={GRPO}",
                       f"--workdir={tmp_path / 'x'}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err == ("error: qwen3vl.stage.name='grpo' needs qwen3vl.init_from (the Stage I run "
                 "directory).")
  assert not (tmp_path / "x").exists()
  assert cli.run_main(["lngram-exp", "train", "--config=experiments/configs/qwen3vl_pvm_sft.py",
                       f"--workdir={tmp_path / 'y'}"]) == 2
  assert "qwen3vl.hf_dir is empty" in capsys.readouterr().err


def test_stage1_run_exports_for_the_authors_and_imports_back(stage1, tmp_path):
  """`export-hf` of a trained run -> their config fields; `import-hf` of it: bit for bit."""
  out, back = tmp_path / "export", tmp_path / "back"
  assert cli.run_main(["lngram-exp", "export-hf", f"--workdir={stage1 / 'a'}",
                       f"--out={out}"]) == 0
  text = json.loads((out / "config.json").read_text())["text_config"]
  assert text["pvm_layers"] == [1] and text["pvm_hidden_size"] == 32
  assert (out / "tokenizer.json").is_file()
  assert cli.run_main(["lngram-exp", "import-hf", f"--hf_dir={out}", f"--workdir={back}"]) == 0
  a, b = _params(stage1 / "a"), _params(back)
  assert set(a) == set(b)
  for key in a:
    assert a[key].tobytes() == b[key].tobytes(), key


def test_plan_line_counts_the_branches():
  from experiments.jobs.qwen3vl.task import plan_line
  config = load_config(SFT)
  line = plan_line(config, 8)
  assert line.startswith("plan for 8 devices:") and "in 1 PVM branches" in line
