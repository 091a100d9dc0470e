"""The token-data benchmark runs end to end at a microscopic size, so it cannot rot."""

import pytest

from experiments.tools.bench import tokens as bench


@pytest.mark.slow  # trains a tokenizer, prepares twice and compiles a smoke train step
def test_main_measures_both_ratios(capsys):
  result = bench.main(["--max_docs=30", "--files=2", "--vocab_size=300", "--steps=2",
                       "--repeats=1", "--config=experiments/configs/lm_lngram.py:smoke",
                       "--big_batch=8x64", "--big_batches=5"])
  p, ld = result["prepare"], result["loader"]
  assert p["docs"] == 30 and p["tokens_with_eos"] == p["tokens"] + 30
  assert p["ratio"] == pytest.approx(p["prepare_tokens_per_s"] / p["encode_batch_tokens_per_s"],
                                     rel=0.01)
  assert p["ratio_fast"] == pytest.approx(
      p["prepare_tokens_per_s"] / p["encode_batch_fast_tokens_per_s"], rel=0.01)
  assert ld["vocab_size"] == 300 and ld["batch"] == [4, 32]
  assert ld["loader_rows_per_s"] > 0 and ld["step_rows_per_s"] > 0
  la = result["loader_alone"]
  assert la["batch"] == [8, 64] and la["batches"] == 5 and la["rows_per_s"] > 0
  assert la["rss_mb_end"] > 0
  out = capsys.readouterr().out
  assert f"| {p['ratio']:.3f} |" in out and f"| {p['ratio_fast']:.3f} |" in out and f"| {ld['ratio']:.1f} |" in out
