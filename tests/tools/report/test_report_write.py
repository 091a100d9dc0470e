"""`python -m experiments.tools.report --write=FILE`: the generated part of RESULTS.md is replaced
between its markers, the hand-written text around it is kept, and a file without the
markers is refused rather than overwritten."""


import pytest

from experiments.tools.report import document as report

RESULTS = report.RESULTS_DIR / "RESULTS.md"


def _document(generated: str) -> str:
  return (f"# Results\n\nprose before\n\n---\n\n{report.BEGIN}\n\n{generated}\n\n"
          f"{report.END}\n\n## PVM\n\nprose after\n")


def test_splice_replaces_only_the_generated_part_and_is_idempotent():
  old = _document("| old | table |")
  new = report.splice(old, "| new | table |\n\n")
  assert new == _document("| new | table |")
  assert report.splice(new, "| new | table |") == new


@pytest.mark.parametrize("document", [
    "# Results\n\nno markers\n",
    f"{report.BEGIN}\nonly the start\n",
    f"{report.END}\n\n{report.BEGIN}\n",                                  # in the wrong order
    _document("a") + f"\n{report.BEGIN}\n{report.END}\n",                # twice
])
def test_splice_refuses_a_document_without_one_pair_of_markers(document):
  with pytest.raises(ValueError, match="expected one line"):
    report.splice(document, "| table |")


def test_write_regenerates_a_file_and_refuses_one_without_markers(tmp_path, capsys):
  target = tmp_path / "RESULTS.md"
  target.write_text(_document("stale tables"))
  report.main([f"--root={tmp_path / 'records'}", f"--out={tmp_path / 'plots'}",
               f"--write={target}"])
  text = target.read_text()
  assert "stale tables" not in text and "No finished run of this design" in text
  assert text.startswith("# Results\n\nprose before\n") and text.endswith("prose after\n")
  assert capsys.readouterr().out == f"wrote the generated part of {target}\n"
  plain = tmp_path / "hand_written.txt"
  plain.write_text("# hand-written only\n")
  with pytest.raises(SystemExit):
    report.main([f"--root={tmp_path / 'records'}", f"--out={tmp_path / 'plots'}",
                 f"--write={plain}"])
  assert plain.read_text() == "# hand-written only\n"
  assert "expected one line" in capsys.readouterr().err


def test_the_repository_s_results_file_carries_the_markers():
  report.splice(RESULTS.read_text(), "")     # raises if a marker was lost in an edit
