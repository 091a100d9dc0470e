"""Training: smoke run + restore, exact resume, NaN guard, the one optimiser, metrics."""

import hashlib
import importlib.util
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.jobs import metrics, run_train
from experiments.jobs.lm.evaluate import evaluate_run
from experiments.jobs.lm.sample import sample_text
from experiments.jobs.restore import restore
from experiments.models import memory_stats
from experiments.trainer import optimizer as optim_lib
from experiments.trainer.checkpoint import run_checkpointer


def _params(workdir, step=None):
  model, _ = restore(workdir, step)
  from flax import nnx
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


@pytest.mark.slow
def test_smoke_train_save_restore(smoke_run):
  workdir, result = smoke_run
  assert result["step"] == 2 and not result["interrupted"]
  assert run_checkpointer(workdir).all_steps() == [1, 2]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
  [evaluated] = [r for r in rows if "eval/bits_per_byte" in r]
  assert evaluated["step"] == 2
  assert evaluated["eval/bits_per_byte"] == pytest.approx(result["eval"]["eval/bits_per_byte"])
  assert (workdir / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  if importlib.util.find_spec("tensorboardX") is not None:  # in the dev extra
    [events] = (workdir / "tensorboard").glob("events.out.tfevents.*")
    # The event records hold the scalar tags as plain bytes.
    assert b"train/loss" in events.read_bytes() and b"eval/bits_per_byte" in events.read_bytes()
  manifest = json.loads((workdir / "corpus_manifest.json").read_text())
  assert manifest["source"] == "stdlib" and manifest["train_files"] == 12

  model, config = restore(workdir)
  assert isinstance(config, ml_collections.ConfigDict) and config.train.steps == 2
  assert model.config.memory_layers == (1,)
  # Restored parameters give the validation loss and the Lngram statistics the run
  # itself measured (the route mass and its sink complement included).
  metrics = evaluate_run(workdir)
  assert set(metrics) == set(result["eval"])
  for key, value in result["eval"].items():
    np.testing.assert_allclose(metrics[key], value, rtol=1e-6, err_msg=key)
  assert metrics["lngram/1/route_mass"] + metrics["lngram/1/sink_mass"] == pytest.approx(1.0)
  # Greedy continuations: the cached decode path writes what a full recompute does.
  cached = sample_text(model, ["def ", "import"], max_new_tokens=4, greedy=True)
  recomputed = sample_text(model, ["def ", "import"], max_new_tokens=4, greedy=True,
                           use_cache=False)
  assert cached == recomputed


@pytest.mark.slow
def test_resume_is_bit_exact(tmp_path, smoke_config, recording_callbacks):
  """2N steps in one go == N steps, SIGTERM + checkpoint, resume, N steps."""
  config = smoke_config(steps=4, ckpt_every=100, eval_every=100)
  fingerprint = lambda b: hashlib.sha256(b["inputs"].tobytes()).hexdigest()

  seen_a, record, seen_b, stop_at_two = recording_callbacks(fingerprint, stop_at=2)
  run_train(config, tmp_path / "a", callback=record)
  first = run_train(config, tmp_path / "b", callback=stop_at_two)
  assert first["interrupted"] and first["step"] == 2
  assert run_checkpointer(tmp_path / "b").all_steps() == [2]
  second = run_train(config, tmp_path / "b", callback=lambda s, b: seen_b.append((s, fingerprint(b))))
  assert second["step"] == 4 and not second["interrupted"]

  assert seen_a == seen_b  # same data order across the interruption
  params_a, params_b = _params(tmp_path / "a"), _params(tmp_path / "b")
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params_a)[0],
                          jax.tree.leaves(params_b), strict=True):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]


