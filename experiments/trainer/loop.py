"""`train(task, train_config, workdir, mesh)`: the one training loop, for every task.

    task (experiments/trainer/protocol.py): module, batches, loss hook, phases, ...
    state (experiments/trainer/state.py): params + the one optimiser per phase
    (AdamW groups, warmup + cosine, clipping, a trainable mask) on the mesh ->
    jitted step (state donated), one per phase
    every step:   [host-side batch preparation given the current params],
                  dispatch step s, then fetch step s-1's metrics (no host sync
                  on the step just dispatched); NaN/Inf -> FloatingPointError
    phase start:  a fresh optimiser state and the phase's own schedule (and
                  the task's `phase_reset` leaves back at their initial values)
    eval_every:   the task's evaluation (and after the last step)
    log_every:    the metrics (process 0): metrics.jsonl, TensorBoard, and a W&B run
                  when train.wandb_project is set (resumed runs continue it)
    ckpt_every:   orbax checkpoint of params, optimizer state, step, the batch
                  source's state and the saved config (and after the last step),
                  written only after that step's metrics were checked, so every
                  checkpoint on disk is a good one
    SIGTERM / Ctrl-C: finish the current step, save, return (interrupted)
    the end:      the task's `finish` (VLM: accuracy by length, metrics.json)

The caller (experiments/jobs `run_train`) builds the task inside `open_run(workdir)`, which
locks the run directory (`<workdir>/.lock`, experiments/trainer/lock.py) for the
whole run and removes a directory it created if the run is refused before its
first step. Rerunning with the same workdir resumes from the newest valid
checkpoint and continues bit for bit as if the run had not stopped. Around that:
  - the task's `check_resume` sees the saved config before any array is read
    (another model, a changed schedule: experiments/jobs/checks.py);
  - corrupt steps newer than the one resumed from are renamed `<step>.corrupt`
    (kept, never deleted) so training saves them again; one warning each;
  - a failed save (disk full, read-only) raises CheckpointSaveError naming the
    step and cause; the previous checkpoint stays the latest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.trainer import optimizer as optim_lib
from experiments.trainer import placement as placement_lib
from experiments.trainer import writers
from experiments.trainer.checkpoint import Checkpointer, CheckpointError, run_checkpointer
from experiments.trainer.control import Clock, Profile, StopOnSignal
from experiments.trainer.lock import WorkdirLock
from experiments.trainer.protocol import Task
from experiments.trainer.state import abstract_like, init_train_state

log = logging.getLogger("experiments")


@dataclasses.dataclass
class Run:
  """An open run directory: its lock, and whether training has started in it."""

  workdir: Path
  lock: object
  created: bool
  started: bool = False


@contextlib.contextmanager
def open_run(workdir):
  """Creates (if needed) and locks the run directory; yields its `Run`.

  Several processes (jax.distributed) train one run: process 0 holds the lock
  and writes metrics and plots; every process saves and restores its own
  shards. A run refused before its first step (a bad config, a changed corpus,
  another model's checkpoints) leaves no trace in a directory it created.
  """
  workdir = Path(workdir).expanduser().resolve()
  if workdir.exists() and not workdir.is_dir():
    raise ValueError(f"workdir {workdir} is a file, not a directory; pass a directory "
                     "(it is created if missing).")
  created = workdir   # the outermost directory this call creates, if any
  while not created.parent.exists():
    created = created.parent
  created = None if workdir.exists() else created
  workdir.mkdir(parents=True, exist_ok=True)
  primary = jax.process_index() == 0
  run = Run(workdir, WorkdirLock(workdir) if primary else _NoLock(), created is not None)
  try:
    with run.lock:
      yield run
  except BaseException:
    if created is not None and not run.started and primary:
      shutil.rmtree(created, ignore_errors=True)
    raise


class _NoLock(contextlib.nullcontext):
  """The lock of processes other than process 0 (which holds the real one)."""

  def touch(self):
    pass


def train(task: Task, train_config, workdir, mesh, *, callback=None,
          run: Run | None = None) -> dict:
  """Trains (or resumes) `task` in `workdir` on `mesh`; returns its final state summary.

  Args:
    task: the run's task (experiments/trainer/protocol.py).
    train_config: the `train` config block (steps between logs, evaluations and
      checkpoints, max_to_keep, async_checkpoint, progress, grad_accum,
      profile_steps; wandb_project, wandb_entity, wandb_run_name, wandb_tags: process
      0 mirrors the metrics to a Weights & Biases run, `writers.WandbRun`, whose
      fields `lngram-exp train` checks before the run, `writers.check_wandb`).
    workdir: run directory (checkpoints, metrics, plots, the task's files).
    mesh: the device mesh (`placement.make_train_mesh`).
    callback: optional `callback(step, batch)`, called with each step's number
      (1-based) and host batch just before the step runs; tests use it to
      record the data order, poison a batch or send a signal.
    run: the `open_run(workdir)` the task was built in; None: opened here.

  Returns:
    {"step", "eval" (last evaluation), "interrupted", "workdir", "final" (what
    the task's `finish` returned, {} if none or interrupted)}.

  Raises:
    FloatingPointError: a metric became NaN/Inf (names the step and metric);
      checkpoints already on disk are kept.
    WorkdirLockedError: another training holds the workdir.
    ConfigMismatchError: the task's `check_resume` refused the saved run.
    CheckpointSaveError: a checkpoint could not be written.
  """
  if run is None:
    with open_run(workdir) as opened:
      return _train(task, train_config, opened, mesh, callback=callback)
  return _train(task, train_config, run, mesh, callback=callback)


def _train(task: Task, tc, run: Run, mesh, *, callback) -> dict:
  """`train` in an open run: the state built (or resumed), the steps taken, the end."""
  workdir = run.workdir
  profile = Profile(tc.get("profile_steps", ()), workdir)   # checked before anything is built
  _check_mesh(task, mesh)
  # Every array is placed on the mesh; the optimiser state is born in its shards,
  # and the step keeps the state's layout from step to step.
  ts = init_train_state(task.module, task.optim, task.phases, mesh,
                        trainable=task.trainable, rules=task.placement)
  # No PRNG key here: the step draws nothing; what a task draws (data order, GRPO
  # samples) comes from its own seeded state, saved with the batches' state.
  phase_init = _phase_initial_values(task, ts.state["params"])
  ckpt = run_checkpointer(workdir, max_to_keep=tc.max_to_keep, async_save=tc.async_checkpoint,
                          log_file=workdir / "checkpoints.log")
  start, tracker = _resume_and_track(ckpt, ts, task, tc, workdir)
  run.started = True
  _log_start(task, ts, mesh, workdir, start)
  primary = jax.process_index() == 0
  writer = (writers.MetricsWriter(workdir, resume_step=start, wandb=tracker) if primary
            else writers.NullWriter())
  progress = writers.Progress(task.total_steps, start=start,
                              tokens_per_step=task.tokens_per_step, every=tc.log_every,
                              enabled=tc.progress and primary)
  steps = _Steps(task, tc, ts, ckpt, writer, progress, profile, run.lock, phase_init,
                 callback, start)
  train_seconds = steps.run()
  if start >= task.total_steps:
    log.info("run %s already has %d of %d steps.", workdir, start, task.total_steps)
    steps.last_eval = task.evaluate(ts.module()) if task.evaluate is not None else {}
  if primary:
    writers.plot_curves(workdir)
  final = {}
  if not steps.interrupted and task.finish is not None:
    final = task.finish(ts.module(), {"step": int(steps.step), "train_seconds": train_seconds,
                                      "resumed_from": start, "workdir": workdir})
  return {"step": int(steps.step), "eval": steps.last_eval, "interrupted": steps.interrupted,
          "workdir": str(workdir), "final": final}


def _check_mesh(task: Task, mesh) -> None:
  """The task's mesh check; without one, a mesh that splits time is refused."""
  if task.check_mesh is not None:
    task.check_mesh(mesh)
  elif mesh.shape["seq"] > 1:
    raise ValueError(f"mesh.seq={mesh.shape['seq']}: this run does not split time over "
                     "devices (context parallelism); use mesh.seq=1 for this run.")


def _phase_initial_values(task: Task, params) -> dict:
  """{path: host copy} of the leaves that restart from their initial values at every
  phase (host copies: the initial device arrays are donated by the first step)."""
  if task.phase_reset is None:
    return {}
  return {optim_lib.path_str(p): np.array(x) for p, x in
          jax.tree_util.tree_flatten_with_path(params)[0]
          if task.phase_reset(optim_lib.path_str(p))}


def _resume_and_track(ckpt: Checkpointer, ts, task: Task, tc, workdir):
  """(the step to start after, process 0's W&B run or None): the newest valid checkpoint
  restored into `ts`, if any, and the W&B run (train.wandb_project) made before the
  first step. The checkpointer is closed if either fails."""
  start, tracker = 0, None
  try:
    if ckpt.latest_step() is not None:
      ts.state, start = _resume(ckpt, ts.state, task)
    if jax.process_index() == 0 and tc.get("wandb_project"):
      tracker = writers.WandbRun(workdir, tc, config=_run_config(task, tc))
  except BaseException:
    ckpt.close()
    raise
  return start, tracker


def _log_start(task: Task, ts, mesh, workdir, start: int) -> None:
  log.info("run %s: %s; %s; %d steps in phases %s; groups %s%s", workdir,
           f"resuming at step {start}" if start else "new", task.description,
           task.total_steps, list(task.phases),
           optim_lib.group_sizes(ts.state["params"], task.trainable, task.optim),
           f"; mesh {placement_lib.describe(mesh)}" if mesh.size > 1 else "")
  if jax.process_count() > 1:
    log.info("process %d of %d: %d of %d devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())


class _Steps:
  """The steps of one training after `start`: each dispatched, its metrics checked and
  logged while the next runs, evaluations and checkpoints at their boundaries.

  After `run`: `step` (the last step taken, `start` if none), `last_eval`,
  `interrupted` (stopped by a signal, saved)."""

  def __init__(self, task: Task, tc, ts, ckpt: Checkpointer, writer, progress,
               profile: Profile, lock, phase_init: dict, callback, start: int):
    self.task, self.tc, self.ts, self.ckpt = task, tc, ts, ckpt
    self.writer, self.progress, self.profile, self.lock = writer, progress, profile, lock
    self.phase_init, self.callback, self.start = phase_init, callback, start
    self.ends = np.cumsum(task.phases).tolist()   # last step of each phase
    self.step_fns = {}   # phase -> its jitted step, compiled on first use
    self.step, self.last_eval, self.interrupted = start, {}, False
    self.pending = None   # (step, device metrics) not yet fetched
    self.clock = Clock(start)

  def run(self) -> float:
    """Takes the steps; closes the profile, progress bar, writers and checkpointer.
    Returns the seconds it took."""
    t0 = time.perf_counter()
    finished = False   # a failure in flight wins over a second one from closing
    try:
      with StopOnSignal() as stop:
        for step in range(self.start + 1, self.task.total_steps + 1):
          self.step = step
          self._take(step)
          if self._boundary(step, stop):
            break
      finished = True
    except FloatingPointError as e:
      self.ckpt.wait()
      raise FloatingPointError(f"{e} Last good checkpoint: step {self.ckpt.latest_step()} "
                               f"in {self.ckpt.directory}.") from None
    finally:
      self.profile.stop()
      self.progress.close()
      self.writer.close(failed=not finished)
      try:
        self.ckpt.close()  # waits for the last asynchronous save
      except CheckpointError:
        if finished:
          raise
    return time.perf_counter() - t0

  def _take(self, step: int) -> None:
    """Dispatches `step`, then fetches and checks the previous step's metrics (no host
    sync on the step just dispatched)."""
    task, ts = self.task, self.ts
    phase = int(np.searchsorted(self.ends, step))   # the phase that holds `step`
    if phase > 0 and step == self.ends[phase - 1] + 1:
      self._start_phase(step, phase)
    self.profile.before(step)
    t_data = time.perf_counter()
    batch = next(task.batches)
    if task.prepare is not None:
      batch = task.prepare(ts.module(), batch, step)
    self.clock.data_s += time.perf_counter() - t_data
    if self.callback is not None:
      self.callback(step, batch)
    batch = ts.placement.put_batch(batch, tokens=task.seq_batches, rows=task.batch_rows)
    ts.state, metrics = self._step_fn(phase)(ts.state, ts.rest, batch)
    self.profile.after(step, metrics)
    # Fetch the previous step's metrics while this one runs.
    if self.pending is not None:
      self._log_pending()
    self.pending = (step, metrics)

  def _start_phase(self, step: int, phase: int) -> None:
    """A new phase: fresh optimiser moments and count (its own schedule)."""
    ts = self.ts
    ts.state["params"] = ts.placement.put_params(
        _reset_leaves(ts.state["params"], self.phase_init))
    ts.state["opt_state"] = ts.placement.init_opt_state(ts.txs[phase], ts.state["params"])
    log.info("step %d: phase %d of %d (%d steps)", step, phase + 1, len(self.ends),
             self.task.phases[phase])

  def _step_fn(self, phase: int):
    if phase not in self.step_fns:
      task = self.task
      lr_fn = optim_lib.learning_rate_schedule(task.optim, task.phases[phase])
      self.step_fns[phase] = self.ts.step_fn(
          phase, task.loss, lr_fn, phase_start=self.ends[phase] - task.phases[phase],
          grad_accum=int(self.tc.get("grad_accum", 1)))
    return self.step_fns[phase]

  def _boundary(self, step: int, stop) -> bool:
    """At an evaluation, checkpoint, the last step or a signal: the metrics checked, then
    the evaluation and the save. True: stop here (a signal)."""
    tc, total = self.tc, self.task.total_steps
    if not (step % tc.ckpt_every == 0 or step % tc.eval_every == 0
            or step == total or stop.requested):
      return False
    self._log_pending()
    if step % tc.eval_every == 0 or step == total:
      self.last_eval = self._evaluate(step)
    if step % tc.ckpt_every == 0 or step == total or stop.requested:
      self._save(step)
    if stop.requested:
      self.interrupted = True
      log.warning("stopped by %s after step %d; checkpoint saved.", stop.signal, step)
      return True
    return False

  def _log_pending(self) -> None:
    """The pending step's metrics fetched, refused if not finite, logged."""
    step, metrics = self.pending
    self.pending = None
    _check_and_log(step, metrics, self.writer, self.progress, self.clock, self.tc.log_every,
                   self.task.tokens_per_step)

  def _save(self, step: int) -> None:
    self.writer.sync()   # the metrics up to this step outlive a power cut, as the checkpoint will
    self.ckpt.save(step, params=self.ts.state["params"], opt_state=self.ts.state["opt_state"],
                   data_state=self.task.batches.get_state(), config=self.task.saved_config)
    self.lock.touch()

  def _evaluate(self, step: int) -> dict:
    task = self.task
    result = task.evaluate(self.ts.module()) if task.evaluate is not None else {}
    if result:
      self.writer.write(step, result)
      log.info("step %d: %s", step, _headline(task, result))
    return result


def _run_config(task: Task, tc) -> dict:
  """What the W&B run records as its config: the experiment config the checkpoints
  store (and the task's kind), else the train block."""
  saved = task.saved_config or {}
  if "experiment" in saved:
    return {"kind": saved.get("kind", ""), **saved["experiment"]}
  return {"train": tc.to_dict() if hasattr(tc, "to_dict") else dict(tc)}


def _reset_leaves(params, initial: dict):
  if not initial:
    return params
  return jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.asarray(initial.get(optim_lib.path_str(p), x), x.dtype), params)


def _headline(task: Task, result: dict) -> str:
  if task.headline is not None:
    return task.headline(result)
  return ", ".join(f"{k} {v:.4f}" for k, v in sorted(result.items())[:4])



def _resume(ckpt: Checkpointer, state, task: Task):
  # The config JSON first: a run of another model must not get as far as a
  # shape error in the array reads.
  found, saved = ckpt.newest_readable_config(warn=False)   # the quarantine warns
  if task.check_resume is not None:
    task.check_resume(ckpt.directory.parent, saved)
  restored = ckpt.restore_latest_valid(abstract_params=abstract_like(state["params"]),
                                       abstract_opt_state=abstract_like(state["opt_state"]),
                                       quarantine=True, skip=ckpt.unreadable_configs)
  if restored["step"] != found and task.check_resume is not None:
    # fell back past the step whose config was checked
    task.check_resume(ckpt.directory.parent, restored["config"])
  step = int(restored["meta"]["step"])
  task.batches.set_state(restored["data"])
  opt_state = jax.tree.unflatten(jax.tree.structure(state["opt_state"]),
                                 jax.tree.leaves(restored["opt_state"]))
  state = {"params": restored["params"], "opt_state": opt_state,
           "step": jax.device_put(jnp.asarray(step, jnp.int32), state["step"].sharding)}
  log.info("resumed from checkpoint step %d in %s", step, ckpt.directory)
  return state, step



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
