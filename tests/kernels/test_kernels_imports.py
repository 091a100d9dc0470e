"""`kernels` is a standalone package: it imports nothing from the model packages."""

import ast
from pathlib import Path

import kernels

FORBIDDEN = ("lngram_jax", "pvm_jax", "experiments")


def _imported_modules(path: Path):
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      yield node.module


def test_kernels_import_nothing_from_the_model_packages():
  root = Path(kernels.__file__).parent
  files = sorted(root.rglob("*.py"))
  assert len(files) >= 6  # the scan really reads the package
  bad = [(str(f.relative_to(root)), m) for f in files for m in _imported_modules(f)
         if m.split(".")[0] in FORBIDDEN]
  assert not bad, f"kernels imports model code: {bad}"


def test_the_scan_sees_imports(tmp_path):
  """The scanner is not vacuous: it finds both import forms, also inside functions."""
  f = tmp_path / "m.py"
  f.write_text("def g():\n  from lngram_jax.readout import x\nimport pvm_jax.module\n")
  assert set(_imported_modules(f)) == {"lngram_jax.readout", "pvm_jax.module"}
