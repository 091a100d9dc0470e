"""`train(config, workdir)`: the training loop as a library function.

    corpus -> manifest -> packed, shuffled batches (grain)
    model + AdamW groups -> jitted step (state donated)
    every step:   dispatch step s, then fetch step s-1's metrics (no host sync
                  on the step just dispatched); NaN/Inf -> FloatingPointError
    eval_every:   validation bits per byte + Lngram metrics
    ckpt_every:   orbax checkpoint of params, optimizer, step, RNG, data
                  iterator and config, written only after that step's metrics
                  were checked, so every checkpoint on disk is a good one
    SIGTERM / Ctrl-C: finish the current step, save, return (interrupted)

Rerunning with the same workdir resumes from the newest valid checkpoint and
continues bit for bit as if the run had not stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.checkpoint.manager import Checkpointer
from experiments.configs.base import corpus_spec, lm_config
from experiments.data import load_corpus, write_manifest
from experiments.models import DecoderLM
from experiments.train import optimizer as optim_lib
from experiments.train import step as step_lib
from experiments.train import writers

log = logging.getLogger("experiments")


def saved_config(config) -> dict:
  """What a checkpoint stores: the experiment config and the resolved model config."""
  return {"experiment": json.loads(config.to_json_best_effort()),
          "model": lm_config(config).to_dict()}


def init_model(config):
  """(graphdef, params as a pure dict) of a freshly initialised model."""
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=config.train.seed))
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, nnx.to_pure_dict(params)


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) that tell orbax how to restore `tree`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree)


def train(config, workdir, *, callback=None) -> dict:
  """Trains (or resumes) the run in `workdir`; returns its final state summary.

  Args:
    config: an experiment ConfigDict (see experiments/configs/base.py).
    workdir: run directory (checkpoints, metrics, manifest, plots).
    callback: optional `callback(step, batch)`, called with each step's number
      (1-based) and host batch just before the step runs; tests use it to
      record the data order, poison a batch or send a signal.

  Returns:
    {"step", "eval" (last evaluation), "interrupted", "workdir"}.

  Raises:
    FloatingPointError: a metric became NaN/Inf (names the step and metric);
      checkpoints already on disk are kept.
  """
  workdir = Path(workdir).expanduser().resolve()
  workdir.mkdir(parents=True, exist_ok=True)
  tc, dc = config.train, config.data
  total = int(tc.steps)
  lm_cfg = lm_config(config)

  # grain is imported here, not at module level: notebooks and machines
  # without grain still import this package (restore, evaluate, metrics).
  from experiments.data.pipeline import TrainIterator, eval_batches

  corpus = load_corpus(corpus_spec(config))
  write_manifest(corpus, workdir)
  data = TrainIterator(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size, seed=dc.seed)
  val_batches = eval_batches(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size,
                             max_batches=dc.eval_batches)

  graphdef, params = init_model(config)
  tx = optim_lib.make_optimizer(config.optim, params, total)
  state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
  rng = jax.random.key(tc.seed)
  meta_config = saved_config(config)
  ckpt = Checkpointer(workdir, max_to_keep=tc.max_to_keep, async_save=tc.async_checkpoint)

  start = 0
  if ckpt.latest_step() is not None:
    state, rng, start = _resume(ckpt, state, data, meta_config)
  log.info("run %s: %s; corpus %d train / %d validation bytes; groups %s",
           workdir, f"resuming at step {start}" if start else "new",
           corpus.train_bytes, corpus.val_bytes, optim_lib.group_sizes(params))

  train_step = step_lib.make_train_step(
      graphdef, tx, optim_lib.learning_rate_schedule(config.optim, total))
  eval_step = step_lib.make_eval_step(graphdef, lm_cfg.lngram)
  writer = writers.MetricsWriter(workdir, resume_step=start)
  tokens_per_step = dc.batch_size * dc.seq_len
  progress = writers.Progress(total, start=start, tokens_per_step=tokens_per_step,
                              every=tc.log_every, enabled=tc.progress)

  def save(step):
    ckpt.save(step, params=state["params"], opt_state=state["opt_state"], rng=rng,
              data_state=data.get_state(), config=meta_config)

  last_eval, interrupted = {}, False
  pending = None  # (step, device metrics) not yet fetched
  clock = _Clock(start)
  step = start
  try:
    with _StopOnSignal() as stop:
      for step in range(start + 1, total + 1):
        batch = next(data)
        if callback is not None:
          callback(step, batch)
        state, metrics = train_step(state, batch)
        # Fetch the previous step's metrics while this one runs.
        if pending is not None:
          _check_and_log(*pending, writer, progress, clock, tc.log_every, tokens_per_step)
        pending = (step, metrics)
        boundary = (step % tc.ckpt_every == 0 or step % tc.eval_every == 0
                    or step == total or stop.requested)
        if not boundary:
          continue
        _check_and_log(*pending, writer, progress, clock, tc.log_every, tokens_per_step)
        pending = None
        if step % tc.eval_every == 0 or step == total:
          last_eval = step_lib.evaluate(eval_step, state["params"], val_batches)
          writer.write(step, last_eval)
          log.info("step %d: validation %.4f bits/byte", step,
                   last_eval["eval/bits_per_byte"])
        if step % tc.ckpt_every == 0 or step == total or stop.requested:
          save(step)
        if stop.requested:
          interrupted = True
          log.warning("stopped by %s after step %d; checkpoint saved.", stop.signal, step)
          break
  except FloatingPointError as e:
    ckpt.wait()
    raise FloatingPointError(
        f"{e} Last good checkpoint: step {ckpt.latest_step()} in {ckpt.directory}.") from None
  finally:
    progress.close()
    ckpt.close()  # waits for the last asynchronous save
    writer.close()
  if start >= total:
    log.info("run %s already has %d of %d steps.", workdir, start, total)
    last_eval = step_lib.evaluate(eval_step, state["params"], val_batches)
  writers.plot_curves(workdir)
  return {"step": int(step), "eval": last_eval, "interrupted": interrupted,
          "workdir": str(workdir)}


def _resume(ckpt: Checkpointer, state, data, meta_config):
  restored = ckpt.restore_latest_valid(abstract_params=abstract_like(state["params"]),
                                       abstract_opt_state=abstract_like(state["opt_state"]))
  if restored["config"]["model"] != meta_config["model"]:
    raise ValueError(
        f"{ckpt.directory} holds a run of a different model "
        f"({restored['config']['model']}); use a new --workdir.")
  step = int(restored["meta"]["step"])
  data.set_state(restored["data"])
  opt_state = jax.tree.unflatten(jax.tree.structure(state["opt_state"]),
                                 jax.tree.leaves(restored["opt_state"]))
  state = {"params": restored["params"], "opt_state": opt_state,
           "step": jnp.asarray(step, jnp.int32)}
  rng = jax.random.wrap_key_data(jnp.asarray(restored["meta"]["rng"], jnp.uint32))
  log.info("resumed from checkpoint step %d in %s", step, ckpt.directory)
  return state, rng, step


class _Clock:
  """Tokens/s between logged steps (wall time, measured on fetched metrics)."""

  def __init__(self, step):
    self.step, self.time = step, time.perf_counter()

  def rate(self, step, tokens_per_step):
    now = time.perf_counter()
    rate = (step - self.step) * tokens_per_step / max(now - self.time, 1e-9)
    self.step, self.time = step, now
    return rate


def _check_and_log(step, metrics, writer, progress, clock, log_every, tokens_per_step):
  host = {k: float(v) for k, v in jax.device_get(metrics).items()}
  for key, value in host.items():
    if not np.isfinite(value):
      raise FloatingPointError(
          f"step {step}: {key} = {value} is not finite; training stopped.")
  progress.update(step, host["train/loss"])
  if step % log_every == 0:
    host["train/tokens_per_s"] = clock.rate(step, tokens_per_step)
    writer.write(step, host)


class _StopOnSignal(contextlib.AbstractContextManager):
  """Turns the first SIGTERM/SIGINT into a stop request; a second Ctrl-C aborts."""

  def __init__(self):
    self.requested, self.signal, self._previous = False, None, {}

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested, self.signal = True, signal.Signals(signum).name

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    return False
