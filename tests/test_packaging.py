"""Checks on the packaging and CI wiring of the project."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

START_MARKER = "<!-- test-command -->"
END_MARKER = "<!-- /test-command -->"


def _readme_test_command_lines():
    """Same extraction as .ci/run: non-empty, non-fence lines between the markers."""
    text = (ROOT / "README.md").read_text()
    match = re.search(re.escape(START_MARKER) + r"\n(.*?)" + re.escape(END_MARKER), text, re.S)
    assert match, "README.md has no test-command block"
    block = match.group(1)
    assert re.fullmatch(r"```\w*\n[^\n]*\n```\n", block), f"malformed block: {block!r}"
    return [line for line in block.splitlines() if line.strip() and not line.startswith("```")]


def test_readme_has_single_test_command():
    lines = _readme_test_command_lines()
    assert len(lines) == 1
    assert "pytest" in lines[0]


def test_ci_script_reads_the_readme_markers():
    script = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in script
    assert START_MARKER in script
    assert "<!-- \\/test-command -->" in script or END_MARKER in script


def test_pytest_markers_registered():
    with open(ROOT / "pyproject.toml", "rb") as f:
        pyproject = tomllib.load(f)
    markers = pyproject["tool"]["pytest"]["ini_options"]["markers"]
    names = {m.split(":", 1)[0].strip() for m in markers}
    assert {"slow", "gpu", "tpu"} <= names


def test_markers_known_to_pytest(pytestconfig):
    registered = {m.split(":", 1)[0].strip() for m in pytestconfig.getini("markers")}
    assert {"slow", "gpu", "tpu"} <= registered


def test_package_imports_with_version():
    import lngram_jax

    assert isinstance(lngram_jax.__version__, str)
