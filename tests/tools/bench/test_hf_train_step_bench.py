"""experiments.tools.bench.hf_train_step on a tiny checkpoint: the step-0 check, the table, the
target line and the JSON; its argument checks; and its step in gpu_suite.sh."""

import contextlib
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

from experiments.tools.bench import hf_train_step

SUITE = Path(__file__).resolve().parents[3] / "experiments" / "tools" / "bench" / "gpu_suite.sh"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("hf_train_step")
  path = out / "result.json"
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    returned = hf_train_step.main(["--tiny", "--repeats", "2", "--dir", str(out / "ckpt"),
                                   "--json", str(path)])
  return returned, json.loads(path.read_text()), printed.getvalue(), out


def test_step_0_models_agree_and_losses_are_finite(tiny_run):
  _, result, out, _ = tiny_run
  check = result["step0_check"]
  assert check["passed"] and check["logits_equal"] and check["losses_finite"]
  assert check["max_abs_diff"] <= check["tolerance"] < 1e-6 * max(check["max_abs_logit"], 1)
  assert "step-0 check: max |logits(lngram_v2) - logits(baseline)| = " in out
  base, mem = result["rows"]["baseline"], result["rows"]["lngram_v2"]
  assert base["loss_step0"] == pytest.approx(mem["loss_step0"], rel=1e-6)
  # The memory run really holds the branches (left at init), the baseline none.
  assert base["fresh_arrays"] == 0 < mem["fresh_arrays"] and mem["params"] > base["params"]


def test_table_target_line_and_json(tiny_run):
  returned, result, out, out_dir = tiny_run
  assert returned["overhead_pct"] == result["overhead_pct"]
  assert result["layers"] == 4 and result["memory_layers"] == [1, 3]
  assert result["widths"]["d_model"] == 32 and result["tokens_per_step"] == 2 * 32
  assert result["dtype"] == "float32" and result["param_dtype"] == "float32"
  for name in ("baseline", "lngram_v2"):
    row = result["rows"][name]
    assert len(row["times_s"]) == 2 and row["ms_per_step"] > 0 and row["tokens_per_s"] > 0
    assert row["compiled_peak_gib"] > 0
    assert re.search(rf"^\| {name} \| [\d.]+ \| \d+ \| [\d.]+ \| [+-][\d.]+ \|$", out, re.M)
  base, mem = (result["rows"][n]["ms_per_step"] for n in ("baseline", "lngram_v2"))
  assert result["overhead_pct"] == pytest.approx(100 * (mem / base - 1))
  target = result["target"]
  assert target["passed"] == (result["overhead_pct"] <= 5.0)
  verdict = "PASS" if target["passed"] else "FAIL"
  assert f"Lngram training-step overhead <= +5%: {verdict} ({result['overhead_pct']:.1f}%)" in out
  assert (out_dir / "ckpt" / "config.json").exists()   # --dir keeps the checkpoint
  assert result["surrogate_impl"] == "auto"


def test_surrogate_impl_is_passed_to_the_run(monkeypatch, tmp_path):
  """`--surrogate-impl gather` reaches `run` (which sets it on the memory layers before
  the steps are traced) and is recorded."""
  seen = []

  def fake_run(*args, **kwargs):
    seen.append(kwargs["surrogate_impl"])
    return {"rows": {}, "step0_check": {"passed": False, "max_abs_diff": 1.0,
                                        "max_abs_logit": 1.0, "tolerance": 0.0,
                                        "losses_finite": True}}

  monkeypatch.setattr(hf_train_step, "run", fake_run)
  monkeypatch.setattr(hf_train_step.hf_import, "write_checkpoint", lambda *a, **k: 0)
  path = tmp_path / "r.json"
  with pytest.raises(SystemExit):   # the fake step-0 check fails: exit 1, nothing timed
    hf_train_step.main(["--tiny", "--surrogate-impl", "gather", "--dir", str(tmp_path),
                        "--json", str(path)])
  assert seen == ["gather"]
  assert json.loads(path.read_text())["surrogate_impl"] == "gather"
  with pytest.raises(SystemExit):
    hf_train_step.parse_args(["--tiny", "--surrogate-impl", "fast"])


def test_failed_step_0_check_is_not_timed():
  result = {"step0_check": {"max_abs_diff": 1.0, "max_abs_logit": 2.0, "tolerance": 1e-3,
                            "losses_finite": True, "passed": False}}
  report = hf_train_step.format_report(result)
  assert ": FAIL" in report and "not timed" in report and "overhead" not in report


def test_depth_without_the_memory_layers_is_refused(capsys):
  with pytest.raises(SystemExit) as e:
    hf_train_step.parse_args(["--layers", "8"])
  assert e.value.code == 2 and "lacks layer 13" in capsys.readouterr().err
  args = hf_train_step.parse_args(["--layers", "8", "--memory-layers", "1,5"])
  assert args.memory_layers == (1, 5) and args.batch == 8 and args.seq_len == 1024
  with pytest.raises(SystemExit):
    hf_train_step.parse_args(["--tiny", "--memory-layers", "1,4"])


def test_gpu_suite_runs_the_step_after_pvm_cost():
  """Both branches (GPU and SMOKE) name the step, its JSON, and a layer-14 depth."""
  text = SUITE.read_text()
  assert subprocess.run(["bash", "-n", str(SUITE)]).returncode == 0
  steps = re.findall(r"^\s*step ([\w-]+) (\d+) ", text, re.M)
  names = [n for n, _ in steps]
  at = [i for i, n in enumerate(names) if n == "hf-train-step"]
  assert len(at) == 2 and all(names[i - 1] in ("pvm-cost", "hf-train-step") for i in at)
  assert names.index("pvm-cost") + 2 == at[0] and at[1] == at[0] + 1
  commands = re.findall(r"step hf-train-step \d+ ((?:[^\n]*\\\n)*[^\n]*)", text)
  assert all("experiments.tools.bench.hf_train_step" in c and '"$OUT/hf_train_step.json"' in c
             for c in commands)
  assert any("--tiny" in c for c in commands)
  full = next(c for c in commands if "--tiny" not in c).replace("\\\n", " ").split()
  args = hf_train_step.parse_args(full[full.index("experiments.tools.bench.hf_train_step") + 1:])
  assert args.layers >= 16 and 13 in args.memory_layers and 1 in args.memory_layers
  assert "hf_train_step.json" in text.split("set -u")[0]   # the header lists the output