def test_nan_guard_names_step_and_keeps_last_good_checkpoint(tmp_path, smoke_config):
  config = smoke_config(steps=4, ckpt_every=2, eval_every=100)

  def poison(step, batch):
    if step == 3:
      batch["loss_mask"][:] = np.nan

  with pytest.raises(FloatingPointError, match=r"step 3: train/\w+ = nan") as info:
    run_train(config, tmp_path, callback=poison)
  assert "step 2" in str(info.value)  # the last good checkpoint is named
  assert run_checkpointer(tmp_path).all_steps() == [2]
  for leaf in jax.tree.leaves(_params(tmp_path)):
    assert np.isfinite(leaf).all()


def test_optimizer_groups_and_table_lr():
  params = {"embed": {"table": jnp.ones((4, 2))},
            "blocks": {0: {"attn_norm": {"scale": jnp.ones(2)},
                           "attn": {"w_q": jnp.ones((2, 2))},
                           "memory": {"router_w": jnp.ones((2, 4)), "q_norm": jnp.ones(2),
                                      "tables": {0: jnp.ones((8, 2)), 1: jnp.ones((16, 2))},
                                      "w_o": jnp.ones((2, 2)), "b_k": jnp.ones(2)}}}}
  labels = optim_lib.param_labels(params)
  assert labels["embed"]["table"] == "decay"
  lngram = labels["blocks"][0]["memory"]
  assert lngram["tables"] == {0: "table", 1: "table"}
  assert lngram["router_w"] == lngram["q_norm"] == lngram["b_k"] == "no_decay"
  assert lngram["w_o"] == labels["blocks"][0]["attn"]["w_q"] == "decay"
  assert labels["blocks"][0]["attn_norm"]["scale"] == "no_decay"

  optim = ml_collections.ConfigDict(dict(
      lr=1e-2, table_lr_mult=4.0, weight_decay=0.5, b1=0.9, b2=0.95, eps=1e-12,
      warmup_steps=0, min_lr_ratio=1.0, clip_norm=1e9))
  tx = optim_lib.make_optimizer(optim, params, total_steps=10)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  # First Adam step: m/sqrt(v) = 1, so update = -lr·(1 + wd·p) with p = 1.
  np.testing.assert_allclose(updates["blocks"][0]["memory"]["tables"][0], -4e-2, rtol=1e-5)
  np.testing.assert_allclose(updates["blocks"][0]["memory"]["router_w"], -1e-2, rtol=1e-5)
  np.testing.assert_allclose(updates["blocks"][0]["attn_norm"]["scale"], -1e-2, rtol=1e-5)
  np.testing.assert_allclose(updates["embed"]["table"], -1.5e-2, rtol=1e-5)


def test_trainable_mask_freezes_leaves_and_clips_over_the_trainable_ones():
  params = {"encoder": {"w": jnp.full((3,), 2.0)},
            "lm": {"blocks": {1: {"ffn_branch": {"gate": jnp.zeros(()), "w_up": jnp.ones((2,))},
                                  "mlp": {"w": jnp.ones((2,))}}}}}
  branch_only = lambda path: "/ffn_branch/" in path
  labels = optim_lib.param_labels(params, branch_only)
  assert labels["encoder"]["w"] == labels["lm"]["blocks"][1]["mlp"]["w"] == "frozen"
  assert labels["lm"]["blocks"][1]["ffn_branch"] == {"gate": "decay", "w_up": "decay"}
  optim = ml_collections.ConfigDict(dict(
      lr=1.0, table_lr_mult=4.0, weight_decay=0.0, b1=0.0, b2=0.0, eps=0.1,
      warmup_steps=0, min_lr_ratio=1.0, clip_norm=1.0))
  tx = optim_lib.make_optimizer(optim, params, total_steps=5, trainable=branch_only)
  # Huge gradients on frozen leaves must not shrink the trainable ones' clip factor.
  grads = {"encoder": {"w": jnp.full((3,), 1e6)},
           "lm": {"blocks": {1: {"ffn_branch": {"gate": jnp.asarray(0.6),
                                                "w_up": jnp.asarray([0.8, 0.0])},
                                 "mlp": {"w": jnp.full((2,), -1e6)}}}}}
  state = tx.init(params)
  assert optim_lib.group_sizes(params, branch_only) == {
      "decay": 3, "no_decay": 0, "table": 0, "frozen": 5}
  updates, _ = jax.jit(tx.update)(grads, state, params)
  np.testing.assert_array_equal(updates["encoder"]["w"], 0.0)
  np.testing.assert_array_equal(updates["lm"]["blocks"][1]["mlp"]["w"], 0.0)
  # The trainable norm is exactly 1 (0.6, 0.8): no clipping. Adam with b1 = b2 = 0
  # gives -lr·g/(|g| + eps); clipped by the frozen 1e6 it would be ~1e-6.
  branch = updates["lm"]["blocks"][1]["ffn_branch"]
  np.testing.assert_allclose(branch["gate"], -0.6 / 0.7, rtol=1e-6)
  np.testing.assert_allclose(branch["w_up"], [-0.8 / 0.9, 0.0], rtol=1e-6)


