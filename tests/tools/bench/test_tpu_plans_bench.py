"""experiments.tools.bench.tpu_plans: every recipe's command parses, the table comes from records.

The compiles themselves take minutes each at full size (BENCHMARKS.md records them); here
each recipe's config and overrides load as `lngram-exp plan` would read them, its mesh
has the topology's device count, and the committed records render as the table.
"""

import json
import math
from pathlib import Path

import pytest

from experiments.cli.overrides import config_from_command_line
from experiments.plan import tpu
from experiments.plan.report import refuse_mesh
from experiments.tools.bench import tpu_plans
from experiments.trainer.placement import parse_mesh

RECORDS = Path(__file__).resolve().parents[3] / "experiments/results/records/tpu_plans"


@pytest.mark.parametrize("recipe", tpu_plans.RECIPES, ids=lambda r: r.name)
def test_every_recipe_loads_and_its_mesh_fills_the_topology(recipe):
  config = config_from_command_line(recipe.config, recipe.overrides)
  sizes = refuse_mesh(config, parse_mesh(recipe.mesh))
  generation, dims = tpu.parse_topology(recipe.target)
  assert math.prod(sizes.values()) == math.prod(dims) * tpu.devices_per_chip(generation)
  assert recipe.target in tpu_plans.command_of(recipe)


def test_the_table_is_rendered_from_the_records(tmp_path):
  records = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))]
  assert {r["name"] for r in records} == {r.name for r in tpu_plans.RECIPES}
  text = tpu_plans.table(records)
  lines = text.splitlines()
  assert len(lines) == 2 + len(records)
  sft = next(r for r in records if r["name"] == "pvm8b_sft_v5p8")
  assert sft["fits"] and sft["peak_bytes"] <= 28 * 2**30   # the bound
  row = next(line for line in lines if line.startswith("| pvm8b_sft_v5p8"))
  assert f"{sft['peak_bytes'] / 2**30:.1f}" in row and "FITS" in row
  for r in records:   # a refused compile is shown as a lower bound
    assert r["fits"] or "DOES NOT FIT" in next(
        line for line in lines if line.startswith(f"| {r['name']}:"))
  rollout = next(r for r in records if r["name"] == "pvm8b_rollout_v5p8")
  assert rollout["program"] == "rollout" and "--program=rollout" in rollout["command"]
  assert rollout["fits"] and rollout["peak_bytes"] <= 48 * 2**30   # Stage II's bound
  (tmp_path / "x.json").write_text(json.dumps(sft))
  assert tpu_plans.main([f"--out={tmp_path}", "--table"]) == 0


def test_unknown_recipe_names_are_refused():
  with pytest.raises(SystemExit):
    tpu_plans.parse_args(["--out=/tmp/x", "--only=nope"])


def test_the_buffer_listing_is_rendered_from_the_records(tmp_path, capsys):
  """`--buffers`: each record's largest buffers at its peak, with the lines that made
  them; records without a listing are left out."""
  big = {"bytes": 409_174_016, "shape": "bf16[16648,12288]",
         "op": "jit(step)/transpose(jvp(btd,df->btf))/dot_general",
         "source": "experiments/models/layers.py:152"}
  with_listing = {"name": "pvm8b_grpo_accum8_v5p8", "peak_bytes": 40 * 2**30,
                  "memory": {"temp": 30 * 2**30},
                  "peak_buffers": {"live_bytes": 25 * 2**30, "buffers": [big] * 7}}
  without = {"name": "pvm8b_sft_v5p8", "peak_bytes": 2**30, "memory": {"temp": 2**30},
             "peak_buffers": None}
  text = tpu_plans.buffer_listing([without, with_listing])
  lines = text.splitlines()
  assert lines[0].startswith("- **pvm8b_grpo_accum8_v5p8** (peak 40.0 GiB, temporaries 30.0)")
  assert len(lines) == 1 + 5 and "pvm8b_sft_v5p8" not in text
  assert lines[1] == ("  - 390.2 MiB `bf16[16648,12288]` transpose(jvp(btd,df->btf))/dot_general "
                      "(`experiments/models/layers.py:152`)")
  (tmp_path / "a.json").write_text(json.dumps(with_listing))
  assert tpu_plans.main([f"--out={tmp_path}", "--buffers"]) == 0
  assert capsys.readouterr().out.strip() == text
