"""Training on a device mesh (experiments/trainer/placement.py) equals training on one device.

The 8 host devices come from tests/conftest.py. Every run is `lm_lngram:smoke` with
batch 8 on the same data and init; a mesh only changes where the arrays live and the
order of a few float sums, so losses and parameters agree to float32 round-off.
"""

import json
import signal

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from experiments.configs import load_config
from experiments.jobs import run_train
from experiments.jobs.restore import restore
from experiments.models import DecoderLM, layout, lm_config
from experiments.models.branches import BranchContext
from experiments.trainer import placement as mesh_lib

STEPS = 4
LAYOUTS = {"data2_table4": dict(data=2, table=4), "data4_fsdp2": dict(data=4, fsdp=2),
           "data2_seq2_table2": dict(data=2, seq=2, table=2)}

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")


def _config(mesh=None, steps=STEPS, **train):
  c = load_config("experiments/configs/lm_lngram.py:smoke")
  c.data.batch_size = 8
  c.train.update(steps=steps, progress=False, eval_every=100, ckpt_every=2, **train)
  c.mesh.update(mesh or {})
  return c


def _losses(workdir) -> dict[int, float]:
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _params(workdir):
  model, _ = restore(workdir)   # onto one CPU device, whatever mesh trained it
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _assert_same_run(workdir, want_losses, want_params):
  """Every step's loss and the final parameters of the run in `workdir` equal the wanted."""
  got = _losses(workdir)
  assert list(got) == list(want_losses)
  np.testing.assert_allclose(list(got.values()), list(want_losses.values()), atol=2e-5)
  _assert_same_params(_params(workdir), want_params)


