"""experiments/tools/bench/gpu_suite.sh without a GPU: its bash parses, every benchmark command of
the full-size (GPU) branch parses with its module's own argument parser, and a run with
every step skipped writes a summary that names each step.

The benchmarks themselves run at smoke sizes in their own tests; the full-size commands
only ever run on a GPU, so a mistyped flag there would otherwise surface only on the
device, after its start-up.
"""

import importlib
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[3] / "experiments" / "tools" / "bench" / "gpu_suite.sh"
STEP = re.compile(r"^\s*step ([\w-]+) (\d+) ((?:[^\n]*\\\n)*[^\n]*)", re.M)


def _steps():
  """(name, limit_s, argv, smoke) of every `step` line; smoke: inside a SMOKE branch."""
  text = SUITE.read_text()
  steps = []
  for match in STEP.finditer(text):
    before = text[:match.start()]
    branch = before[before.rfind("\nif "):]   # the innermost `if` above the step
    smoke = '"$SMOKE" = 1' in branch and "\nelse" not in branch and "\nelif" not in branch
    argv = shlex.split(match.group(3).replace("\\\n", " "))
    steps.append((match.group(1), int(match.group(2)), argv, smoke))
  return steps


def _full_bench_commands():
  for name, _, argv, smoke in _steps():
    if not smoke and "-m" in argv and argv[argv.index("-m") + 1].startswith("experiments.tools.bench"):
      i = argv.index("-m")
      yield name, argv[i + 1], argv[i + 2:]


def test_suite_is_valid_bash():
  assert subprocess.run(["bash", "-n", str(SUITE)]).returncode == 0


@pytest.mark.parametrize("name, module, args", list(_full_bench_commands()),
                         ids=lambda v: v if isinstance(v, str) and "." not in v else "")
def test_full_size_command_parses(name, module, args, tmp_path):
  shell_values = {"$OUT": str(tmp_path), "$scale_budget": "510",
                  "$JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
                  "$SCALE_DATA": "pkg:json", "$SCALE_SEEDS": "0,1"}
  for var, value in shell_values.items():
    args = [a.replace(var, value) for a in args]
  assert not [a for a in args if "$" in a], args   # a shell value this test does not know
  importlib.import_module(module).parse_args(args)   # argparse exits 2 on a bad flag


def test_every_step_limit_fits_one_device_call():
  """No single step may outlast a 9-minute call (the machine's start-up comes on top)."""
  for name, limit, _, _ in _steps():
    assert 0 < limit <= 550, (name, limit)


def test_all_skipped_run_writes_a_summary_naming_every_step(tmp_path):
  names = sorted({name for name, _, _, smoke in _steps() if not smoke})
  env = {**os.environ, "OUT": str(tmp_path), "SMOKE": "0", "SKIP_WHEELS": "1",
         "PY": "false", "SKIP_STEPS": " ".join(names)}
  run = subprocess.run(["bash", str(SUITE)], env=env, capture_output=True, text=True,
                       timeout=120, cwd=SUITE.parents[3])
  assert run.returncode == 0, run.stderr
  summary = json.loads((tmp_path / "suite_summary.json").read_text())
  assert summary["smoke"] is False
  recorded = {s["name"]: s["rc"] for s in summary["steps"]}
  # nvidia-smi runs only where it exists; every other step is recorded as skipped.
  assert {n for n in names if n != "nvidia-smi"} <= set(recorded)
  assert all(rc == "skipped" for n, rc in recorded.items()), recorded
