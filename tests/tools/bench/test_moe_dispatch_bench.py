"""experiments.tools.bench.moe_dispatch: the committed records render as the tables and hold
what BENCHMARKS.md reads from them (the compiles take minutes; the records are theirs)."""

import json
from pathlib import Path

from experiments.tools.bench import moe_dispatch

RECORDS = Path(__file__).resolve().parents[3] / "experiments/results/records/moe_dispatch"


def _records() -> dict[str, dict]:
  return {r["name"]: r for r in (json.loads(p.read_text()) for p in RECORDS.glob("*.json"))}


def test_the_records_hold_the_issue_numbers():
  by = _records()
  dense, moe = by["dense_ffn_1chip"], by["moe_layer_1chip"]
  assert moe["flops"] / dense["flops"] <= 1.3   # the goal: FLOPs near the dense FFN's
  data8, expert8 = by["moe_layer_data8"], by["moe_layer_expert8"]
  assert expert8["expert_bytes"] * 8 == data8["expert_bytes"]   # 1/expert of the weights
  assert expert8["all_to_all"] > 0 == data8["all_to_all"]
  assert expert8["ragged_all_to_all"] == 4 and data8["ragged_all_to_all"] == 0
  for r in by.values():
    assert r["date"] and r["versions"]["libtpu"] and r["command"].startswith("python -m")


def test_the_tables_are_rendered_from_the_records(tmp_path, capsys):
  text = moe_dispatch.table(list(_records().values()))
  assert text.count("\n| moe_layer_") == 4 and "| dense_ffn_1chip (8,192 tokens) |" in text
  assert moe_dispatch.main([f"--out={RECORDS}", "--table"]) == 0
  assert capsys.readouterr().out.strip() == text
  assert moe_dispatch.table([]) == ""
