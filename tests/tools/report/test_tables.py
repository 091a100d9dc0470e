"""experiments.tools.report.tables: RESULTS tables come from run files, with mean ± std over seeds."""

import json

import pytest

from experiments.tools.report import tables


def _write_run(path, overall_answer, groups_answer, item=0.5):
  path.mkdir(parents=True)
  groups = {g: {"n": 4, "item_acc": item, "answer_acc": a, "reward": 0.0}
            for g, a in zip(tables.GROUPS, groups_answer, strict=True)}
  path.joinpath("accuracy_by_length.json").write_text(json.dumps(
      {"overall": {"answer_acc": overall_answer, "item_acc": item, "reward": 0.0},
       "groups": groups}))
  return str(path)


def test_one_run_and_seeds(tmp_path):
  base = _write_run(tmp_path / "base", 0.25, [1.0, 0.5, 0.0, 0.25])
  s0 = _write_run(tmp_path / "s0", 0.4, [1.0, 0.5, 0.5, 0.0])
  s1 = _write_run(tmp_path / "s1", 0.6, [1.0, 0.5, 0.0, 0.5])
  rows = tables.accuracy_rows([("base", [base]), ("arm", [s0, s1])], "answer_acc")
  assert rows[2] == "| base | 0.250 | 1.000 | 0.500 | 0.000 | 0.250 |"
  # mean 0.5, sample std of (0.4, 0.6) = 0.1414
  assert rows[3] == ("| arm, 2 seeds | 0.500 ± 0.141 | 1.000 ± 0.000 | 0.500 ± 0.000 | "
                     "0.250 ± 0.354 | 0.250 ± 0.354 |")


def test_missing_run_file_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="accuracy_by_length.json"):
    tables.read_accuracy(tmp_path)


def test_bad_arm_spec():
  with pytest.raises(SystemExit, match="LABEL=RUN_DIR"):
    tables.parse_arms(["no-equals-sign"])