def test_schedule_warmup_then_cosine():
  optim = ml_collections.ConfigDict(dict(lr=1.0, warmup_steps=10, min_lr_ratio=0.1))
  lr = optim_lib.learning_rate_schedule(optim, 110)
  assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(0.5)
  assert float(lr(10)) == pytest.approx(1.0)
  assert float(lr(60)) == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-5)
  assert float(lr(110)) == pytest.approx(0.1)
  # The VLM recipe: warm up over a share of the phase (round, at least one step).
  frac = ml_collections.ConfigDict(dict(lr=1.0, warmup_steps=10, warmup_frac=0.1,
                                        min_lr_ratio=0.1))
  lr = optim_lib.learning_rate_schedule(frac, 300)
  assert float(lr(15)) == pytest.approx(0.5) and float(lr(30)) == pytest.approx(1.0)
  assert float(optim_lib.learning_rate_schedule(frac, 3)(1)) == pytest.approx(1.0)


def test_lngram_metrics_hand_case():
  from experiments.models.branches import LngramMemory
  from lngram_jax.config import LngramConfig

  # One route, C = 4 codes, T = 6; the last token is padding.
  codes = jnp.asarray([[[0], [1], [1], [3], [3], [2]]], jnp.int32)
  valid = jnp.asarray([[True] * 5 + [False]])
  segs = jnp.asarray([[1, 1, 1, 2, 2, 2]], jnp.int32)
  counts = np.asarray(memory_stats.code_histogram(codes, valid, 4))
  np.testing.assert_array_equal(counts, [[1, 2, 0, 2]])
  eff = memory_stats.effective_codes(counts)
  p = np.asarray([0.2, 0.4, 0.4])
  np.testing.assert_allclose(eff, [math.exp(-(p * np.log(p)).sum())])
  # Bigrams inside a segment: (0,1) (1,1) in segment 1, (3,3) in segment 2;
  # row = a_prev + 4·a_cur (oldest symbol least significant).
  touched = np.asarray(memory_stats.rows_touched(codes, segs, valid, order=2, bits=2))
  assert sorted(np.flatnonzero(touched).tolist()) == [0 + 4 * 1, 1 + 4 * 1, 3 + 4 * 3]
  aux = {"memory/0/codes": codes, "memory/0/route_mass": jnp.full((1, 6, 2), 0.25),
         "ffn_branch/1/gate": jnp.zeros(())}   # other slots' aux is not Lngram's
  assert memory_stats.lngram_layers(aux) == [0]
  # The metrics protocol: the branch's per-batch sums (two batches, merged) and its
  # summary, named <kind>/<layer>/<name>.
  config = LngramConfig(d_model=8, routes=1, bits=2, orders=(2,), mem_dim=4, q_heads=2,
                        kv_heads=1, head_dim=4)
  branch = type("Branch", (), {"config": config})()
  sums = LngramMemory.metric_sums(branch, metrics.layer_aux(aux, 0), valid, segs)
  assert set(sums) == {"mass_sum", "tokens", "codes", "rows/2_max"}
  stats = metrics.merge(None, {f"0/{k}": v for k, v in sums.items()})
  stats = metrics.merge(stats, {f"0/{k}": v for k, v in sums.items()})
  summary = metrics.summarise(config, stats)
  assert summary["lngram/0/route_mass"] == pytest.approx(0.25)
  assert summary["lngram/0/sink_mass"] == pytest.approx(0.75)
  assert summary["lngram/0/dead_code_frac"] == pytest.approx(0.25)
  assert summary["lngram/0/effective_codes"] == pytest.approx(float(eff[0]))
  assert summary["lngram/0/rows_touched/2"] == pytest.approx(3 / 16)   # max, not summed


