"""The restore notebook runs headless against a checkpoint of a smoke run."""

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "experiments" / "notebooks" / "restore_checkpoint.ipynb"



@pytest.mark.slow   # starts a Jupyter kernel
def test_restore_notebook_runs(smoke_run, tmp_path, monkeypatch, notebook_kernel):
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

  from experiments.jobs.restore import restore
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
      nb, kernel_name=notebook_kernel, timeout=300,
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
