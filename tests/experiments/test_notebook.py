"""The restore notebook runs headless against a checkpoint of a smoke run."""

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "experiments" / "notebooks" / "restore_checkpoint.ipynb"


def _kernel_for_this_python(tmp_path, monkeypatch) -> str:
  """A kernel spec that runs this interpreter, found through JUPYTER_PATH.

  The default `python3` spec may point at another interpreter (or none) on a
  fresh CI machine; this one always starts the venv running the tests.
  """
  name = "lngram-test-python"
  spec_dir = tmp_path / "jupyter" / "kernels" / name
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": name, "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  return name


@pytest.mark.slow   # starts a Jupyter kernel
def test_restore_notebook_runs(smoke_run, tmp_path, monkeypatch):
  workdir, _ = smoke_run
  monkeypatch.setenv("LNGRAM_WORKDIR", str(workdir))
  monkeypatch.setenv("MPLBACKEND", "Agg")
  # The kernel cannot import grain (like the GPU machines): restoring and
  # sampling must not need the data pipeline.
  hidden = tmp_path / "no_grain" / "grain"
  hidden.mkdir(parents=True)
  (hidden / "__init__.py").write_text("raise ImportError('grain is hidden in this test')\n")
  monkeypatch.setenv("PYTHONPATH", f"{hidden.parent}{os.pathsep}{ROOT}")
  import jax
  from flax import nnx

  from experiments.checkpoint import restore
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir or "")
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
      nb, kernel_name=_kernel_for_this_python(tmp_path, monkeypatch), timeout=300,
      resources={"metadata": {"path": str(ROOT)}})
  client.execute()
  outputs = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
                    for out in cell.get("outputs", []))
  model, _ = restore(workdir)
  total = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert f"total parameters: {total:,}" in outputs
  assert "Lngram layers (1,)" in outputs
  assert outputs.count("effective codes per route") == 1   # the smoke run's one Lngram layer
  assert "--- 'def '" in outputs and "--- 'class '" in outputs
