"""`lngram-exp CMD --help`: one usage line and CMD's own flags only; an unknown command
is one line and exit 2; `configs` aligns its columns (in process, fast)."""

from __future__ import annotations

import pytest

from experiments import cli
from experiments.cli import run_main


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_each_command_lists_only_its_own_flags(capsys, command):
  assert run_main(["lngram-exp", command, "--help"]) == 0
  out = capsys.readouterr().out
  lines = out.splitlines()
  assert lines[0].startswith(f"usage: lngram-exp {command}")
  listed = {line.split(":")[0].strip()[2:] for line in lines if line.startswith("  --")}
  listed.discard("config.<field>=<value>")
  own = cli.FLAGS_OF[command] | {"debug"}
  if command == "analyze":
    own |= set().union(*cli.ANALYZE_FLAGS_OF.values())
  assert listed == own
  for name in cli.REQUIRED_OF.get(command, ()):
    assert f"--{name}=..." in lines[0]


def test_help_forms_and_an_unknown_command(capsys):
  assert run_main(["lngram-exp", "help", "plan"]) == 0
  assert capsys.readouterr().out.startswith("usage: lngram-exp plan --config=...")
  assert run_main(["lngram-exp", "--help"]) == 0
  listing = capsys.readouterr().out
  assert all(name in listing for name in cli.COMMANDS)
  assert run_main(["lngram-exp", "nosuchcommand", "--help"]) == 2
  captured = capsys.readouterr()
  err = captured.err.strip()
  assert err.startswith("error: unknown command 'nosuchcommand'") and "\n" not in err
  assert "import-hf" in err and not captured.out


def test_import_hf_names_every_family_and_configs_align(capsys):
  assert run_main(["lngram-exp", "import-hf", "--help"]) == 0
  text = capsys.readouterr().out
  for family in ("Qwen3", "Qwen3-MoE", "Llama", "Qwen2", "Qwen3-VL", "Qwen3-VL-MoE"):
    assert family in text
  assert run_main(["lngram-exp", "configs"]) == 0
  lines = capsys.readouterr().out.splitlines()
  starts = {len(line) - len(line.split(".py", 1)[1].lstrip()) for line in lines}
  assert len(starts) == 1   # every purpose starts in the same column
  assert all(".py  " in line for line in lines)


def _flag_line(capsys, command: str, flag: str) -> str:
  assert run_main(["lngram-exp", command, "--help"]) == 0
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith(f"  --{flag}:")]
  assert len(lines) == 1, lines
  return lines[0]


def test_help_names_hub_ids_and_each_command_s_own_out(capsys):
  """The flags that take a Hugging Face hub id say so; export-hf's --out is described
  as its own output, not as prepare-data's data directory."""
  assert "hub id" in _flag_line(capsys, "import-hf", "hf_dir")
  assert "hub id" in _flag_line(capsys, "prepare-data", "tokenizer")
  out = _flag_line(capsys, "export-hf", "out")
  assert "Hugging Face checkpoint directory" in out and "prepare-data" not in out
  assert "data directory" in _flag_line(capsys, "prepare-data", "out")
