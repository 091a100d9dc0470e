"""The reproduction plan (experiments.reproduce) and its report (experiments.report)."""

import json
import statistics

from experiments import report, reproduce
from experiments.configs import load_config
from experiments.models import lm_config


def test_plan_commands_are_valid_and_distinct():
  runs = reproduce.plan()
  assert len({r.key for r in runs}) == len(runs)
  keys = {r.key for r in runs}
  for run in runs:
    lm_config(load_config(f"{reproduce.CONFIGS}/{run.config}"))
    assert run.after is None or run.after in keys
    command = run.command()
    assert command[:2] == ["lngram-exp", "train"]
    assert f"--config.train.seed={run.seed}" in command
  main = [r for r in runs if r.experiment == "main"]
  assert {r.name for r in main} == {"baseline", "lngram_r16", "lngram_r64", "lngram_v1", "pkm",
                                    "engram", "sparse_ffn"}
  assert all(sorted(r.seed for r in main if r.name == n) == [0, 1, 2] for n in {"pkm"})


def _fake_run(root, key, finals, steps=600):
  experiment, name = key.split("/")
  workdir = root / experiment / name
  workdir.mkdir(parents=True)
  rows = [{"step": 10, "train/tokens_per_s": 1.0}, {"step": 20, "train/tokens_per_s": 100.0},
          {"step": 30, "train/tokens_per_s": 300.0}]
  rows += [{"step": s, "eval/bits_per_byte": v} for s, v in finals]
  (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return workdir


def test_report_from_run_files(tmp_path):
  root = tmp_path / "repro"
  _fake_run(root, "main/baseline_s0", [(300, 2.5), (600, 2.20)])
  _fake_run(root, "main/baseline_s1", [(300, 2.6), (600, 2.30)])
  _fake_run(root, "main/lngram_r16_s0", [(300, 2.4)])   # still running
  text = report.report(root, tmp_path / "plots")
  want = f"{statistics.mean([2.2, 2.3]):.4f} ± {statistics.stdev([2.2, 2.3]):.4f}"
  [baseline] = [line for line in text.splitlines() if line.startswith("| baseline ")]
  assert want in baseline and "| 0, 1 |" in baseline and "| 200 |" in baseline
  [lngram] = [line for line in text.splitlines() if line.startswith("| lngram_r16 ")]
  assert "running: [0]" in lngram and "4.556M / 0.102M" in lngram
  assert (tmp_path / "plots" / "main.png").read_bytes()[:4] == b"\x89PNG"


def test_finished_means_the_final_evaluation_was_written(tmp_path, monkeypatch):
  monkeypatch.setattr(reproduce, "ROOT", tmp_path)
  done, cut = (next(r for r in reproduce.plan() if r.key == key)
               for key in ("main/pkm_s0", "main/pkm_s1"))
  _fake_run(tmp_path, "main/pkm_s0", [(600, 2.1)])
  _fake_run(tmp_path, "main/pkm_s1", [(200, 2.9), (400, 2.4)])
  assert reproduce.finished(done) and not reproduce.finished(cut)


def test_verdicts():
  assert report.verdict([2.0, 2.01], [2.2, 2.21]).startswith("reproduced")
  assert report.verdict([2.2, 2.21], [2.0, 2.01]).startswith("not reproduced")
  assert report.verdict([2.0, 2.2], [2.05, 2.25]).startswith("inconclusive")
  assert report.verdict([2.0], [2.2, 2.3]).startswith("pending")


def test_shared_runs_have_the_config_of_the_run_they_read():
  """A run that reads another's directory must be the same training: equal config, seed."""
  runs = reproduce.plan()
  by_key = {r.key: r for r in runs}
  shared = [r for r in runs if r.same_as]
  assert {r.key for r in shared} >= {"sink/sink_s0", "surrogate/onebit_s1", "routes/r16_kv2_s0"}
  for run in shared:
    original = by_key[run.same_as]
    assert original.same_as is None and original.seed == run.seed
    assert original.overrides == run.overrides
    assert (load_config(f"{reproduce.CONFIGS}/{run.config}").to_dict()
            == load_config(f"{reproduce.CONFIGS}/{original.config}").to_dict())
    assert run.workdir == original.workdir


def test_training_order_is_seed_major_and_trains_a_shared_run_once():
  runs = reproduce.plan()
  by_key = {r.key: r for r in runs}
  order = reproduce.training_order(runs, by_key)
  assert [r.seed for r in order] == sorted(r.seed for r in order)
  assert len({r.key for r in order}) == len(order) and all(r.same_as is None for r in order)
  assert len(order) == len([r for r in runs if r.same_as is None])
  keys = [r.key for r in order]
  assert keys.index("insertion/baseline_300_s0") < keys.index("insertion/inserted_300_s0")
  # Selecting only the sink study still trains the main r16 runs it reads.
  sink_only = reproduce.training_order(reproduce.select(runs, "sink"), by_key)
  assert [r.key for r in sink_only] == ["main/lngram_r16_s0", "sink/nosink_s0",
                                        "main/lngram_r16_s1", "sink/nosink_s1",
                                        "main/lngram_r16_s2", "sink/nosink_s2"]


def test_report_reads_a_shared_run_from_the_directory_it_shares(tmp_path):
  root = tmp_path / "repro"
  _fake_run(root, "main/lngram_r16_s0", [(600, 2.05)])
  results = report.collect(root)
  assert results["sink"]["sink"]["seeds"][0]["final"] == 2.05
  assert results["surrogate"]["onebit"]["seeds"][0]["final"] == 2.05
