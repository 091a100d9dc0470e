"""The GPU scale check's training of one arm x seed (experiments/tools/bench/scale_check.py):
the train step, evaluation per validation document, the probe of the step time against
the deadline, and the run directory's metrics.jsonl and eval_per_doc.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from experiments.data import validation
from experiments.jobs.lm.task import lm_loss
from experiments.models import DecoderLM, lm_config
from experiments.trainer import optimizer as optim_lib
from experiments.trainer.placement import make_train_mesh
from experiments.trainer.state import init_train_state


def _param_count(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def _make_eval(graphdef):
  """eval(params, rest, batch) -> (nats, targets) per row: a validation row holds one
  document (experiments/data/validation.py)."""
  @jax.jit
  def evaluate(params, rest, batch):
    model = nnx.merge(graphdef, params, rest)
    hidden, _ = model(batch["inputs"], segment_ids=batch["segment_ids"],
                      positions=batch["positions"], return_aux=True, return_hidden=True)
    mask = batch["loss_mask"].astype(np.float32)
    nats = model.token_nll(hidden, batch["targets"]) * mask
    return nats.sum(axis=1), mask.sum(axis=1)
  return evaluate


def evaluate(eval_fn, params, rest, batches, n_docs: int) -> tuple[float, np.ndarray, np.ndarray]:
  """(bits per byte, nats per document, targets per document) over the validation batches."""
  nats_D, tokens_D = np.zeros(n_docs), np.zeros(n_docs)
  for b in batches:
    batch = {k: v for k, v in b.items() if k != "doc"}
    row_nats, row_tokens = jax.device_get(eval_fn(params, rest, batch))
    for d, n, t in zip(b["doc"], np.asarray(row_nats, np.float64),
                       np.asarray(row_tokens, np.float64), strict=True):
      if d >= 0:
        nats_D[d] += n
        tokens_D[d] += t
  return float(nats_D.sum() / max(tokens_D.sum(), 1.0) / np.log(2.0)), nats_D, tokens_D


def train_arm(name: str, config, rows, val: tuple, scale: dict, *, deadline: float,
              workdir: Path, stamp: dict | None = None) -> dict:
  """Trains one arm x seed in `workdir` (metrics.jsonl as it runs; at the end
  eval_per_doc.json); returns its summary (status "done", "skipped" or "truncated").
  `rows`: the training rows (`scale_check.Rows`); `val`: (validation batches, DocNames).
  After compiling, `probe_steps` steps warm up and the next `probe_steps` are timed: the
  projected end decides whether it goes on."""
  val_batches, names = val
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  if stamp is not None:
    (workdir / "repro.json").write_text(json.dumps(stamp, indent=1) + "\n")
  probe_steps = max(1, min(5, (config.train.steps - 1) // 3))
  t0 = time.perf_counter()
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=config.train.seed))
  ts = init_train_state(model, config.optim, (config.train.steps,), make_train_mesh({}))
  del model
  lr = optim_lib.learning_rate_schedule(config.optim, config.train.steps)
  step_fn = ts.step_fn(0, lm_loss, lr)
  eval_fn = _make_eval(ts.graphdef)
  state, rest = ts.state, ts.rest
  out = {"arm": name, "params": _param_count(state["params"]), "steps": config.train.steps}
  state, metrics = step_fn(state, rest, rows.batch(0, scale["batch_size"]))
  jax.block_until_ready(metrics)
  out["compile_s"] = round(time.perf_counter() - t0, 2)
  curve = (workdir / "metrics.jsonl").open("w")
  steps, status, timed_from, t_timed = config.train.steps, "done", None, None
  last_log, t_log = 1, time.perf_counter()
  try:
    step = 1
    while step < steps:
      if step == 1 + probe_steps:
        jax.block_until_ready(metrics)
        timed_from, t_timed = step, time.perf_counter()
      state, metrics = step_fn(state, rest, rows.batch(step, scale["batch_size"]))
      step += 1
      if timed_from is not None and step == timed_from + probe_steps:
        jax.block_until_ready(metrics)
        per_step = (time.perf_counter() - t_timed) / probe_steps
        out["step_s"] = round(per_step, 5)
        # The remaining steps, and one evaluation pass per eval_every (about a step each).
        n_evals = steps // scale["eval_every"] + 1
        projected = time.perf_counter() + per_step * (steps - step + n_evals * len(val_batches))
        if projected > deadline:
          out.update(status="skipped", reason=f"projected end {projected - deadline:.0f} s past "
                     f"the deadline ({per_step * 1e3:.1f} ms/step)")
          return out
      if step % scale["log_every"] == 0 or step == steps:
        bits = float(jax.device_get(metrics["train/bits_per_byte"]))
        now = time.perf_counter()
        row = {"step": step, "train/bits_per_byte": bits,
               "time/step_s": (now - t_log) / max(step - last_log, 1),
               "t_s": round(now - t0, 2)}
        last_log, t_log = step, now
        if step % scale["eval_every"] == 0 or step == steps:
          row["eval/bits_per_byte"], nats_D, tokens_D = evaluate(
              eval_fn, state["params"], rest, val_batches, len(names))
          t_log = time.perf_counter()   # the evaluation is not a step's time
        curve.write(json.dumps(row) + "\n")
        curve.flush()
        if not np.isfinite(bits):
          raise FloatingPointError(f"{name}: train bits/byte {bits} at step {step}")
      # Past the deadline after the probe has let the run go on: stop, keep the curve.
      if "step_s" in out and time.perf_counter() > deadline and step < steps:
        status = "truncated"
        break
    if status == "done" and step == steps:   # the last logged row evaluated at `steps`
      validation.write_per_doc(workdir, steps, "byte", names, nats_D, tokens_D)
      out["final_eval_bpb"] = float(nats_D.sum() / max(tokens_D.sum(), 1.0) / np.log(2.0))
    out.update(status=status, trained_steps=step, wall_s=round(time.perf_counter() - t0, 2))
    if timed_from is not None and "step_s" not in out:
      out["step_s"] = round((time.perf_counter() - t_timed) / max(step - timed_from, 1), 5)
    return out
  finally:
    curve.close()