def test_step_time_split_and_profiler_trace(tmp_path, smoke_config):
  workdir = tmp_path / "run"
  run_train(smoke_config(steps=3, log_every=1, eval_every=3, ckpt_every=3,
                     profile_steps=(2, 3)), workdir)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  timed = [r for r in rows if "time/step_s" in r]
  assert [r["step"] for r in timed] == [1, 2, 3]
  for r in timed:
    assert r["time/step_s"] > 0 and 0 <= r["time/data_s"] <= r["time/step_s"]
    assert 0 <= r["time/sync_s"] <= r["time/step_s"]
  assert list((workdir / "profile").rglob("*.xplane.pb")), "no profiler trace written"
  with pytest.raises(ValueError, match="profile_steps"):
    run_train(smoke_config(steps=3, profile_steps=(3, 2)), tmp_path / "bad")


def test_grad_accum_equals_one_full_batch():
  """Two micro-batches of 2 rows == one batch of 4, even with unequal token counts
  (micro-batches are weighted by the tokens their mean runs over)."""
  from flax import nnx

  from experiments.configs import load_config
  from experiments.jobs.lm.task import lm_loss
  from experiments.models import DecoderLM, lm_config
  from experiments.trainer import step as step_lib

  config = load_config("experiments/configs/lm_lngram.py:smoke")
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  tx = optim_lib.make_optimizer(config.optim, params, 10)
  lr = optim_lib.learning_rate_schedule(config.optim, 10)
  B, T = 4, 16
  tokens = jax.random.randint(jax.random.key(0), (B, T + 1), 0, 256, dtype=jnp.int32)
  mask = np.ones((B, T), np.float32)
  mask[0, :5] = 0   # the first micro-batch averages over fewer tokens
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "segment_ids": jnp.ones((B, T), jnp.int32),
           "positions": jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)),
           "loss_mask": jnp.asarray(mask)}
  results = []
  for k in (1, 2):
    state = {"params": jax.tree.map(jnp.array, params), "opt_state": tx.init(params),
             "step": jnp.zeros((), jnp.int32)}
    train_step = step_lib.make_train_step(graphdef, tx, lr, lm_loss, grad_accum=k)
    results.append(train_step(state, rest, batch))
  (full, m_full), (acc, m_acc) = results
  assert "weight" not in m_full and "weight" not in m_acc
  for key in ("train/loss", "train/bits_per_byte", "train/grad_norm"):
    np.testing.assert_allclose(m_acc[key], m_full[key], rtol=1e-5, err_msg=key)
  for a, b in zip(jax.tree.leaves(acc["params"]), jax.tree.leaves(full["params"]), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  with pytest.raises(ValueError, match="grad_accum=3"):
    step_lib.make_train_step(graphdef, tx, lr, lm_loss, grad_accum=3)(state, rest, batch)


def test_optimizer_state_dtype():
  params = {"w": jnp.ones((3, 2), jnp.float32)}
  optim = ml_collections.ConfigDict(dict(
      lr=1e-2, table_lr_mult=4.0, weight_decay=0.5, b1=0.9, b2=0.95, eps=1e-12,
      warmup_steps=0, min_lr_ratio=1.0, clip_norm=1e9, state_dtype="bfloat16"))
  state = optim_lib.make_optimizer(optim, params, 10).init(params)
  mus = [leaf for leaf in jax.tree.leaves(state) if getattr(leaf, "shape", ()) == (3, 2)]
  assert {leaf.dtype for leaf in mus} == {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)}
  optim.state_dtype = "float8"
  with pytest.raises(ValueError, match="optim.state_dtype"):
    optim_lib.make_optimizer(optim, params, 10)


