"""PVM's rerun in the report: the premise, the claims from run files (its scene bootstrap is
experiments.analysis.stats.group_bootstrap_ci, tested with the other statistics)."""

import json

import numpy as np
import pytest

from experiments.tools import reproduce
from experiments.tools.report import vlm as report_vlm

GROUPS = ("very_short", "short", "medium", "long")


def test_premise_delta_compares_the_two_windows_over_layers():
  t = np.arange(1, 901)
  fading = {"t": t.tolist(), "layers": {"0": {"mass": (10.0 / (10.0 + t)).tolist()},
                                        "1": {"mass": np.full(900, 0.2).tolist()}}}
  want = 0.5 * ((10.0 / (10.0 + t[90:110])).mean() - (10.0 / (10.0 + t[400:800])).mean())
  assert report_vlm.premise_delta(fading) == pytest.approx(want)
  assert report_vlm.premise_delta({"t": list(range(1, 200)), "layers": {}}) is None


def _eval(item_by_scene, groups):
  per_group = {g: {"n": int(sum(x == g for x in groups)),
                   "item_acc": float(np.mean([a for a, x in zip(item_by_scene, groups, strict=True)
                                              if x == g])) if g in groups else None}
               for g in GROUPS}
  return {"n": len(groups), "overall": {"item_acc": float(np.mean(item_by_scene)),
                                        "answer_acc": 0.5, "reward": 0.0},
          "groups": per_group,
          "per_scene": {"digest": [f"s{i}" for i in range(len(groups))],
                        "k": [1 + 4 * GROUPS.index(g) for g in groups], "group": list(groups),
                        "item_acc": list(item_by_scene),
                        "answer_acc": [0.5] * len(groups)}}


def _write(root, name, seed, ev=None, attention=None, steps=(10, 20)):
  workdir = reproduce.run_dir(next(r for r in reproduce.vlm_plan()
                                   if r.name == name and r.seed == seed), root)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "metrics.json").write_text(json.dumps(
      {"eval": ev or _eval([0.5] * 4, GROUPS), "history": {"steps": list(steps)}}))
  if attention is not None:
    (workdir / "attention_decay.json").write_text(json.dumps(attention))


def _fading(scale, step=20):
  t = np.arange(1, 901)
  return {"t": t.tolist(), "layers": {"0": {"mass": (scale / (1.0 + t / 100)).tolist()}},
          "source": {"step": step}}


def test_claims_from_run_files_paired_by_seed(tmp_path):
  groups = ["very_short", "long", "very_short", "long"]
  gains = {0: 0.100, 1: 0.101, 2: 0.099}   # PVM over the MLP on long answers only
  for seed, gain in gains.items():
    _write(tmp_path, "base", seed, attention=_fading(0.3 + 0.01 * seed))
    _write(tmp_path, "sft_mlp", seed, _eval([0.5, 0.4, 0.6, 0.4], groups))
    _write(tmp_path, "sft_pvm", seed, _eval([0.5, 0.4 + gain, 0.6, 0.4 + gain], groups))
    _write(tmp_path, "sft_none", seed, _eval([0.5, 0.4, 0.6, 0.4], groups))
  values = {c: report_vlm.claim_values(tmp_path, spec) for c, _, spec in report_vlm.CLAIMS}
  overall, long_, growth, over_mlp, mlp_growth = (values[c][1]
                                                  for c, _, _ in report_vlm.CLAIMS[1:])
  np.testing.assert_allclose(overall, [g / 2 for g in gains.values()])
  np.testing.assert_allclose(long_, list(gains.values()))
  np.testing.assert_allclose(growth, list(gains.values()))   # very short: no gain
  np.testing.assert_allclose(over_mlp, overall)
  np.testing.assert_allclose(mlp_growth, growth)
  premise = values[report_vlm.CLAIMS[0][0]][1]
  assert len(premise) == 3 and all(d > 0 for d in premise)
  table = report_vlm.claims_table(tmp_path)
  row = next(line for line in table.splitlines() if "no branch on long answers" in line)
  assert "| 3 | +0.1000 [" in row and "supported" in row
  # The scene bootstrap of the long-group claim: both long scenes gain the seed mean.
  assert "[+0.1000, +0.1000]" in row
  assert "Holm" in table and "pending" not in table


