"""experiments.tools.bench.scan_decode: its arguments, a smoke run and its agreement check."""

import pytest

from experiments.tools.bench import scan_decode
from experiments.tools.bench.scan_lm import build_lm


def test_smoke_run_prints_the_table_and_checks_agreement():
  lines = []
  result = scan_decode.main(["--smoke"], log=lines.append)
  assert set(result["ms_per_token"]) == {"unrolled", "scanned"}
  assert result["scan_over_unrolled"] > 0
  assert result["logits_rel_err"] < 1e-4 and result["tokens_agree"] == 1.0
  text = "\n".join(lines)
  assert "| unrolled |" in text and "| scanned |" in text and "scanned / unrolled" in text


def test_a_scanned_model_with_other_weights_is_caught(monkeypatch):
  def other_weights(config, seed=0, *, scan=False):
    return build_lm(config, seed + scan, scan=scan)

  monkeypatch.setattr(scan_decode, "build_lm", other_weights)
  with pytest.raises(AssertionError, match="first-step logits differ"):
    scan_decode.main(["--smoke"], log=lambda _: None)


@pytest.mark.parametrize("argv,match", [
    (["--width", "100"], "multiple of 64"),
    (["--layers", "2"], "at least 2 layers"),
    (["--prompt", "2000"], "must fit --cache"),
    (["--batch", "0"], ">= 1"),
])
def test_bad_arguments_are_refused(argv, match, capsys):
  with pytest.raises(SystemExit):
    scan_decode.parse_args(argv)
  assert match in capsys.readouterr().err


def test_smoke_shape():
  a = scan_decode.parse_args(["--smoke"])
  assert (a.layers, a.width, a.cache, a.prompt) == (4, 64, 64, 16)
