"""The training-throughput benchmark: per-model config args and the step split."""

import pytest

from experiments.tools.bench import train as bench_train


def test_a_model_entry_may_carry_its_own_config_arg():
  assert bench_train._config_path("lm_lngram", "") == "experiments/configs/lm_lngram.py"
  assert bench_train._config_path("lm_lngram:none", "") == "experiments/configs/lm_lngram.py:none"
  assert (bench_train._config_path("lm_lngram:none", "smoke")
          == "experiments/configs/lm_lngram.py:smoke,none")


def test_unknown_model_is_refused_with_the_choices():
  with pytest.raises(SystemExit):
    bench_train.main(["--models=lm_lngram,lm_nope:none", "--steps=1", "--repeats=1"])


def test_split_reports_every_part_for_every_model(capsys):
  result = bench_train.main(["--models=lm_baseline,lm_lngram:none", "--args=smoke",
                             "--steps=2", "--repeats=1", "--split"])
  assert set(result["tokens_per_s"]) == {"lm_baseline", "lm_lngram:none"}
  for name, row in result["ms_per_step"].items():
    assert set(row) == {"step", "forward", "forward+backward", "optimizer"}, name
    assert all(v > 0 for v in row.values()), row
  # The ratio is computed from the two measured throughputs, not assumed.
  tok = result["tokens_per_s"]
  assert result["ratio_over_lm_baseline"]["lm_lngram:none"] == pytest.approx(
      tok["lm_lngram:none"] / tok["lm_baseline"], abs=1e-3)
  assert "| model (ms per step) |" in capsys.readouterr().out