def test_claims_wait_for_seeds_and_the_premise_for_its_analysis(tmp_path):
  _write(tmp_path, "base", 0)                      # no attention_decay.json yet
  _write(tmp_path, "base", 1, attention=_fading(0.3, step=10))   # from an older checkpoint
  _write(tmp_path, "sft_pvm", 0)
  table = report_vlm.claims_table(tmp_path)
  assert table.count("pending: n = 0 seeds (none done)") == len(report_vlm.CLAIMS) == 6
  jobs, skipped = reproduce.analysis_jobs(tmp_path)
  vlm_jobs = {run.key: names for run, names, _ in jobs if run.experiment == reproduce.VLM}
  assert vlm_jobs == {"vlm_long/base_s0": ("attention",), "vlm_long/base_s1": ("attention",)}
  assert ("vlm_long/base_s2", "not finished") in skipped
  command = reproduce.analyze_command(next(r for r, _, _ in jobs
                                           if r.key == "vlm_long/base_s0"), ("attention",),
                                      tmp_path)
  assert command[1:] == ["analyze", f"--workdir={tmp_path}/vlm_long/base_s0",
                         "--which=attention", "--n=64", "--max_new_tokens=900"]
  _write(tmp_path, "base", 1, attention=_fading(0.3, step=20))
  jobs, skipped = reproduce.analysis_jobs(tmp_path)
  assert "vlm_long/base_s1" not in {run.key for run, _, _ in jobs}
  premise = report_vlm.claims_table(tmp_path).splitlines()[4]
  assert premise.endswith("| pending: n = 1 seed (seed 1 done) |")
  assert ("vlm_long/base_s1", "already written: attention (--force redoes it)") in skipped


def test_the_lora_claims_are_a_family_of_their_own(tmp_path):
  """PVM against LoRA-SFT: paired by seed like the other arms, Holm over its two claims
  only; the six claims of the first family do not change when LoRA runs finish."""
  groups = ["very_short", "long", "very_short", "long"]
  for seed in reproduce.VLM_SEEDS:
    _write(tmp_path, "sft_pvm", seed, _eval([0.5, 0.6, 0.6, 0.6], groups))
    _write(tmp_path, "sft_mlp", seed, _eval([0.5, 0.4, 0.6, 0.4], groups))
  first = report_vlm.claims_table(tmp_path)
  assert "pending" in report_vlm.claims_table(tmp_path, report_vlm.LORA_CLAIMS)
  gains = {0: 0.05, 1: 0.06, 2: 0.04}   # PVM over LoRA on long answers only
  for seed, gain in gains.items():
    _write(tmp_path, "sft_lora", seed, _eval([0.5, 0.6 - gain, 0.6, 0.6 - gain], groups))
  overall, growth = (report_vlm.claim_values(tmp_path, spec)[1]
                     for _, _, spec in report_vlm.LORA_CLAIMS)
  np.testing.assert_allclose(overall, [g / 2 for g in gains.values()])
  np.testing.assert_allclose(growth, list(gains.values()))
  lora = report_vlm.claims_table(tmp_path, report_vlm.LORA_CLAIMS)
  assert "Holm over these 2 claims (2 evaluable)" in lora and "premise" not in lora
  assert lora.count("| 3 | +0.0") == 2
  assert report_vlm.claims_table(tmp_path) == first
  section = report_vlm.vlm_section(tmp_path)
  assert "`vlm_long/sft_lora_s2` | `vlm_long_sft.py:lora,s2`" in section
