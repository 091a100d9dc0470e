"""The benchmark runs end to end on a microscopic shape, so it cannot rot."""

import json
import math

import pytest
from flax import nnx

from experiments.tools.bench import layer as bench


@pytest.mark.slow  # a benchmark smoke run: compiles and times several programs
def test_main_runs_on_tiny_shape_and_writes_json(tmp_path, capsys):
  path = tmp_path / "bench.json"
  # One layer variant keeps the compile count (and the test) small.
  result = bench.main(["--shape", "tiny", "--repeats", "1", "--readouts", "absorbed",
                       "--surrogates", "onebit", "--surrogate-impls",
                       bench.DEFAULT_SURROGATE_IMPL, "--json", str(path)])
  out = capsys.readouterr().out
  rows = result["rows"]
  assert set(rows) == {"dense decoder layer", "lngram absorbed / onebit",
                       "readout only: literal", "readout only: absorbed"}
  dense = rows["dense decoder layer"]
  for name, row in rows.items():
    assert math.isfinite(row["fwd_ms"]) and math.isfinite(row["fwd_bwd_ms"]), name
    # The derived columns are computed from the measured ones, and printed as such.
    assert row["bwd_ms"] == max(row["fwd_bwd_ms"] - row["fwd_ms"], 0.0), name
    assert row["fwd_vs_dense"] == pytest.approx(row["fwd_ms"] / dense["fwd_ms"]), name
    assert (f"| {name} | {row['fwd_ms']:.2f} | {row['fwd_bwd_ms']:.2f} | {row['bwd_ms']:.2f} "
            f"| {row['fwd_vs_dense']:.2f}x |") in out, name
  assert dense["fwd_vs_dense"] == 1.0
  names = [t["name"] for t in result["targets"]]
  assert len(names) == 2 and all(("PASS: " + n in out) or ("FAIL: " + n in out) for n in names)
  saved = json.loads(path.read_text())
  assert saved["shape_name"] == "tiny" and saved["rows"].keys() == rows.keys()


@pytest.mark.parametrize("shape_name", sorted(bench.SHAPES))
def test_every_shape_builds_its_dense_yardstick(shape_name):
  """Abstractly (no weights are drawn): the r512 shape's readout heads (dh 256 at
  d 2048, 16 heads) once broke the dense layer's constructor on the GPU."""
  shape = bench.SHAPES[shape_name]
  layer = nnx.eval_shape(lambda: bench.dense_layer(shape))
  assert layer.w_q.shape == (shape.d_model, shape.d_model)
  assert layer.w_o.shape == (shape.d_model, shape.d_model)


def _row(fwd, fwd_bwd, dense=(1.0, 1.0)):
  return {"fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd, "bwd_ms": fwd_bwd - fwd,
          "fwd_vs_dense": fwd / dense[0], "fwd_bwd_vs_dense": fwd_bwd / dense[1]}


# Targets: absorbed 3x literal; one-bit bwd <= 2x none bwd; layer vs dense;
# one-bit fwd+bwd <= 1.3x none; exact fwd+bwd <= 1.6x none.
@pytest.mark.parametrize("literal_fb, onebit_fb, none_fb, exact_fb, dense, expected", [
    # 3x, bwd 0.9 vs 0.5, 0.5x dense, 1.27x, 1.57x
    (3.0, 1.9, 1.5, 2.35, (2.0, 4.0), [True, True, True, True, True]),
    # 2.9x, bwd 1.5 vs 0.5, fwd 1.1x, 1.67x, 1.61x
    (2.9, 2.5, 1.5, 2.42, (0.9, 4.0), [False, False, False, False, False]),
])
def test_targets_use_the_issue_thresholds(literal_fb, onebit_fb, none_fb, exact_fb, dense,
                                          expected):
  rows = {
      "readout only: literal": _row(0.5, literal_fb),
      "readout only: absorbed": _row(0.2, 1.0),
      "lngram absorbed / onebit": _row(1.0, onebit_fb, dense),
      "lngram absorbed / none": _row(1.0, none_fb, dense),
      "lngram absorbed / exact": _row(1.0, exact_fb, dense),
  }
  assert [t["passed"] for t in bench.check_targets(rows)] == expected


@pytest.mark.slow  # a benchmark smoke run
def test_both_surrogate_impls_are_timed_with_ratios_to_none(capsys):
  default = bench.resolve_surrogate_impl(bench.DEFAULT_SURROGATE_IMPL, "onebit")
  other = next(i for i in ("gather", "blocks") if i != default)
  result = bench.main(["--shape", "tiny", "--repeats", "1", "--readouts", "absorbed",
                       "--surrogates", "none,onebit"])
  rows = result["rows"]
  assert {"lngram absorbed / onebit", f"lngram absorbed / onebit ({other})",
          "lngram absorbed / none"} <= set(rows)
  none = rows["lngram absorbed / none"]
  assert none["fwd_bwd_vs_none"] == 1.0
  row = rows[f"lngram absorbed / onebit ({other})"]
  assert row["fwd_bwd_vs_none"] == pytest.approx(row["fwd_bwd_ms"] / none["fwd_bwd_ms"])
  assert f"| onebit ({other}) | {row['fwd_bwd_ms']:.2f} | {row['fwd_bwd_vs_none']:.2f}x |" in (
      capsys.readouterr().out)


def test_bad_flags_are_rejected():
  with pytest.raises(SystemExit):
    bench.parse_args(["--readouts", "fastest"])
  with pytest.raises(SystemExit):
    bench.parse_args(["--repeats", "0"])
  with pytest.raises(SystemExit):
    bench.parse_args(["--surrogate-impls", "pallas"])
