"""The GPU scale check's CPU dry run: smoke shapes, no grain, curves written, the
deadline skips what cannot finish, and the full scale's configs convert."""

import json
import subprocess
import sys
import textwrap

import pytest

from experiments.bench import scale_check
from experiments.models import lm_config

# One interpreter, grain made unimportable before anything loads: the GPU machine has
# none. The baseline trains at smoke size (the memory arms' full-scale configs are
# checked below, their training steps by their own tests); then it runs again with its
# deadline already passed (compiled from the persistent cache), which the probe skips.
SCRIPT = textwrap.dedent("""
    import json, sys, time
    sys.modules["grain"] = None
    from pathlib import Path
    from experiments.bench import scale_check as sc
    out = Path(sys.argv[1])
    assert sc.main(["--smoke", f"--out={out}", "--arms=baseline",
                    f"--cache-dir={out / 'cache'}"]) == 0
    scale = dict(sc.SMOKE)
    config = sc.arm_config("lm_baseline.py", scale, smoke=True, seed=0)
    from experiments.data.corpus import corpus_spec, load_corpus
    rows = sc.Rows(load_corpus(corpus_spec(config)), scale["seq_len"], 0)
    late = sc.train_arm("baseline", config, rows, rows.validation(2, 2), scale,
                        deadline=time.perf_counter(), curve_path=out / "late.jsonl")
    (out / "late.json").write_text(json.dumps(late))
    print("grain" in sys.modules and sys.modules["grain"] is None)
""")


@pytest.mark.slow  # a subprocess that compiles three small training programs
def test_smoke_dry_run_without_grain(tmp_path):
  proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "scale_check.json").read_text())
  assert [a["arm"] for a in result["arms"]] == ["baseline"]
  assert result["tokens_per_step"] == 2 * 32 and result["backend"] == "cpu"
  for arm in result["arms"]:
    assert arm["status"] == "done" and arm["trained_steps"] == 4, arm
    assert 0 < arm["final_eval_bpb"] < 9 and arm["step_s"] > 0
    curve = [json.loads(line) for line in (tmp_path / f"{arm['arm']}.jsonl").read_text()
             .splitlines()]
    assert [r["step"] for r in curve] == [2, 4] and "eval_bpb" in curve[-1]
  assert "| baseline | done |" in (tmp_path / "scale_check_table.txt").read_text()
  late = json.loads((tmp_path / "late.json").read_text())
  assert late["status"] == "skipped" and "past the deadline" in late["reason"]
  assert any((tmp_path / "cache").iterdir())   # the persistent compilation cache


def test_no_time_left_skips_every_arm_without_compiling(tmp_path):
  result = scale_check.run(tmp_path, smoke=True, budget_s=0, arms=["baseline", "engram"],
                           log=lambda *_: None)
  assert [(a["arm"], a["status"]) for a in result["arms"]] == [
      ("baseline", "skipped"), ("engram", "skipped")]
  assert not list(tmp_path.glob("*.jsonl"))
  with pytest.raises(ValueError, match="unknown arms"):
    scale_check.run(tmp_path, smoke=True, arms=["nope"])


@pytest.mark.parametrize("name,spec", scale_check.ARMS)
def test_full_scale_configs_convert(name, spec):
  config = scale_check.arm_config(spec, scale_check.SCALE, smoke=False, seed=0)
  model = lm_config(config)
  assert model.d_model == 512 and model.n_layers == 8 and config.data.batch_size * (
      config.data.seq_len) == 16384
  assert model.memory_layers == (() if name == "baseline" else (1, 4))
