"""Experiment configs: ml_collections files with `get_config(arg)`.

A config file's module docstring starts with its one-line purpose and holds
the exact command that runs it. `base.py` (LM) and `vlm_common.py` (VLM)
hold the shared defaults. Config files are leaves: they import only
ml_collections and those two modules; the conversions to library objects
live in the library (`experiments.models.config.lm_config`,
`experiments.vlm.tiny.config.vlm_config`, `experiments.data.corpus_spec`). Only
the helpers below are used from outside, to load a config file by path, and
`LATER_FIELDS` (base.py), which resuming a run saved before those fields
existed reads.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from experiments.configs.base import LATER_FIELDS

__all__ = ["CONFIG_DIR", "LATER_FIELDS", "config_files", "load_config", "purpose"]

CONFIG_DIR = Path(__file__).resolve().parent


def config_files() -> list[Path]:
  """Every config file (a module here with a `get_config` function)."""
  files = []
  for path in sorted(CONFIG_DIR.glob("*.py")):
    tree = ast.parse(path.read_text())
    if any(isinstance(n, ast.FunctionDef) and n.name == "get_config" for n in tree.body):
      files.append(path)
  return files


def purpose(path: Path) -> str:
  """The first line of a config file's docstring."""
  doc = ast.get_docstring(ast.parse(Path(path).read_text())) or ""
  return doc.strip().splitlines()[0] if doc.strip() else ""


def load_config(spec: str):
  """`path/to/config.py[:arg]` -> the ConfigDict its get_config(arg) returns."""
  path, _, arg = str(spec).partition(":")
  path = Path(path)
  if not path.exists() and (CONFIG_DIR / path.name).exists():
    path = CONFIG_DIR / path.name
  if not path.exists():
    raise FileNotFoundError(f"config file {str(path)!r} not found.")
  module_spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()