def _assert_same_params(got, want):
  flat = jax.tree_util.tree_flatten_with_path(got)[0]
  for (path, a), b in zip(flat, jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("one_device")
  run_train(_config(), workdir)
  return _losses(workdir), _params(workdir), workdir


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_step_and_the_parameters_equal_the_single_device_run(name, single_device,
                                                                  tmp_path):
  want_losses, want_params, _ = single_device
  result = run_train(_config(LAYOUTS[name]), tmp_path)
  assert result["step"] == STEPS
  _assert_same_run(tmp_path, want_losses, want_params)


def test_resume_on_smaller_meshes_continues_the_same_curve(single_device, tmp_path):
  """Steps 1-2 on 8 devices, 3 on 4, 4 on one: the curve of the one-device run."""
  want_losses, want_params, _ = single_device

  def stop_at(step_to_stop):
    def callback(step, batch):
      if step == step_to_stop:
        signal.raise_signal(signal.SIGTERM)
    return callback

  assert run_train(_config(LAYOUTS["data2_table4"]), tmp_path, callback=stop_at(2))["interrupted"]
  assert run_train(_config(dict(data=2, table=2)), tmp_path, callback=stop_at(3))["interrupted"]
  assert run_train(_config(), tmp_path)["step"] == STEPS
  _assert_same_run(tmp_path, want_losses, want_params)


def test_grad_accum_over_a_mesh_equals_one_full_batch_on_one_device(single_device, tmp_path):
  want_losses, want_params, _ = single_device
  run_train(_config(dict(data=2, table=2), grad_accum=2), tmp_path)
  np.testing.assert_allclose(list(_losses(tmp_path).values()), list(want_losses.values()),
                             atol=2e-5)
  _assert_same_params(_params(tmp_path), want_params)


def test_eval_on_a_mesh_equals_eval_on_one_device(single_device):
  from experiments.jobs.lm.evaluate import evaluate_checkpoint
  workdir = single_device[2]
  want, step = evaluate_checkpoint(workdir, max_batches=2)
  got, got_step = evaluate_checkpoint(workdir, max_batches=2,
                                      mesh=mesh_lib.parse_mesh("data=2, table=4"))
  assert got_step == step and set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_parse_mesh():
  assert mesh_lib.parse_mesh("data=2,table=-1") == {"data": 2, "table": -1}
  for bad in ("data", "data=two", "data=2,,x"):
    with pytest.raises(ValueError, match="axis=size pairs"):
      mesh_lib.parse_mesh(bad)


# --- where the arrays live ------------------------------------------------------------------


def _smoke_params(spec="lm_lngram.py:smoke"):
  model = DecoderLM(lm_config(load_config(f"experiments/configs/{spec}")), rngs=nnx.Rngs(0))
  return model, nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_tables_split_by_rows_router_by_routes_dense_over_fsdp():
  model, params = _smoke_params()
  mesh = mesh_lib.make_train_mesh(dict(fsdp=2, table=4))
  placed = mesh_lib.Placement(mesh, params, rules=layout.placement_rules(model))
  memory = placed.params["blocks"][1]["memory"]
  assert memory["tables"][1].spec == P(("table", "fsdp"), None)   # gathered over fsdp
  assert memory["router_w"].spec == P(None, "table")
  assert placed.params["embed"]["table"].spec == P("fsdp", None)     # [256, 32]: rows
  assert placed.params["blocks"][1]["mlp"]["w_up"].spec == P(None, "fsdp")   # [32, 64]
  table = placed.put_params(params)["blocks"][1]["memory"]["tables"][1]
  assert {s.data.shape for s in table.addressable_shards} == {(256 // 8, 8)}
  # AdamW's moments follow the parameters; its step count is replicated.
  import optax
  opt = placed.init_opt_state(optax.adamw(1e-3), placed.put_params(params))
  mu = opt[0].mu["blocks"][1]["memory"]["tables"][1]
  assert mu.sharding.spec == P(("table", "fsdp"), None) and opt[0].count.sharding.spec == P()


def test_comparison_arm_tables_split_by_rows_too():
  model, params = _smoke_params("lm_pkm.py:smoke")
  mesh = mesh_lib.make_train_mesh(dict(data=2, table=4))
  specs = mesh_lib.param_specs(params, mesh, rules=layout.placement_rules(model))
  assert specs["blocks"][1]["memory"]["tables"][0] == P("table", None)   # PKM values
  assert specs["blocks"][1]["memory"]["w_q"] == P()


def test_the_lngram_branch_runs_its_sharded_form_only_on_a_mesh():
  model, _ = _smoke_params()
  tokens = np.zeros((8, 32), np.int32)
  plain = str(jax.make_jaxpr(lambda t: model(t))(tokens))
  mesh = mesh_lib.make_train_mesh(dict(data=2, table=4))
  sharded = str(jax.make_jaxpr(lambda t: model(t, context=BranchContext(mesh=mesh)))(tokens))
  one_device = BranchContext(mesh=mesh_lib.make_train_mesh({}))   # the plain forward
  one = str(jax.make_jaxpr(lambda t: model(t, context=one_device))(tokens))
  assert "shard_map" in sharded and "shard_map" not in plain and "shard_map" not in one


def test_a_host_batch_lands_in_row_and_time_blocks():
  mesh = mesh_lib.make_train_mesh(dict(data=2, seq=2, table=2))
  batch = {"inputs": np.arange(8 * 32).reshape(8, 32)}
  placed = mesh_lib.put_batch(batch, mesh)["inputs"]
  assert placed.sharding.spec == P(("data", "fsdp", "expert"), "seq")
  assert {s.data.shape for s in placed.addressable_shards} == {(4, 16)}
  np.testing.assert_array_equal(np.asarray(placed), batch["inputs"])
  sharding = mesh_lib.batch_sharding(mesh, 2, tokens=True)
  assert mesh_lib.process_block(sharding, (8, 32)) == (slice(0, 8), slice(0, 32))


# --- bad meshes are refused before anything is built ------------------------------------------


@pytest.mark.parametrize("block, match", [
    (dict(data=3, table=8), "24 devices, but there are 8"),
    (dict(data=-1, table=-1), "only one axis may be -1"),
    (dict(data=0), "positive int or -1"),
    (dict(data=2.0), "positive int or -1"),
    (dict(tensor=2), "unknown axes"),
    (dict(data=-1, table=3), "do not split"),
    (dict(data=16), "16 devices, but there are 8"),
])
def test_bad_mesh_blocks_are_refused(block, match):
  with pytest.raises(ValueError, match=match):
    mesh_lib.make_train_mesh(block)


@pytest.mark.parametrize("mesh, batch, match", [
    (dict(data=2, fsdp=2, table=2), 6, "batch_size=6 must be a multiple of mesh.data × mesh.fsdp × mesh.expert = 4"),
    (dict(table=8), 8, "routes=4 must be a multiple of mesh.table=8"),
    (dict(seq=8), 8, "seq_len=32 must split into mesh.seq=8 blocks"),
])
def test_a_mesh_the_run_cannot_use_is_refused_naming_the_numbers(mesh, batch, match, tmp_path):
  config = _config(mesh)
  config.data.batch_size = batch
  with pytest.raises(ValueError, match=match):
    run_train(config, tmp_path / "run")
  assert not (tmp_path / "run").exists()   # a refused run leaves no directory behind


# --- several processes ---------------------------------------------------------------------


def test_two_processes_train_the_curve_of_one_8_device_process(tmp_path, child_env,
                                                              local_address):
  """`lngram-exp train` in 2 processes (jax.distributed on localhost, gloo, 4 host devices
  each) on one data=2 × table=4 mesh: the loss curve and the parameters of the same run in
  one process with 8 devices; each process feeds its own half of every batch."""
  import subprocess
  import sys
  from pathlib import Path

  root = Path(__file__).resolve().parents[3]
  env = child_env(4)
  workdir = tmp_path / "two_processes"
  command = [sys.executable, "-m", "experiments", "train",
             "--config=experiments/configs/lm_lngram.py:smoke", f"--workdir={workdir}",
             "--config.data.batch_size=8", f"--config.train.steps={STEPS}",
             "--config.train.progress=False", "--config.train.eval_every=100",
             "--config.train.ckpt_every=2", "--config.mesh.data=2", "--config.mesh.table=4",
             f"--coordinator={local_address}", "--num_processes=2"]
  procs = [subprocess.Popen([*command, f"--process_id={i}"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    logs = [p.communicate(timeout=300)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
  assert "process 0 feeds rows 0:4 of every 8-row batch, steps 0:32 (read by this process " \
      "alone)" in logs[0]
  assert "process 1 feeds rows 4:8 of every 8-row batch, steps 0:32 (read by this process " \
      "alone)" in logs[1]

  one = tmp_path / "one_process"
  run_train(_config(LAYOUTS["data2_table4"]), one)
  np.testing.assert_allclose(list(_losses(workdir).values()), list(_losses(one).values()),
                             rtol=0, atol=1e-6)
  assert list(_losses(workdir)) == list(range(1, STEPS + 1))
  _assert_same_params(_params(workdir), _params(one))


def test_a_vlm_stage_on_a_mesh_equals_one_device(tmp_path):
  """The VLM stage-0 run (two curriculum phases) on data 2 × fsdp 2: the same losses."""
  def run(mesh, workdir):
    c = load_config("experiments/configs/vlm_base.py:smoke")
    c.train.progress = False
    c.vlm.eval.update(n=2, max_new_tokens=4)   # the test is the training curve
    c.mesh.update(mesh)
    run_train(c, workdir)
    return _losses(workdir)

  want = run({}, tmp_path / "one")
  got = run(dict(data=2, fsdp=2), tmp_path / "mesh")
  assert list(got) == list(want)
  np.testing.assert_allclose(list(got.values()), list(want.values()), atol=2e-5)
  with pytest.raises(ValueError, match="only the byte LM splits time"):
    run(dict(seq=2), tmp_path / "seq")


@pytest.mark.parametrize("arm", ["lm_pkm.py", "lm_engram.py"])
def test_comparison_arms_with_row_sharded_tables_train_the_one_device_curve(arm, tmp_path):
  """The arms' tables split over table × fsdp and partitioned by XLA: the same losses."""
  def run(mesh, workdir):
    c = load_config(f"experiments/configs/{arm}:smoke")
    c.data.batch_size = 8
    c.train.update(steps=3, progress=False, eval_every=100, ckpt_every=100)
    c.mesh.update(mesh)
    run_train(c, workdir)
    return _losses(workdir)

  want = run({}, tmp_path / "one")
  got = run(dict(data=2, fsdp=2, table=2), tmp_path / "mesh")
  assert list(got) == list(want)
  np.testing.assert_allclose(list(got.values()), list(want.values()), atol=2e-5)
