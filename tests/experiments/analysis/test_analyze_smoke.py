"""`lngram-exp analyze` on a smoke LM run: every analysis at tiny sizes; the ID notebook."""

import json
import os
from pathlib import Path

import pytest

from experiments.analysis.run import LM_ANALYSES

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOK = ROOT / "experiments" / "notebooks" / "lngram_ids.ipynb"


@pytest.fixture(autouse=True)
def _restore_cli_logging():
  """Undoes what an in-process CLI run leaves: its stderr handler (bound to pytest's
  capture), the warning format and the parsed flag values."""
  import logging
  import warnings

  logger = logging.getLogger("experiments")
  saved = (list(logger.handlers), logger.level, logger.propagate, warnings.formatwarning)
  yield
  logger.handlers[:] = saved[0]
  logger.setLevel(saved[1])
  logger.propagate = saved[2]
  warnings.formatwarning = saved[3]
  from absl import flags
  flags.FLAGS.unparse_flags()   # flag values would carry over to the next in-process parse


def test_analyze_runs_every_analysis(smoke_run_copy, capsys):
  from experiments.cli import run_main

  workdir, _ = smoke_run_copy   # checkpoints at steps 1 and 2: one adjacent pair
  status = run_main(["lngram-exp", "analyze", f"--workdir={workdir}", "--max_positions=300",
                     "--n_perm=3", "--seed=1"])
  assert status == 0, capsys.readouterr().err[-3000:]
  out_dir = workdir / "analysis"
  for name in LM_ANALYSES:
    for ext in ("json", "md", "png"):
      assert (out_dir / f"{name}.{ext}").stat().st_size > 0, (name, ext)
  assert {"records_reference.npz", "records_heldout.npz"} <= {p.name for p in out_dir.iterdir()}
  res = {name: json.loads((out_dir / f"{name}.json").read_text()) for name in LM_ANALYSES}
  # Every result says what it was computed from (the newest step, the seed given).
  assert {(r["source"]["step"], r["source"]["seed"]) for r in res.values()} == {(2, 1)}
  assert set(res["utilisation"]["layers"]) == {"1"}   # the smoke model's one Lngram layer
  assert res["id_knn"]["layers"]["1"]["permutation"]
  stab = res["stability"]
  assert stab["steps"] == [1, 2]
  assert {(r["protocol"], r["from_step"], r["to_step"]) for r in stab["rows"]} == {
      ("fixed", 1, 2), ("own", 1, 2)}
  for row in stab["rows"]:
    est, lo, hi = row["code_agreement"]
    assert 0 <= lo <= est <= hi <= 1
  assert set(res["injection"]["interventions"]) == {"1", "all"}
  assert "| fixed | 1 | 1→2 |" in (out_dir / "stability").with_suffix(".md").read_text()
  assert f"into {workdir}/analysis" in capsys.readouterr().out


def test_stability_compares_the_checkpoints_named(smoke_run_copy, capsys):
  from experiments.cli import run_main

  workdir, _ = smoke_run_copy   # kept: steps 1 and 2
  bad = ["lngram-exp", "analyze", f"--workdir={workdir}", "--which=stability"]
  assert run_main([*bad, "--stability_steps=1,5"]) == 2
  assert "--stability_steps=[1, 5] must name two or more kept checkpoints" in \
      capsys.readouterr().err
  assert run_main([*bad, "--stability_steps=one"]) == 2
  assert "as integers" in capsys.readouterr().err
  assert run_main([*bad, "--stability_steps=2,1"]) == 0, capsys.readouterr().err[-2000:]
  stab = json.loads((workdir / "analysis" / "stability.json").read_text())
  assert stab["steps"] == [1, 2] and {r["from_step"] for r in stab["rows"]} == {1}


def test_analyze_rejects_unknown_lm_analyses(smoke_run, capsys):
  from experiments.cli import run_main

  workdir, _ = smoke_run
  assert run_main(["lngram-exp", "analyze", f"--workdir={workdir}", "--which=nope"]) == 2
  err = capsys.readouterr().err
  assert "unknown LM analyses ['nope']" in err and "stability" in err


def test_analyze_tells_lm_from_vlm_runs(smoke_run, tmp_path):
  from flax import nnx

  from experiments.configs import load_config
  from experiments.jobs import saved_config
  from experiments.jobs.restore import run_job_name as run_kind
  from experiments.trainer.checkpoint import run_checkpointer
  from experiments.vlm.tiny.config import vlm_config
  from experiments.vlm.tiny.model import VLM

  assert run_kind(smoke_run[0]) == "lm"
  config = load_config("experiments/configs/vlm_base.py:smoke")
  model = VLM(vlm_config(config), rngs=nnx.Rngs(0))
  with run_checkpointer(tmp_path, async_save=False) as ckpt:
    ckpt.save(1, params=nnx.to_pure_dict(nnx.state(model, nnx.Param)),
              config=saved_config("vlm", config, model.config))
  assert run_kind(tmp_path) == "vlm"   # `lngram-exp analyze` then takes the VLM path



@pytest.mark.slow   # starts a Jupyter kernel
def test_ids_notebook_runs(smoke_run, tmp_path, monkeypatch, notebook_kernel):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")

  workdir, _ = smoke_run
  for key, value in {"LNGRAM_WORKDIR": str(workdir), "LNGRAM_MAX_POSITIONS": "300",
                     "LNGRAM_N_REFERENCE": "12", "LNGRAM_N_PERM": "2", "MPLBACKEND": "Agg",
                     "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
                     }.items():
    monkeypatch.setenv(key, value)
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
      nb, kernel_name=notebook_kernel, timeout=300,
      resources={"metadata": {"path": str(ROOT)}})
  client.execute()
  outputs = [out for cell in nb.cells if cell.cell_type == "code"
             for out in cell.get("outputs", [])]
  text = "".join(out.get("text", "") + out.get("data", {}).get("text/markdown", "")
                 for out in outputs)
  assert "Lngram layers (1,)" in text
  assert "| layer | effective codes | normalised entropy |" in text
  assert "| layer | target | H_model | Q_route | ID-KNN |" in text
  assert any("image/png" in out.get("data", {}) for out in outputs)
