"""Careless input to `train` and `plan` (careless-user cases): a config file with a syntax
error, an exception or a missing block, a repeated mesh axis, a mesh larger than XLA:CPU
compiles for, a NaN temperature, and Stage II rows whose answer is missing or not an
integer: one line naming the file (and line), exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.cli import run_main

BAD_CONFIGS = {
    "syntax.py": ("def get_config(:\n  pass\n", "syntax.py, line 1: SyntaxError"),
    "raises.py": ("def get_config():\n  return 1 / 0\n",
                  "raises.py, line 2: ZeroDivisionError: division by zero"),
    "no_model.py": ("import ml_collections\n\n\ndef get_config():\n"
                    "  c = ml_collections.ConfigDict()\n  c.train = dict(steps=1)\n  return c\n",
                    "the config has no model, data, optim blocks"),
}


def _one_line_error(capsys, argv) -> str:
  capsys.readouterr()
  assert run_main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err, err
  return err


@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("command", ["plan", "train"])
def test_a_broken_config_file_is_one_line(tmp_path, capsys, name, command):
  text, expected = BAD_CONFIGS[name]
  path = tmp_path / name
  path.write_text(text)
  workdir = tmp_path / "run"
  argv = ["lngram-exp", command, f"--config={path}"]
  argv += ["--mesh=data=1"] if command == "plan" else [f"--workdir={workdir}"]
  assert expected in _one_line_error(capsys, argv)
  assert not workdir.exists()


def test_plan_mesh_mistakes_are_one_line(capsys):
  config = "--config=experiments/configs/lm_baseline.py:smoke"
  err = _one_line_error(capsys, ["lngram-exp", "plan", config, "--mesh=data=2,data=4"])
  assert "data is given twice" in err
  err = _one_line_error(capsys, ["lngram-exp", "plan", config, "--mesh=data=4096",
                                 "--config.data.batch_size=4096"])
  assert "at most 2,048 host devices" in err and "--target" in err


@pytest.mark.parametrize("flag", ["--mfu=nan", "--mfu=inf"])
def test_non_finite_float_flags_are_one_line(capsys, flag):
  err = _one_line_error(capsys, ["lngram-exp", "plan",
                                 "--config=experiments/configs/lm_baseline.py:smoke", flag])
  assert "is not a finite number" in err


def test_a_nan_temperature_is_refused():
  import jax
  from flax import nnx

  from experiments.models import DecoderLM, LMConfig, generate
  model = DecoderLM(LMConfig(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                             ffn_dim=32, vocab_size=256, max_len=32), rngs=nnx.Rngs(0))
  for bad in (float("nan"), float("inf"), 0.0):
    with pytest.raises(ValueError, match="must be a finite number > 0"):
      generate(model, np.ones((1, 4), np.int32), max_new_tokens=2, rng=jax.random.key(0),
               temperature=bad)


def test_stage_two_answers_are_checked_when_the_file_is_read(tmp_path):
  from experiments.vlm.emoji.rewards import reward
  from experiments.vlm.qwen3vl.conversations import check_answer
  check_answer({"answer": 3}, required=True)
  check_answer({}, required=False)
  with pytest.raises(ValueError, match="no 'answer'"):
    check_answer({}, required=True)
  for bad in ("two", 2.7, True):
    with pytest.raises(ValueError, match="is not an integer"):
      check_answer({"answer": bad}, required=False)
  with pytest.raises(ValueError, match="2.7 is not an integer"):
    reward("<answer>2</answer>", 2.7)
  assert reward("<answer>2</answer>", 2) == pytest.approx(1.0)
  # The file names itself and the row when read.
  from experiments.vlm.qwen3vl.conversations import ConversationData
  rows = tmp_path / "rows.jsonl"
  rows.write_text(json.dumps({"id": "r7", "answer": "two", "conversations": []}) + "\n")
  with pytest.raises(ValueError, match=r"rows.jsonl row 'r7': answer='two' is not an integer"):
    ConversationData(rows, processor=None)


def test_no_validation_document_says_to_raise_the_validation_fraction():
  from experiments.data.validation import validation_windows
  with pytest.raises(ValueError, match="larger --val_fraction"):
    validation_windows([np.asarray([7])], ["one-token doc"], cap=8)
