"""Structure checks: which package may import which, and what the code may cite.

Imports are read with `ast` (nothing is imported), so these tests are fast and
name the file, line and import of every violation. The rules (DESIGN.md §6.2):

  * `kernels` imports nothing from `lngram_jax`, `pvm_jax` or `experiments`;
  * `lngram_jax`, `pvm_jax`, `kernels` import nothing from `experiments`;
  * `lngram_jax` imports no orbax (run checkpointing lives in the trainer),
    except the sharded layer's short save / restore on plain orbax
    (`lngram_jax/sharding/checkpoint.py`);
  * the trainer (`experiments/trainer/`) imports nothing from the tasks, the
    models, the VLM or the analyses: it knows no LM, VLM or Lngram;
  * nothing imports the tools (`experiments.tools`: bench, reproduce, report), which
    the wheel leaves out, except those
    tools and tests;
  * no module outside `experiments/configs/` imports from `experiments.configs`
    except the loader helpers of its `__init__.py` and `LATER_FIELDS` (a config
    file is loaded by path, never imported);
  * a config file imports only `ml_collections`, `__future__` and modules of
    `experiments/configs/` (its shared defaults);
  * no import cycle anywhere in the repository: the strongly connected
    components of the whole module graph (every import statement, at module
    level or inside a function, since either may run) are single modules;
  * no import cycle between folders either: the libraries and the top-level
    folders of `experiments/` (cli, jobs, trainer, data, models, hf, vlm,
    analysis, plan, configs, tools) form a layering, each importing only
    folders below it (DESIGN.md §6.2 lists the order).

Which edges an import adds (`import_edges`): `import a.b.c` needs the module
a.b.c and, before it, the packages a and a.b; `from a.b import c` needs a.b.c
when c is a submodule, else the package a.b itself (c is a name its
`__init__` defines). A package that the importing module sits inside is
already being initialised when the module runs, so it adds no edge unless a
name is read from it: a package `__init__` re-exporting its submodules, whose
submodules import their siblings, is not a cycle; a submodule that reads a
name back from its own package's `__init__` is.

Citations: no code or doc file points outside the repository, and every
"DESIGN.md §N" names a section (or subsection) that DESIGN.md has.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("lngram_jax", "pvm_jax", "kernels")
SKIP_DIRS = frozenset({
    ".git", ".venv", ".venv-ci", "__pycache__", ".pytest_cache", ".ruff_cache", "build",
    "dist", "runs", ".ipynb_checkpoints", ".whl", ".gl",
})
CONFIGS = "experiments.configs"
# The loaders, and the defaults of fields added after runs were saved (resume reads them).
CONFIG_HELPERS = frozenset({"load_config", "config_files", "purpose", "CONFIG_DIR",
                            "LATER_FIELDS"})
CONFIG_FILE_ALLOWED = ("ml_collections", "__future__", CONFIGS)
DOC_SUFFIXES = frozenset({".py", ".md", ".sh", ".toml", ".ipynb", ".txt", ".cfg", ".yaml",
                          ".yml", ".rst"})
DESIGN_SECTIONS = {
    1: "Symbols", 2: "Lngram v2 conventions", 3: "PVM conventions", 4: "Data",
    5: "Deviations", 6: "Layout", 7: "Environment and testing", 8: "Comparison arms",
    9: "Reading the IDs", 10: "Training on a mesh", 11: "Pretrained backbones",
    12: "The paper's 0.6B MoE recipes", 13: "LoRA through qwix",
}


# What the repository tracks at its root; other folders there (runs, outputs) are not scanned.
TOP_FOLDERS = ("lngram_jax", "pvm_jax", "kernels", "experiments", "tests", ".ci", "docs")


def _walk(top: Path):
  if top == ROOT:
    for path in sorted(ROOT.iterdir()):
      if path.is_file():
        yield path
    for folder in TOP_FOLDERS:
      if (ROOT / folder).is_dir():
        yield from _walk(ROOT / folder)
    return
  for path in sorted(top.rglob("*")):
    rel = path.relative_to(ROOT).parts
    if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel):
      continue
    if path.is_file():
      yield path


def _rel(path: Path) -> str:
  return path.relative_to(ROOT).as_posix()


def _python_files(*tops: str) -> list[Path]:
  files = []
  for top in tops:
    if (ROOT / top).is_dir():
      files += [p for p in _walk(ROOT / top) if p.suffix == ".py"]
  return files


def _module_name(path: Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _sources(path: Path) -> list[str]:
  """The Python source of a file; for a notebook, each code cell."""
  if path.suffix == ".ipynb":
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c.get("cell_type") == "code"]
  return [path.read_text()]


def imports(path: Path) -> list[tuple[int | str, str, tuple[str, ...]]]:
  """(line, absolute module, imported names) of every import in a file.

  A notebook's lines read "cell<k>:<line>".

  Relative imports are resolved against the file's package; `from a import b`
  gives ("a", ("b",)); `importlib.import_module("x")` / `__import__("x")` with a
  literal name count as imports of "x". Notebook cells that do not parse
  (magics) are skipped.
  """
  module = _module_name(path)
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found = []
  for cell, source in enumerate(_sources(path)):
    where = (lambda n, k=cell: f"cell{k}:{n}") if path.suffix == ".ipynb" else (lambda n: n)
    try:
      tree = ast.parse(source)
    except SyntaxError:
      if path.suffix == ".ipynb":
        continue
      raise
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        found += [(where(node.lineno), alias.name, ()) for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".") if package else []
          parts = parts[: len(parts) - (node.level - 1)]
          base = ".".join(parts + ([base] if base else []))
        found.append((where(node.lineno), base, tuple(alias.name for alias in node.names)))
      elif (isinstance(node, ast.Call) and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and (getattr(node.func, "attr", None) == "import_module"
                 or getattr(node.func, "id", None) == "__import__")):
        found.append((where(node.lineno), node.args[0].value, ()))
  return found


def _within(module: str, package: str) -> bool:
  return module == package or module.startswith(package + ".")


def _targets(base: str, names: tuple[str, ...]) -> list[str]:
  """Modules an import may load: the base, and base.name for `from base import name`."""
  return [base] + [f"{base}.{name}" for name in names if name != "*"]


def _violations(files, forbidden: tuple[str, ...]) -> list[str]:
  bad = []
  for path in files:
    for line, base, names in imports(path):
      if any(_within(t, p) for t in _targets(base, names) for p in forbidden):
        shown = f"from {base} import {', '.join(names)}" if names else f"import {base}"
        bad.append(f"{_rel(path)}:{line}: {shown}")
  return bad


def _report(bad: list[str], rule: str) -> str:
  return f"{rule}; {len(bad)} violation(s):\n  " + "\n  ".join(bad)


# --- the module graph ---------------------------------------------------------

GRAPH_TOPS = LIBRARIES + ("experiments", "tests")


def module_index() -> dict[str, Path]:
  """{module name: file} of every Python module of the repository."""
  return {_module_name(path): path for path in _python_files(*GRAPH_TOPS)}


def _ancestors(module: str) -> list[str]:
  parts = module.split(".")
  return [".".join(parts[:i]) for i in range(1, len(parts))]


def _own_packages(module: str, path: Path) -> set[str]:
  """The packages a module runs inside (a package's `__init__` runs inside itself)."""
  return set(_ancestors(module)) | ({module} if path.name == "__init__.py" else set())


def import_edges(path: Path, modules: dict[str, Path]) -> list[tuple[int | str, str]]:
  """(line, module) of every repository module that importing `path` may run first.

  Test files are imported by pytest under their file name with their folder on
  sys.path, so inside `tests/` a bare name resolves to a sibling file first.
  """
  module = next((m for m, p in modules.items() if p == path), _module_name(path))
  own = _own_packages(module, path)
  siblings = {p.stem: m for m, p in modules.items() if p.parent == path.parent}
  in_tests = module.split(".")[0] == "tests"
  edges = []
  for line, base, names in imports(path):
    if in_tests and base.split(".")[0] in siblings:
      base = siblings[base.split(".")[0]] + base[len(base.split(".")[0]):]
    if names:  # from base import names
      targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
      if len(targets) < len(names):  # a name (or `*`) read from base itself
        targets.append(base)
    else:
      targets = [base]
    for target in targets:
      needed = [a for a in _ancestors(target) if a not in own] + [target]
      edges += [(line, m) for m in needed if m in modules and m != module]
  return edges


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int | str]]:
  """{module: {imported module: the line of the first import that needs it}}."""
  graph: dict[str, dict[str, int | str]] = {}
  for module, path in modules.items():
    graph[module] = {}
    for line, target in import_edges(path, modules):
      graph[module].setdefault(target, line)
  return graph


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
  """Tarjan's strongly connected components, iteratively (no recursion limit)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  components = []
  for start in graph:
    if start in index:
      continue
    work = [(start, iter(graph[start]))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(graph.get(child, ()))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          top = stack.pop()
          on_stack.discard(top)
          component.append(top)
          if top == node:
            break
        components.append(sorted(component))
  return components


def import_cycles(modules: dict[str, Path]) -> list[str]:
  """One entry per cycle: its modules and the imports that close it (file:line)."""
  graph = import_graph(modules)
  out = []
  for component in strongly_connected(graph):
    inside = set(component)
    if len(component) == 1 and component[0] not in graph[component[0]]:
      continue
    edges = [f"{_rel(modules[m])}:{line} -> {t}" for m in component
             for t, line in graph[m].items() if t in inside]
    out.append(f"{' <-> '.join(component)}\n      " + "\n      ".join(edges))
  return out


def test_the_import_reader_resolves_every_form(tmp_path, monkeypatch):
  # The reader itself must catch relative, from- and dynamic imports.
  pkg = tmp_path / "kernels" / "op"
  pkg.mkdir(parents=True)
  source = ("import lngram_jax.layer\nfrom ...experiments.configs import base\n"
            "from .. import pvm_jax\nfrom . import common\n"
            "import importlib\nimportlib.import_module('experiments.x')\n")
  (pkg / "mod.py").write_text(source)
  monkeypatch.setitem(globals(), "ROOT", tmp_path)
  got = [(base, names) for _, base, names in imports(pkg / "mod.py")]
  assert got == [("lngram_jax.layer", ()), ("experiments.configs", ("base",)),
                 ("kernels", ("pvm_jax",)), ("kernels.op", ("common",)),
                 ("importlib", ()), ("experiments.x", ())]


def test_kernels_import_no_model_package():
  bad = _violations(_python_files("kernels"), ("lngram_jax", "pvm_jax", "experiments"))
  assert not bad, _report(bad, "kernels must not import lngram_jax, pvm_jax or experiments")


def test_libraries_do_not_import_experiments():
  bad = _violations(_python_files(*LIBRARIES), ("experiments",))
  assert not bad, _report(bad, "lngram_jax, pvm_jax and kernels must not import experiments")


# The sharded layer's own save / restore on plain orbax (DESIGN.md §2.11): no run infrastructure.
ORBAX_IN_LNGRAM = "lngram_jax/sharding/checkpoint.py"


def test_lngram_jax_imports_no_orbax():
  assert (ROOT / ORBAX_IN_LNGRAM).is_file(), f"{ORBAX_IN_LNGRAM} is gone: drop the exception"
  files = [p for p in _python_files("lngram_jax") if _rel(p) != ORBAX_IN_LNGRAM]
  bad = _violations(files, ("orbax",))
  assert not bad, _report(bad, f"lngram_jax must not import orbax (run checkpointing lives in "
                               f"experiments.trainer; the one exception is {ORBAX_IN_LNGRAM})")


TRAINER = "experiments/trainer"
TRAINER_FORBIDDEN = ("experiments.jobs", "experiments.models", "experiments.vlm",
                     "experiments.analysis")


def test_the_trainer_knows_no_task():
  files = _python_files(TRAINER)
  assert files, f"{TRAINER}/ holds no module"
  bad = _violations(files, TRAINER_FORBIDDEN)
  assert not bad, _report(bad, f"the trainer must not import {', '.join(TRAINER_FORBIDDEN)}")


# The bench and report tools: runnable from the command line, imported by nothing else.
TOOLS = ("experiments.tools",)


def _is_tool(path: Path) -> bool:
  return _module_name(path).split(".")[0] == "tests" or any(
      _within(_module_name(path), tool) for tool in TOOLS)


def test_nothing_imports_the_tools():
  files = [p for p in _walk(ROOT) if p.suffix in (".py", ".ipynb") and not _is_tool(p)]
  bad = _violations(files, TOOLS)
  assert not bad, _report(bad, f"only the tools and tests may import {', '.join(TOOLS)}")


def test_the_cycle_finder(tmp_path, monkeypatch):
  # A cycle through a function-level import and one through a package's own
  # `__init__` are found; a package re-exporting submodules that import their
  # siblings is not a cycle.
  files = {
      "experiments/__init__.py": "",
      "experiments/a.py": "from experiments import b\n",
      "experiments/b.py": "def f():\n  import experiments.c\n",
      "experiments/c.py": "from experiments.a import x\n",
      "experiments/pkg/__init__.py": "from experiments.pkg.one import y\n",
      "experiments/pkg/one.py": "from experiments.pkg import two\n",
      "experiments/pkg/two.py": "import experiments.a\n",
      "experiments/loop/__init__.py": "from experiments.loop.one import z\n",
      "experiments/loop/one.py": "from experiments.loop import helper\n",
  }
  for name, source in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(source)
  monkeypatch.setitem(globals(), "ROOT", tmp_path)
  cycles = sorted(c.split("\n")[0] for c in import_cycles(module_index()))
  assert cycles == ["experiments.a <-> experiments.b <-> experiments.c",
                    "experiments.loop <-> experiments.loop.one"], cycles


def test_no_import_cycle():
  modules = module_index()
  assert len(modules) > 100, sorted(modules)
  cycles = import_cycles(modules)
  assert not cycles, (f"{len(cycles)} import cycle(s) (strongly connected modules and the "
                      "imports inside each):\n  " + "\n  ".join(cycles))


def module_folder(module: str) -> str:
  """The folder a module counts in for the folder rule: a library, a top-level folder of
  `experiments/` (its sub-folders count in it), or `experiments` for the package's own
  modules."""
  parts = module.split(".")
  if (parts[0] == "experiments" and len(parts) > 1
      and (ROOT / "experiments" / parts[1]).is_dir()):
    return ".".join(parts[:2])
  return parts[0]


def folder_cycles(modules: dict[str, Path]) -> list[str]:
  """One entry per cycle between folders (tests left out): its folders and the imports
  that close it (file:line)."""
  graph = import_graph(modules)
  folders: dict[str, dict[str, str]] = {}
  for module, targets in graph.items():
    if module.split(".")[0] == "tests":
      continue
    here = module_folder(module)
    folders.setdefault(here, {})
    for target, line in targets.items():
      there = module_folder(target)
      if there != here:
        folders[here].setdefault(there, f"{_rel(modules[module])}:{line} -> {target}")
  out = []
  for component in strongly_connected(folders):
    if len(component) > 1:
      inside = set(component)
      edges = [why for f in component for t, why in folders[f].items() if t in inside]
      out.append(f"{' <-> '.join(component)}\n      " + "\n      ".join(edges))
  return out


def test_the_folder_cycle_finder(tmp_path, monkeypatch):
  # Folders importing each other through different modules are a cycle even though no
  # module cycle exists; a sub-folder importing its own folder is not.
  files = {
      "experiments/__init__.py": "",
      "experiments/low/__init__.py": "",
      "experiments/low/a.py": "def f():\n  from experiments.high import b\n",
      "experiments/high/__init__.py": "",
      "experiments/high/b.py": "",
      "experiments/high/c.py": "from experiments.low import a\n",
      "experiments/ok/__init__.py": "from experiments.ok.sub import d\n",
      "experiments/ok/sub/__init__.py": "",
      "experiments/ok/sub/d.py": "import experiments.ok.e\n",
      "experiments/ok/e.py": "import experiments.low.a\n",
  }
  for name, source in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(source)
  monkeypatch.setitem(globals(), "ROOT", tmp_path)
  modules = module_index()
  assert not import_cycles(modules)
  cycles = [c.split("\n")[0] for c in folder_cycles(modules)]
  assert cycles == ["experiments.high <-> experiments.low"], cycles


def test_no_folder_import_cycle():
  cycles = folder_cycles(module_index())
  assert not cycles, (f"{len(cycles)} folder cycle(s) (folders importing each other, and "
                      "the imports that close each):\n  " + "\n  ".join(cycles))


def test_no_module_imports_a_config_file():
  config_dir = ROOT / "experiments" / "configs"
  files = [p for p in _walk(ROOT) if p.suffix in (".py", ".ipynb")
           and config_dir not in p.parents]
  bad = []
  for path in files:
    for line, base, names in imports(path):
      if base == CONFIGS:  # `import experiments.configs` alone (the package) passes
        extra = sorted(set(names) - CONFIG_HELPERS)
        if extra:
          bad.append(f"{_rel(path)}:{line}: from {base} import {', '.join(extra)}")
      elif _within(base, CONFIGS):
        shown = f"from {base} import {', '.join(names)}" if names else f"import {base}"
        bad.append(f"{_rel(path)}:{line}: {shown}")
  assert not bad, _report(
      bad, f"outside experiments/configs only the loader helpers {sorted(CONFIG_HELPERS)} of "
      "experiments.configs may be imported (configs are loaded by path)")


def test_config_files_are_leaves():
  files = [p for p in _python_files("experiments/configs") if p.name != "__init__.py"]
  assert files, "experiments/configs holds no config files"
  bad = []
  for path in files:
    for line, base, names in imports(path):
      if not any(_within(base, ok) for ok in CONFIG_FILE_ALLOWED):
        shown = f"from {base} import {', '.join(names)}" if names else f"import {base}"
        bad.append(f"{_rel(path)}:{line}: {shown}")
  assert not bad, _report(
      bad, "config files may import only ml_collections, __future__ and experiments.configs")


# --- citations --------------------------------------------------------------

# Pointers to files that live outside the repository.
_OUTSIDE = [
    (re.compile(r"\.\./shared|\bshared/(DESIGN|STYLE|papers|references)"), "a shared folder"),
    (re.compile(r"(?<![\w.~])/work/"), "a machine path"),
    (re.compile(r"\bDESIGN(?!\.md)\s*§"), '"DESIGN §" (cite "DESIGN.md §N")'),
    (re.compile(r"\b(design|spec) sheet\b", re.I), "the outside design sheet"),
    (re.compile(r"lngram-v2-paper|pvm-paper-review"), "a paper file (cite title + arXiv id)"),
]
_MD_NAME = re.compile(r"([\w-]+\.md)\b")  # any path prefix: the file name must exist here
_DESIGN_CITE = re.compile(r"DESIGN\.md\s*§\s*(\d+)(?:\.(\d+))?(?:,?\s*\"([^\"]+)\")?")
_H2 = re.compile(r"^## (\d+)\. (.+)$")
_H3 = re.compile(r"^### (\d+)\.(\d+) (.+)$")


def _doc_files() -> list[Path]:
  here = Path(__file__).resolve()
  files = [p for p in _walk(ROOT) if (p.suffix in DOC_SUFFIXES or p.parent.name == ".ci")
           and p.resolve() != here]
  return [p for p in files if p.stat().st_size < 2_000_000]


def _design_outline():
  """{section: title}, {(section, sub): title}, {section: [subsection titles]}."""
  path = ROOT / "DESIGN.md"
  if not path.exists():
    return None
  sections, subsections, titles = {}, {}, {}
  for line in path.read_text().splitlines():
    if m := _H2.match(line):
      sections[int(m[1])] = m[2].strip()
    elif m := _H3.match(line):
      subsections[int(m[1]), int(m[2])] = m[3].strip()
      titles.setdefault(int(m[1]), []).append(m[3].strip())
  return sections, subsections, titles


def test_design_md_has_the_numbered_sections():
  outline = _design_outline()
  assert outline is not None, "DESIGN.md is missing at the repository root"
  sections, subsections, _ = outline
  assert sorted(sections) == sorted(DESIGN_SECTIONS), sections
  for number, title in DESIGN_SECTIONS.items():
    assert sections[number].startswith(title), (number, sections[number], title)
  for section, _ in subsections:
    assert section in sections, f"subsection of a missing §{section}"


def outside_pointers(line: str, md_names: set[str]) -> list[str]:
  """Why a line points outside the repository (empty if it does not)."""
  why = [what for pattern, what in _OUTSIDE if pattern.search(line)]
  return why + [f"{name} is not in the repository" for name in _MD_NAME.findall(line)
                if name not in md_names]


def test_the_citation_patterns():
  md = {"DESIGN.md", "README.md", "RESULTS.md"}
  for line in ("see ../shared/DESIGN.md", "(DESIGN §3)", "the design sheet says",
               "papers/lngram-v2-paper.txt", "/work/main/lngram_jax", "STYLE.md habits",
               "references/baselines.md"):
    assert outside_pointers(line, md), line
  for line in ("(DESIGN.md §3)", "experiments/RESULTS.md", "paper §2.4", "README.md"):
    assert not outside_pointers(line, md), line


def test_no_file_cites_outside_the_repository():
  md_names = {p.name for p in _walk(ROOT) if p.suffix == ".md"}
  bad = []
  for path in _doc_files():
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
      bad += [f"{_rel(path)}:{number}: {why}: {line.strip()[:100]}"
              for why in outside_pointers(line, md_names)]
  assert not bad, _report(bad, "cite files inside the repository (papers by title/arXiv id)")


def test_design_citations_name_existing_sections():
  outline = _design_outline()
  assert outline is not None, "DESIGN.md is missing at the repository root"
  sections, subsections, titles = outline
  bad = []
  for path in _doc_files():
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
      for m in _DESIGN_CITE.finditer(line):
        section, sub, title = int(m[1]), m[2], m[3]
        where = f"{_rel(path)}:{number}: {m[0]}"
        if section not in sections:
          bad.append(f"{where}: DESIGN.md has no §{section}")
        elif sub is not None and (section, int(sub)) not in subsections:
          bad.append(f"{where}: DESIGN.md has no §{section}.{sub}")
        elif title and not any(title.lower() in t.lower() for t in titles.get(section, [])):
          bad.append(f"{where}: no subsection of §{section} is titled {title!r}")
  assert not bad, _report(bad, "DESIGN.md citations must name existing sections")


@pytest.mark.parametrize("package, needles", [
    ("lngram_jax", ("Lngram v2: Latent N-Gram Memory with Interpretable Discrete "
                    "Representations", "2605.24869")),
    ("pvm_jax", ("Persistent Visual Memory: Sustaining Perception for Deep Generation in "
                 "LVLMs", "2605.00814")),
])
def test_package_docstring_cites_its_paper(package, needles):
  doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
  flat = " ".join(doc.split())
  missing = [n for n in needles if n not in flat]
  assert not missing, f"{package}/__init__.py docstring does not cite {missing}"
