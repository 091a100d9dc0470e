"""The front page and its guides: README.md stays short and keeps its two commands, every
page it links exists, every link between them lands, and docs/commands.md is what the
commands' `--help` prints (`python -m experiments.tools.docs` regenerates it)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli import COMMANDS
from experiments.tools import docs

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The README's two commands, byte for byte: the main job (with its install) and the test
# command between the markers that .ci/run reads (tests/test_packaging.py checks the latter's
# extraction).
MAIN_JOB = ("```bash\npip install -e '.[dev]' && lngram-exp train "
            "--config=experiments/configs/lm_lngram.py --workdir=runs/lm_lngram\n```\n")
TEST_COMMAND = ("<!-- test-command -->\n```bash\npip install -e '.[dev,tpu,gpu-compile]' && "
                "python -m pytest -q -n 2 --dist worksteal\n```\n<!-- /test-command -->\n")

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _pages() -> list[Path]:
  return sorted(DOCS.glob("*.md"))


def _prose(text: str) -> list[str]:
  """The lines outside fenced code blocks, with inline code removed."""
  lines, inside = [], False
  for line in text.splitlines():
    if _FENCE.match(line.strip()):
      inside = not inside
      continue
    if not inside:
      lines.append(re.sub(r"`[^`]*`", "", line))
  return lines


def _links(path: Path) -> list[str]:
  return [m for line in _prose(path.read_text()) for m in _LINK.findall(line)]


def _anchors(path: Path) -> set[str]:
  return {docs._anchor(line.lstrip("#").strip())
          for line in _prose(path.read_text()) if re.match(r"#{1,6} ", line)}


def test_commands_md_is_what_the_commands_help_prints():
  committed = docs.COMMANDS_MD.read_text()
  assert committed == docs.commands_md(), (
      "docs/commands.md differs from the commands' --help: run `python -m experiments.tools.docs`")


def test_every_command_has_its_help_on_the_page():
  page = docs.COMMANDS_MD.read_text()
  assert list(COMMANDS) == list(docs.COMMANDS) and len(COMMANDS) >= 10
  for name in COMMANDS:
    assert f"## lngram-exp {name}\n\n```text\nusage: lngram-exp {name} " in page, name
    assert f"](#lngram-exp-{name})" in page, name


def test_the_in_process_help_is_the_console_s(tmp_path):
  """The page's text is what a shell gets from the installed entry point, not a rendering
  of our own: `python -m experiments [COMMAND] --help` in a child process, 80 columns."""
  env = {**os.environ, "COLUMNS": str(docs.WIDTH)}
  for command in (None, "plan"):
    argv = [sys.executable, "-m", "experiments", *([command] if command else []), "--help"]
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out == docs.help_text(command), command


def test_help_text_ignores_the_terminal_it_runs_in(monkeypatch):
  monkeypatch.setenv("COLUMNS", "200")
  wide = docs.help_text()
  assert os.environ["COLUMNS"] == "200"
  monkeypatch.delenv("COLUMNS")
  assert docs.help_text() == wide
  assert "COLUMNS" not in os.environ


def test_check_reports_a_stale_page(tmp_path, capsys):
  page = tmp_path / "commands.md"
  assert docs.main([f"--out={page}"]) == 0
  assert page.read_text() == docs.commands_md()
  assert docs.main([f"--out={page}", "--check"]) == 0
  page.write_text(page.read_text().replace("--workdir", "--work_dir"))
  assert docs.main([f"--out={page}", "--check"]) == 1
  assert "python -m experiments.tools.docs" in capsys.readouterr().err


def test_readme_is_short_and_keeps_its_two_commands():
  text = README.read_text()
  assert len(text.splitlines()) <= 200, f"README.md has {len(text.splitlines())} lines"
  assert text.count(MAIN_JOB) == 1, "the README's main job command changed"
  assert text.count(TEST_COMMAND) == 1, "the README's test command changed"
  assert text.index(MAIN_JOB) < text.index(TEST_COMMAND)


def test_every_guide_the_readme_links_exists_and_every_page_is_linked():
  linked = {(ROOT / link.split("#")[0]).resolve() for link in _links(README)
            if link.startswith("docs/")}
  missing = sorted(str(p.relative_to(ROOT)) for p in linked if not p.is_file())
  assert not missing, f"README.md links pages that do not exist: {missing}"
  orphans = sorted(p.name for p in _pages() if p.resolve() not in linked)
  assert not orphans, f"docs/ pages the README's guide table does not link: {orphans}"
  assert len(linked) >= 9


@pytest.mark.parametrize("path", [README, *_pages()], ids=lambda p: p.name)
def test_links_stay_in_the_repository_and_land(path):
  """Every link is relative, names a file of the checkout and, with a #fragment into a
  Markdown file, one of its headings."""
  bad = []
  for link in _links(path):
    if re.match(r"[a-z][a-z0-9+.-]*:", link, re.I) or link.startswith("/"):
      bad.append(f"{link}: points outside the repository")
      continue
    file, _, fragment = link.partition("#")
    target = (path.parent / file).resolve() if file else path.resolve()
    if not target.is_relative_to(ROOT) or not target.exists():
      bad.append(f"{link}: no such file in the repository")
    elif fragment and target.suffix == ".md" and fragment not in _anchors(target):
      bad.append(f"{link}: {target.name} has no heading #{fragment}")
  assert not bad, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(bad)


def test_the_repository_paths_the_pages_name_exist():
  """A file or folder moved in the tree is moved in the guides too."""
  path_re = re.compile(
      r"(?<![\w/.-])((?:experiments|lngram_jax|pvm_jax|kernels|tests|docs)/[\w./*-]*\w)")
  bad = [f"{page.relative_to(ROOT)}: {name}"
         for page in [README, *_pages()] for name in sorted(set(path_re.findall(page.read_text())))
         if not any(ROOT.glob(name))]
  assert not bad, "named but not in the repository:\n  " + "\n  ".join(bad)
