"""experiments.tools.bench.gpu_plans and gpu_table12: every recipe's command parses, the
tables come from records, and Table 12's programs compile for an H800 at smoke size.

The recipes' compiles take a minute or more each at full size (BENCHMARKS.md records
them); here each recipe's config and overrides load as `lngram-exp plan` would read them,
its mesh has the target's GPU count, and the committed records render as the table.
"""

import json
from pathlib import Path

import pytest

from experiments.cli.overrides import config_from_command_line
from experiments.plan import gpu
from experiments.plan.report import refuse_mesh
from experiments.tools.bench import gpu_plans, gpu_table12
from experiments.trainer.placement import parse_mesh

ROOT = Path(__file__).resolve().parents[3]
RECORDS = ROOT / "experiments/results/records/gpu_plans"
TABLE12 = ROOT / "experiments/results/records/gpu_table12"


@pytest.mark.parametrize("recipe", gpu_plans.RECIPES, ids=lambda r: r.name)
def test_every_recipe_loads_and_its_mesh_fills_the_target(recipe):
  config = config_from_command_line(recipe.config, recipe.overrides)
  sizes = refuse_mesh(config, parse_mesh(recipe.mesh))
  _, hosts, per_host = gpu.parse_target(recipe.target)
  total = 1
  for size in sizes.values():
    total *= size
  assert total == hosts * per_host


def test_the_tables_are_rendered_from_the_records():
  records = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]
  assert {r["name"] for r in records} <= {r.name for r in gpu_plans.RECIPES} and records
  from experiments.tools.bench.tpu_plans import table
  lines = table(records, gpu_plans.RECIPES, "XLA:GPU", "GPU").splitlines()
  assert len(lines) == 2 + len(records) and "peak GiB/GPU [XLA:GPU]" in lines[0]
  for r in records:
    assert r["compiler"] == "XLA:GPU" and r["versions"]["jax-cuda12-plugin"]
    row = next(line for line in lines if line.startswith(f"| {r['name']}:"))
    assert f"{r['peak_bytes'] / 2**30:.1f}" in row
  rollout = next(r for r in records if r["name"] == "pvm8b_rollout_h200x8")
  assert rollout["fits"] and rollout["peak_bytes"] <= 48 * 2**30   # Stage II's bound
  rows = [json.loads(p.read_text()) for p in sorted(TABLE12.glob("*.json"))]
  assert rows and len(gpu_table12.table(rows).splitlines()) == 2 + len(rows)


def test_table12_programs_compile_for_an_h800_with_their_kernels():
  """The smoke backbone's prefill and decode programs, Lngram r64/m4/KV8 with the Triton
  readout: the prefill holds the readout kernels and the decode step its forward kernel."""
  if not gpu.compiler_available():
    pytest.skip(f"needs the GPU compiler ({gpu.EXTRA})")
  row = gpu_table12.compile_row("r64/m4/KV8", "h800:1", "pallas", lengths=(32,),
                                new_tokens=4, smoke=True, log=lambda *_: None)
  assert row["prefill"]["32"]["kernel_calls"] >= 2 and row["decode"]["1"]["kernel_calls"] >= 1
  assert row["prefill"]["32"]["peak_bytes"] > 0


def test_the_spec_check_reads_back_the_shipped_spec(tmp_path):
  """Compiled for a shipped spec, the target config XLA:GPU dumps equals it field by
  field (on a GPU the same tool sets the device's own config beside the spec)."""
  if not gpu.compiler_available():
    pytest.skip(f"needs the GPU compiler ({gpu.EXTRA})")
  import subprocess
  import sys
  out = tmp_path / "spec.json"
  done = subprocess.run([sys.executable, "-m", "experiments.tools.bench.gpu_spec_check",
                         "--target=a100:1", f"--json={out}"], capture_output=True, text=True,
                        timeout=300, cwd=ROOT)
  assert done.returncode == 0, done.stderr
  result = json.loads(out.read_text())
  assert result["chip"] == "a100"
  for row in result["rows"]:
    assert row["device"] == row["shipped"], row
