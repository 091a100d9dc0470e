"""`train(config, workdir)`: the one training loop, for the LM and every VLM stage.

    task (experiments/train/task.py): module, batches, loss hook, phases, ...
    params + the one optimiser (AdamW groups, warmup + cosine, clipping, a
    trainable mask) -> jitted step (state donated), one per phase
    every step:   [host-side batch preparation given the current params],
                  dispatch step s, then fetch step s-1's metrics (no host sync
                  on the step just dispatched); NaN/Inf -> FloatingPointError
    phase start:  a fresh optimiser state and the phase's own schedule (and
                  the task's `phase_reset` leaves back at their initial values)
    eval_every:   the task's evaluation
    ckpt_every:   orbax checkpoint of params, optimizer, step, RNG, data
                  source state and config, written only after that step's
                  metrics were checked, so every checkpoint on disk is a good one
    SIGTERM / Ctrl-C: finish the current step, save, return (interrupted)
    the end:      the task's `finish` (VLM: accuracy by length, metrics.json)

Rerunning with the same workdir resumes from the newest valid checkpoint and
continues bit for bit as if the run had not stopped. Around that:
  - the workdir is locked (`<workdir>/.lock`, experiments/checkpoint/lock.py)
    for the whole run: a second `train` there raises WorkdirLockedError;
  - the saved config JSON is compared with the requested one before any array
    is read: another model -> ConfigMismatchError (the differing fields, what to
    do); a changed optimiser/schedule/`train.steps` is refused the same way
    unless `train.allow_config_change` is true, and then logged one line each;
  - corrupt steps newer than the one resumed from are renamed `<step>.corrupt`
    (kept, never deleted) so training saves them again; one warning each;
  - a failed save (disk full, read-only) raises CheckpointSaveError naming the
    step and cause; the previous checkpoint stays the latest.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.checkpoint import run_checkpointer
from experiments.checkpoint.lock import WorkdirLock
from experiments.models import layout
from experiments.train import mesh as mesh_lib
from experiments.train import optimizer as optim_lib
from experiments.train import step as step_lib
from experiments.train import writers
from experiments.train.task import Task, make_task
from lngram_jax.checkpoint import (
    Checkpointer,
    CheckpointError,
    ConfigMismatchError,
    config_diff,
)

log = logging.getLogger("experiments")


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) that tell orbax how to restore `tree`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree)


def train(config, workdir, *, callback=None, task: Task | None = None) -> dict:
  """Trains (or resumes) the run in `workdir`; returns its final state summary.

  Args:
    config: an experiment ConfigDict (experiments/configs/*.py).
    workdir: run directory (checkpoints, metrics, plots, the task's files).
    callback: optional `callback(step, batch)`, called with each step's number
      (1-based) and host batch just before the step runs; tests use it to
      record the data order, poison a batch or send a signal.
    task: the run's task; default `make_task(config, workdir)`.

  Returns:
    {"step", "eval" (last evaluation), "interrupted", "workdir", "final" (what
    the task's `finish` returned, {} if none or interrupted)}.

  Raises:
    FloatingPointError: a metric became NaN/Inf (names the step and metric);
      checkpoints already on disk are kept.
    WorkdirLockedError: another training holds the workdir.
    ConfigMismatchError: the workdir holds a run of another model, or of
      another optimiser/schedule/steps (see `train.allow_config_change`).
    CheckpointSaveError: a checkpoint could not be written.
  """
  workdir = Path(workdir).expanduser().resolve()
  workdir.mkdir(parents=True, exist_ok=True)
  mesh = mesh_lib.make_train_mesh(config.get("mesh"))   # checked before the workdir is locked
  # Several processes (jax.distributed) train one run: process 0 holds the lock and
  # writes metrics and plots; every process saves and restores its own shards.
  lock = WorkdirLock(workdir) if jax.process_index() == 0 else _NoLock()
  with lock, layout.use(mesh):
    return _train(config, workdir, callback=callback, task=task, lock=lock, mesh=mesh)


class _NoLock(contextlib.nullcontext):
  """The lock of processes other than process 0 (which holds the real one)."""

  def touch(self):
    pass


def _train(config, workdir: Path, *, callback, task: Task | None, lock, mesh) -> dict:
  tc = config.train
  profile = _Profile(tc.get("profile_steps", ()), workdir)   # checked before anything is built
  task = task or make_task(config, workdir)
  if task.check_mesh is not None:
    task.check_mesh(mesh)
  elif mesh.shape["seq"] > 1:
    raise ValueError(f"mesh.seq={mesh.shape['seq']}: only the byte LM splits time over "
                     "devices (context parallelism); use mesh.seq=1 for this run.")
  total = task.total_steps
  ends = np.cumsum(task.phases).tolist()   # last step of each phase

  graphdef, params, rest = nnx.split(task.module, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  # Every array is placed on the mesh (experiments/train/mesh.py); the optimiser state
  # is born in its shards, and the step keeps the state's layout from step to step.
  placed = mesh_lib.Placement(mesh, params, lngram_paths=layout.lngram_paths(task.module))
  params, rest = placed.put_params(params), placed.put_replicated(rest)
  txs = [optim_lib.make_optimizer(task.optim, params, steps, trainable=task.trainable)
         for steps in task.phases]
  state = {"params": params, "opt_state": placed.init_opt_state(txs[0], params),
           "step": placed.put_replicated(jnp.zeros((), jnp.int32))}
  rng = jax.random.key(tc.seed)
  # Leaves that restart from their initial values at every phase (host copies:
  # the initial device arrays are donated by the first step).
  phase_init = {}
  if task.phase_reset is not None:
    phase_init = {optim_lib.path_str(p): np.array(x) for p, x in
                  jax.tree_util.tree_flatten_with_path(params)[0]
                  if task.phase_reset(optim_lib.path_str(p))}
  ckpt = run_checkpointer(workdir, max_to_keep=tc.max_to_keep, async_save=tc.async_checkpoint)

  start = 0
  if ckpt.latest_step() is not None:
    state, rng, start = _resume(ckpt, state, task, config)
  log.info("run %s: %s; %s; %d steps in phases %s; groups %s%s", workdir,
           f"resuming at step {start}" if start else "new", task.description, total,
           list(task.phases), optim_lib.group_sizes(params, task.trainable),
           f"; mesh {mesh_lib.describe(mesh)}" if mesh.size > 1 else "")
  if jax.process_count() > 1:
    log.info("process %d of %d: %d of %d devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())

  steps_by_phase = {}

  def train_step(phase):
    if phase not in steps_by_phase:
      lr_fn = optim_lib.learning_rate_schedule(task.optim, task.phases[phase])
      steps_by_phase[phase] = step_lib.make_train_step(
          graphdef, txs[phase], lr_fn, task.loss, phase_start=ends[phase] - task.phases[phase],
          grad_accum=int(tc.get("grad_accum", 1)),
          out_shardings=placed.step_out_shardings(state))
    return steps_by_phase[phase]

  def module():
    return nnx.merge(graphdef, state["params"], rest)

  primary = jax.process_index() == 0
  writer = (writers.MetricsWriter(workdir, resume_step=start) if primary
            else writers.NullWriter())
  progress = writers.Progress(total, start=start, tokens_per_step=task.tokens_per_step,
                              every=tc.log_every, enabled=tc.progress and primary)

  def save(step):
    ckpt.save(step, params=state["params"], opt_state=state["opt_state"], rng=rng,
              data_state=task.batches.get_state(), config=task.saved_config)
    lock.touch()

  def evaluate(step):
    result = task.evaluate(module()) if task.evaluate is not None else {}
    if result:
      writer.write(step, result)
      log.info("step %d: %s", step, _headline(result))
    return result

  last_eval, interrupted = {}, False
  pending = None  # (step, device metrics) not yet fetched
  clock = _Clock(start)
  step = start
  t0 = time.perf_counter()
  finished = False   # a failure in flight wins over a second one from closing
  try:
    with _StopOnSignal() as stop:
      for step in range(start + 1, total + 1):
        phase = int(np.searchsorted(ends, step))   # the phase that holds `step`
        if phase > 0 and step == ends[phase - 1] + 1:
          # A new phase: fresh optimiser moments and count (its own schedule).
          state["params"] = placed.put_params(_reset_leaves(state["params"], phase_init))
          state["opt_state"] = placed.init_opt_state(txs[phase], state["params"])
          log.info("step %d: phase %d of %d (%d steps)", step, phase + 1, len(ends),
                   task.phases[phase])
        profile.before(step)
        t_data = time.perf_counter()
        batch = next(task.batches)
        if task.prepare is not None:
          batch = task.prepare(module(), batch, step)
        clock.data_s += time.perf_counter() - t_data
        if callback is not None:
          callback(step, batch)
        batch = placed.put_batch(batch, tokens=task.kind == "lm", rows=task.batch_rows)
        state, metrics = train_step(phase)(state, rest, batch)
        profile.after(step, metrics)
        # Fetch the previous step's metrics while this one runs.
        if pending is not None:
          _check_and_log(*pending, writer, progress, clock, tc.log_every, task.tokens_per_step)
        pending = (step, metrics)
        boundary = (step % tc.ckpt_every == 0 or step % tc.eval_every == 0
                    or step == total or stop.requested)
        if not boundary:
          continue
        _check_and_log(*pending, writer, progress, clock, tc.log_every, task.tokens_per_step)
        pending = None
        if step % tc.eval_every == 0 or step == total:
          last_eval = evaluate(step)
        if step % tc.ckpt_every == 0 or step == total or stop.requested:
          save(step)
        if stop.requested:
          interrupted = True
          log.warning("stopped by %s after step %d; checkpoint saved.", stop.signal, step)
          break
    finished = True
  except FloatingPointError as e:
    ckpt.wait()
    raise FloatingPointError(
        f"{e} Last good checkpoint: step {ckpt.latest_step()} in {ckpt.directory}.") from None
  finally:
    profile.stop()
    progress.close()
    writer.close()
    try:
      ckpt.close()  # waits for the last asynchronous save
    except CheckpointError:
      if finished:
        raise
  train_seconds = time.perf_counter() - t0
  if start >= total:
    log.info("run %s already has %d of %d steps.", workdir, start, total)
    last_eval = task.evaluate(module()) if task.evaluate is not None else {}
  if primary:
    writers.plot_curves(workdir)
  final = {}
  if not interrupted and task.finish is not None:
    final = task.finish(module(), {"step": int(step), "train_seconds": train_seconds,
                                   "resumed_from": start, "workdir": workdir})
  return {"step": int(step), "eval": last_eval, "interrupted": interrupted,
          "workdir": str(workdir), "final": final}


def _reset_leaves(params, initial: dict):
  if not initial:
    return params
  return jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.asarray(initial.get(optim_lib.path_str(p), x), x.dtype), params)


def _headline(result: dict) -> str:
  if "eval/bits_per_byte" in result:
    return f"validation {result['eval/bits_per_byte']:.4f} bits/byte"
  return ", ".join(f"{k} {v:.4f}" for k, v in sorted(result.items())[:4])


# The parts of the experiment config a resume may not change silently: they
# define the optimiser and its LR schedule (warmup + cosine over train.steps).
_SCHEDULE_KEYS = (("optim",), ("train", "steps"), ("vlm", "stage", "curriculum"))


def _pick(tree: dict, keys: tuple) -> object:
  for key in keys:
    if not isinstance(tree, dict) or key not in tree:
      return "<absent>"
    tree = tree[key]
  return tree


def _lines(diff) -> str:
  return "; ".join(f"{path}: {old!r} -> {new!r}" for path, old, new in diff)


def check_resume_config(directory, saved: dict, wanted: dict, allow_change: bool) -> None:
  """Compares a checkpoint's config JSON with the requested run's (before reading arrays)."""
  model_diff = (config_diff(saved.get("kind", "lm"), wanted.get("kind", "lm"), "kind")
                + config_diff(saved.get("model", {}), wanted.get("model", {}), "model")
                + config_diff(saved.get("trained") or {}, wanted.get("trained") or {},
                              "trained"))
  if model_diff:
    raise ConfigMismatchError(
        f"{directory} holds a run of a different model than the one requested: "
        f"{_lines(model_diff)}. Train this model in a new --workdir, or pass the --config "
        "that matches the run to resume it (the run's config: "
        "`experiments.restore(workdir)[1]`).")
  old, new = saved.get("experiment", {}), wanted.get("experiment", {})
  schedule_diff = []
  for keys in _SCHEDULE_KEYS:
    if _pick(old, keys) == "<absent>" and _pick(new, keys) == "<absent>":
      continue
    schedule_diff += config_diff(_pick(old, keys), _pick(new, keys), ".".join(keys))
  if not schedule_diff:
    return
  if not allow_change:
    raise ConfigMismatchError(
        f"resuming the run in {directory} would change its optimiser or LR schedule: "
        f"{_lines(schedule_diff)}. Pass the --config the run was started with, or use a new "
        "--workdir, or add --config.train.allow_config_change=True to resume with these "
        "changes (the schedule then changes at the resume step).")
  for path, was, now in schedule_diff:
    log.warning("resume: %s changed %r -> %r (allowed by train.allow_config_change).",
                path, was, now)


def _resume(ckpt: Checkpointer, state, task: Task, config):
  # The config JSON first: a run of another model must not get as far as a
  # shape error in the array reads.
  found, saved = ckpt.newest_readable_config(warn=False)   # the quarantine warns
  check_resume_config(ckpt.directory.parent, saved, task.saved_config,
                      bool(config.train.get("allow_config_change", False)))
  restored = ckpt.restore_latest_valid(abstract_params=abstract_like(state["params"]),
                                       abstract_opt_state=abstract_like(state["opt_state"]),
                                       quarantine=True, skip=ckpt.unreadable_configs)
  if restored["step"] != found:   # fell back past the step whose config was checked
    check_resume_config(ckpt.directory.parent, restored["config"], task.saved_config,
                        bool(config.train.get("allow_config_change", False)))
  step = int(restored["meta"]["step"])
  task.batches.set_state(restored["data"])
  opt_state = jax.tree.unflatten(jax.tree.structure(state["opt_state"]),
                                 jax.tree.leaves(restored["opt_state"]))
  state = {"params": restored["params"], "opt_state": opt_state,
           "step": jax.device_put(jnp.asarray(step, jnp.int32), state["step"].sharding)}
  rng = jax.random.wrap_key_data(jnp.asarray(restored["meta"]["rng"], jnp.uint32))
  log.info("resumed from checkpoint step %d in %s", step, ckpt.directory)
  return state, rng, step


class _Clock:
  """Tokens/s and the step-time split between logged steps (wall time, on fetched metrics).

  time/step_s: wall seconds per step; time/data_s: of which waiting for the batch
  (and the task's host-side `prepare`); time/sync_s: of which fetching metrics to
  the host (the device catching up). The rest is dispatch, logging, evaluation and
  checkpoints.
  """

  def __init__(self, step):
    self.step, self.time = step, time.perf_counter()
    self.data_s = self.sync_s = 0.0

  def rate(self, step, tokens_per_step):
    """(tokens/s, {time/...}) since the last call; restarts the interval."""
    now = time.perf_counter()
    steps = max(step - self.step, 1)
    wall = max(now - self.time, 1e-9)
    split = {"time/step_s": wall / steps, "time/data_s": self.data_s / steps,
             "time/sync_s": self.sync_s / steps}
    rate = (step - self.step) * tokens_per_step / wall
    self.step, self.time, self.data_s, self.sync_s = step, now, 0.0, 0.0
    return rate, split


class _Profile:
  """`train.profile_steps=(a, b)`: a JAX profiler trace of steps a..b in <workdir>/profile
  (open it with TensorBoard's profile plugin or Perfetto)."""

  def __init__(self, steps, workdir: Path):
    steps = tuple(int(s) for s in (steps or ()))
    if steps and (len(steps) != 2 or not 1 <= steps[0] <= steps[1]):
      raise ValueError(f"train.profile_steps={steps} must be (first, last) with "
                       "1 <= first <= last.")
    self.steps, self.directory, self.active = steps, workdir / "profile", False

  def before(self, step):
    if self.steps and step == self.steps[0] and not self.active:
      jax.profiler.start_trace(str(self.directory))
      self.active = True

  def after(self, step, metrics):
    if self.active and step >= self.steps[1]:
      jax.block_until_ready(metrics)
      self.stop()

  def stop(self):
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
      log.info("profile of steps %d..%d written to %s", *self.steps, self.directory)


def _check_and_log(step, metrics, writer, progress, clock, log_every, tokens_per_step):
  t_sync = time.perf_counter()
  host = {k: float(v) for k, v in jax.device_get(metrics).items()}
  clock.sync_s += time.perf_counter() - t_sync
  for key, value in host.items():
    if not np.isfinite(value):
      raise FloatingPointError(
          f"step {step}: {key} = {value} is not finite; training stopped.")
  progress.update(step, host["train/loss"])
  if step % log_every == 0:
    host["train/tokens_per_s"], split = clock.rate(step, tokens_per_step)
    writer.write(step, host | split)


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