def test_a_refused_run_leaves_nothing_in_a_directory_it_created(tmp_path, smoke_config):
  config = smoke_config(steps=2)
  config.data.seq_len = 10**6   # longer than model.max_len: refused when the task is built
  with pytest.raises(ValueError, match="exceeds model.max_len"):
    run_train(config, tmp_path / "new" / "run")
  assert not (tmp_path / "new").exists()   # nor the parent it had to create
  kept = tmp_path / "mine"
  kept.mkdir()
  (kept / "notes.txt").write_text("the user's")
  with pytest.raises(ValueError, match="exceeds model.max_len"):
    run_train(config, kept)
  assert [p.name for p in kept.iterdir()] == ["notes.txt"]   # an existing directory stays
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="is a file"):
    run_train(smoke_config(steps=2), tmp_path / "file")


def test_the_trainer_trains_a_task_that_is_no_lm_and_resumes_it(tmp_path):
  """`experiments.trainer.train` knows no LM: a linear regression task with its own
  module, batch source and loss trains, checkpoints, and resumes bit for bit."""
  from flax import nnx

  from experiments.trainer import Task, train
  from experiments.trainer.placement import make_train_mesh

  w_true = np.asarray([1.0, -2.0, 0.5], np.float32)

  class Linear(nnx.Module):
    def __init__(self, rngs):
      self.w = nnx.Param(jax.random.normal(rngs.params(), (3,)))

  class Batches:
    def __init__(self):
      self.i = 0

    def __next__(self):
      x = np.random.default_rng(self.i).normal(size=(8, 3)).astype(np.float32)
      self.i += 1
      return {"x": x, "y": x @ w_true}

    def get_state(self):
      return {"i": self.i}

    def set_state(self, state):
      self.i = state["i"]

  def loss(model, batch):
    return jnp.mean((batch["x"] @ model.w[...] - batch["y"]) ** 2), {}

  optim = ml_collections.ConfigDict(dict(
      lr=0.1, table_lr_mult=1.0, weight_decay=0.0, b1=0.9, b2=0.99, eps=1e-8,
      warmup_steps=0, min_lr_ratio=1.0, clip_norm=10.0))

  def run(workdir, steps, stop_at=None):
    tc = ml_collections.ConfigDict(dict(seed=0, log_every=1, eval_every=100, ckpt_every=100,
                                        max_to_keep=2, async_checkpoint=False, progress=False))
    task = Task(module=Linear(nnx.Rngs(0)), saved_config={"kind": "toy"}, batches=Batches(),
                loss=loss, optim=optim, phases=(steps,),
                evaluate=lambda m: {"eval/err": float(np.abs(m.w[...] - w_true).max())})

    def stop(step, batch):
      if step == stop_at:
        import os
        import signal
        os.kill(os.getpid(), signal.SIGTERM)   # the trainer saves this step and returns

    return train(task, tc, workdir, make_train_mesh({}), callback=stop)

  full = run(tmp_path / "full", 60)
  assert full["step"] == 60 and full["eval"]["eval/err"] < 0.05
  assert run(tmp_path / "cut", 60, stop_at=25)["interrupted"]
  resumed = run(tmp_path / "cut", 60)
  assert resumed["step"] == 60 and resumed["eval"] == full["eval"]
