"""Checkpoints and resume under faults and mistakes: nothing lost, one clear line.

Corrupt newest step -> moved aside and saved again; a workdir of another model
or schedule -> refused before any array is read; read failures -> one warning
line per step; a workdir lock; a failed save -> clear error, previous step intact;
a missing step is "missing", not "corrupt".
"""

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.jobs.restore import restore
from experiments.trainer.checkpoint import (
  Checkpointer,
  CheckpointError,
  CheckpointSaveError,
  ConfigMismatchError,
  CorruptCheckpointError,
  MissingStepError,
  WorkdirLockedError,
  run_checkpointer,
)
from experiments.trainer.lock import OTHER_HOST_STALE_S, AnalysisLock, WorkdirLock

REPO = Path(__file__).resolve().parents[3]
SMOKE = "experiments/configs/lm_lngram.py:smoke"


def _largest_file(directory: Path) -> Path:
  return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _flip_byte(step_dir: Path) -> None:
  target = _largest_file(step_dir / "params")
  data = bytearray(target.read_bytes())
  data[len(data) // 2] ^= 0x40
  target.write_bytes(bytes(data))


def _truncate(step_dir: Path) -> None:
  target = _largest_file(step_dir / "params")
  target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])


def _cli(*args, **kwargs):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": ""}
  return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, **kwargs)


# --- 1. a corrupt newest step is moved aside and saved again -------------------------------


def test_corrupt_newest_step_is_moved_aside_then_saved_again(smoke_run, smoke_run_copy,
                                                             smoke_config):
  from experiments.jobs import run_train as train
  from experiments.jobs.lm.evaluate import evaluate_run

  reference, _ = smoke_run
  workdir, _ = smoke_run_copy
  _flip_byte(workdir / "checkpoints" / "2")
  with pytest.warns(RuntimeWarning) as caught:
    result = train(smoke_config(steps=2, ckpt_every=1, eval_every=2), workdir)
  lines = [str(w.message) for w in caught if "corrupt" in str(w.message)]
  assert len(lines) == 1, lines
  assert "step 2" in lines[0] and "2.corrupt" in lines[0] and "resuming from step 1" in lines[0]
  assert result["step"] == 2
  assert (workdir / "checkpoints" / "2.corrupt" / "params").is_dir()   # kept, not deleted
  with run_checkpointer(workdir, create=False) as ckpt:
    assert ckpt.all_steps() == [1, 2]
  # The re-saved step 2 is valid and evaluates exactly as the uninterrupted run's.
  _, config = restore(workdir, step=2)
  assert config.restored_step == 2
  assert evaluate_run(workdir) == evaluate_run(reference)


def test_move_aside_never_overwrites(tmp_path):
  import numpy as np

  with Checkpointer(tmp_path, async_save=False) as ckpt:
    for _ in range(2):
      ckpt.save(3, params={"w": np.ones(2, np.float32)})
      ckpt.move_aside(3)
    assert ckpt.all_steps() == []
  assert sorted(p.name for p in tmp_path.iterdir()) == ["3.corrupt", "3.corrupt-2"]


# --- 2. a workdir of another model / schedule ----------------------------------------------


def test_workdir_of_another_model_is_refused_before_reading_arrays(smoke_run_copy, monkeypatch):
  from experiments.configs import load_config
  from experiments.jobs import run_train as train

  workdir, _ = smoke_run_copy

  def no_array_reads(*args, **kwargs):
    raise AssertionError("arrays were read before the config was compared")

  monkeypatch.setattr(Checkpointer, "restore_step", no_array_reads)
  config = load_config(f"{SMOKE},r8")
  config.train.update(steps=2, ckpt_every=1, eval_every=2, progress=False)
  with pytest.raises(ConfigMismatchError) as e:
    train(config, workdir)
  message = str(e.value)
  assert "model.memory.routes: 4 -> 8" in message
  assert "new --workdir" in message and "--config" in message
  assert isinstance(e.value, CheckpointError)


def test_changed_schedule_is_refused_unless_allowed(smoke_run_copy, smoke_config, caplog):
  from experiments.jobs import run_train as train

  workdir, _ = smoke_run_copy
  config = smoke_config(steps=3, ckpt_every=1, eval_every=3)
  config.optim.lr = 1e-3
  with pytest.raises(ConfigMismatchError, match=r"train\.steps: 2 -> 3") as e:
    train(config, workdir)
  assert "optim.lr: 0.003 -> 0.001" in str(e.value)
  assert "allow_config_change" in str(e.value)

  config.train.allow_config_change = True
  with caplog.at_level("WARNING", logger="experiments"):
    result = train(config, workdir)
  assert result["step"] == 3
  changed = [r.getMessage() for r in caplog.records if "allow_config_change" in r.getMessage()]
  assert len(changed) == 2, changed
  assert any("train.steps changed 2 -> 3" in line for line in changed)


# --- 3. read failures: one line per step tried, detail in a log file -----------------------


def test_restore_names_the_step_it_used(smoke_run_copy):
  workdir, _ = smoke_run_copy
  _flip_byte(workdir / "checkpoints" / "2")
  with pytest.warns(RuntimeWarning, match=r"step 2 .*previous checkpoint, step 1") as caught:
    _, config = restore(workdir)
  assert config.restored_step == 1
  assert len(caught) == 1   # orbax's own warnings and logging stay off the terminal


def test_loop_noise_during_a_failing_read_stays_off_the_terminal(smoke_run_copy, tmp_path):
  # tensorstore's threads can print "Event loop is closed" (PyErr_Print ->
  # sys.excepthook) while the failing read is still unwinding; a filter
  # installed only after the failure let those tracebacks reach the terminal.
  # The CLI's main holds the filter for the whole command; a fresh process.
  workdir, _ = smoke_run_copy
  log = tmp_path / "noise.log"
  code = ("import sys, threading\n"
          "from pathlib import Path\n"
          "from experiments.trainer.checkpoint import CorruptCheckpointError, run_checkpointer\n"
          "from experiments.cli.shutdown import cli_noise_filter\n"
          f"ckpt = run_checkpointer({str(workdir)!r})\n"
          "def restore(*args, **kwargs):\n"
          "  def report():\n"
          "    try:\n"
          "      raise RuntimeError('Event loop is closed')\n"
          "    except RuntimeError:\n"
          "      sys.excepthook(*sys.exc_info())\n"
          "  worker = threading.Thread(target=report); worker.start(); worker.join()\n"
          "  raise OSError('simulated unreadable step')\n"
          "ckpt._manager.restore = restore\n"
          f"with cli_noise_filter(Path({str(log)!r})):\n"
          "  try:\n"
          "    ckpt.read_json(2, 'meta')\n"
          "  except CorruptCheckpointError as e:\n"
          "    print('refused:', e)\n")
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith("refused: checkpoint step 2"), done.stdout
  assert "Event loop" not in done.stderr and "Traceback" not in done.stderr, done.stderr
  assert "Event loop is closed" in log.read_text()
  assert not (workdir / "checkpoints.log").exists()   # a reader writes nothing into the run


@pytest.mark.slow
def test_eval_on_a_damaged_newest_step_prints_a_few_lines(smoke_run_copy):
  workdir, _ = smoke_run_copy
  _truncate(workdir / "checkpoints" / "2")
  before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*")}
  done = _cli("eval", f"--workdir={workdir}", timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "eval/bits_per_byte" in done.stdout
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  assert len(lines) <= 3, done.stderr
  assert "Traceback" not in done.stderr and "Event loop" not in done.stderr
  warning = [line for line in lines if "step 2" in line]
  assert len(warning) == 1 and "step 1" in warning[0]
  assert any(line.startswith("checkpoint step 1 of") for line in lines), done.stderr
  # A read-only command: nothing written into the run (no checkpoints.log).
  assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*")} == before


def test_late_event_loop_reports_stay_off_the_terminal(tmp_path):
  """After a failed read, orbax's abandoned asyncio work may report "Event loop is
  closed" late, through an unraisable exception, an uncaught thread exception,
  asyncio's logger or sys.excepthook: within the CLI's filter all go to the log
  file, other errors still show, and the hooks are the process's own again after it."""
  log = tmp_path / "noise.log"
  code = f"""
import logging, sys, threading
from pathlib import Path
from experiments.cli.shutdown import cli_noise_filter

hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
filters = list(logging.getLogger("asyncio").filters)

def closed():
  raise RuntimeError("Event loop is closed")

def other():
  raise ValueError("a real bug")

class Finalised:
  def __del__(self):
    closed()

with cli_noise_filter(Path({str(log)!r})):
  for target in (closed, other):
    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
  logging.getLogger("asyncio").error("Exception in callback", exc_info=(
      RuntimeError, RuntimeError("Event loop is closed"), None))
  Finalised()
  try:   # what PyErr_Print does for a failed callback on a C++ thread
    closed()
  except RuntimeError:
    sys.excepthook(*sys.exc_info())
assert (sys.excepthook, threading.excepthook, sys.unraisablehook) == hooks, "hooks kept"
assert logging.getLogger("asyncio").filters == filters, "asyncio filter kept"
print("done")
"""
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 0 and done.stdout == "done\n", done.stderr
  assert "Event loop" not in done.stderr, done.stderr
  assert "ValueError: a real bug" in done.stderr
  assert log.read_text().count("late asyncio report") == 4


def test_library_code_sets_no_process_wide_hooks():
  """Only the CLI's scoped filter (experiments/cli/shutdown.py) may touch the
  interpreter's hooks; no library module patches them or ends the process."""
  allowed = {REPO / "experiments" / "cli" / "shutdown.py"}
  words = ("sys.excepthook =", "threading.excepthook =", "sys.unraisablehook =", "os._exit(")
  offenders = []
  for package in ("lngram_jax", "pvm_jax", "kernels", "experiments"):
    for path in (REPO / package).rglob("*.py"):
      if path in allowed or "bench" in path.parts:
        continue
      text = path.read_text()
      offenders += [f"{path.relative_to(REPO)}: {w}" for w in words if w in text]
  assert not offenders, offenders


# --- Ctrl-C in a read-only command: 130, one line, no traceback, no crash ----------------


_PROGRESS = re.compile(r"^(\d\d:\d\d:\d\d |records\[|\[\w+\] )")


def _cli_child(args):
  return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "experiments", *args],
                          cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupted_cli(args, fractions):
  """SIGINT to `lngram-exp *args` at each fraction in turn of the time an uninterrupted
  run takes (the shortest seen: later runs may compile less), until one lands before
  the command is done; its (returncode, stderr), or None if every one came too late."""
  start = time.perf_counter()
  out, err = _cli_child(args).communicate(timeout=600)
  assert out.strip(), err[-3000:]
  took = time.perf_counter() - start
  for fraction in fractions:
    start = time.perf_counter()
    child = _cli_child(args)
    time.sleep(fraction * took)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=300)
    if out.strip():   # the command had finished (it prints its results last): try earlier
      took = min(took, time.perf_counter() - start)
      continue
    return child.returncode, err
  return None


def _assert_interrupted_cleanly(result):
  assert result is not None, "every command finished before it could be interrupted"
  returncode, stderr = result
  assert returncode == 130, (returncode, stderr[-3000:])   # -11: crashed at exit
  assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr[-3000:]
  lines = [line for line in stderr.splitlines() if line.strip() and not _PROGRESS.match(line)]
  assert len(lines) <= 2 and lines[-1] == "interrupted", stderr[-3000:]


def test_ctrl_c_during_eval_exits_130_in_one_line(smoke_run):
  workdir, _ = smoke_run
  for fractions in ((0.8, 0.6, 0.5), (0.4, 0.25, 0.15, 0.1)):   # evaluating, and restoring or importing
    _assert_interrupted_cleanly(_interrupted_cli(("eval", f"--workdir={workdir}"), fractions))


@pytest.mark.slow
def test_ctrl_c_during_analyze_exits_130_in_one_line(smoke_run_copy):
  workdir, _ = smoke_run_copy
  _assert_interrupted_cleanly(_interrupted_cli(("analyze", f"--workdir={workdir}"),
                                               (0.7, 0.5, 0.3, 0.2)))


def test_ctrl_c_waits_for_imports_and_compiles_and_is_never_swallowed(tmp_path):
  """Ctrl-C inside an import (a half-initialised jaxlib module crashed the exit) or an
  XLA compile (it ran on in XLA's threads and crashed the exit) is delivered once that
  is done; inside a gc callback (jax runs one) Python would report it as "Exception
  ignored" and go on: it is delivered again."""
  (tmp_path / "slow_module.py").write_text(
      "import signal, time\nsignal.raise_signal(signal.SIGINT)\ntime.sleep(0.3)\n"
      "COMPLETE = True\n")
  code = """
import gc, signal, sys, time
from experiments.cli.shutdown import cli_noise_filter, run_interruptible

case, done = sys.argv[1], []

def backend_compile_and_load():   # named as jax's call into the XLA compiler
  signal.raise_signal(signal.SIGINT)
  time.sleep(0.3)
  done.append("compiled")

def callback(phase, info):
  if phase == "start" and not done:
    done.append("gc")
    raise KeyboardInterrupt   # what SIGINT does when it lands in a gc callback

def command():
  if case == "import":
    import slow_module
    done.append("imported" if slow_module.COMPLETE else "half")
  elif case == "compile":
    backend_compile_and_load()
  else:
    gc.callbacks.append(callback)
    gc.collect()
    gc.callbacks.remove(callback)
  for _ in range(300):
    time.sleep(0.01)
  print("ran on")
  return 0

with cli_noise_filter():
  status = run_interruptible(command)
print(status, done)
"""
  for case, finished in (("import", "imported"), ("compile", "compiled"), ("gc", "gc")):
    done = subprocess.run([sys.executable, "-c", code, case], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)})
    assert done.stdout == f"130 [{finished!r}]\n", (case, done.stdout, done.stderr)
    assert done.stderr == "interrupted\n", (case, done.stderr)


def _assert_command_interrupted_quietly(code: str, tmp_path: Path) -> None:
  """Runs `code`, which defines `command()`, as the CLI runs a command: 130 and the one
  line "interrupted" on stderr, nothing printed after it at the interpreter's exit."""
  script = code + """
import sys
from experiments.cli.shutdown import cli_noise_filter, run_interruptible

with cli_noise_filter():
  status = run_interruptible(command)
sys.exit(status)
"""
  done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)})
  assert done.returncode == 130 and done.stderr == "interrupted\n", done.stderr


def test_ctrl_c_during_a_read_leaves_no_coroutine_to_report_at_exit(tmp_path):
  """A read in flight when Ctrl-C lands leaves orbax's coroutine suspended, held (by
  its event loop) to the interpreter's exit, where closing it printed "Exception
  ignored in: <coroutine ...>" and a traceback after "interrupted": orbax turns the
  GeneratorExit of that close into an Exception. It is closed inside the filter."""
  # A coroutine of an orbax read, as orbax writes it, compiled as a file under orbax/.
  read = (
      "class _Pending:\n"
      "  def __await__(self):\n"
      "    yield\n"
      "async def read_shard():\n"
      "  try:\n"
      "    await _Pending()\n"
      "  except BaseException as e:\n"
      "    raise Exception('Encountered error while reading array index') from e\n")
  code = f"""
ns, held = {{}}, []
exec(compile({read!r}, "/site-packages/orbax/checkpoint/serialization.py", "exec"), ns)

def command():
  coro = ns["read_shard"]()
  coro.send(None)     # suspended inside its await: a read in flight
  held.append(coro)   # held to the interpreter's exit
  raise KeyboardInterrupt
"""
  _assert_command_interrupted_quietly(code, tmp_path)


def test_ctrl_c_inside_a_task_leaves_no_unretrieved_error_to_report_at_exit(tmp_path):
  """Ctrl-C landing inside an asyncio task (orbax's reads run as tasks) leaves the task
  done with the KeyboardInterrupt as its exception; collected at the interpreter's exit
  it logged "Task exception was never retrieved" with a traceback after "interrupted".
  Its exception is retrieved inside the filter."""
  code = """
import asyncio
held = []

async def read():
  await asyncio.sleep(0)
  raise KeyboardInterrupt   # what SIGINT does when it lands in the awaited code

def command():
  loop = asyncio.new_event_loop()
  held.append(loop.create_task(read()))   # held to the interpreter's exit
  loop.run_until_complete(held[0])
"""
  _assert_command_interrupted_quietly(code, tmp_path)


# --- 4. the workdir lock -----------------------------------------------------------------


def _write_lock(workdir: Path, pid: int, host: str, age_s: float = 0.0) -> Path:
  path = workdir / ".lock"
  path.write_text(json.dumps({"pid": pid, "host": host, "started": time.time() - age_s,
                              "started_at": "then"}))
  os.utime(path, (time.time() - age_s, time.time() - age_s))
  return path


def test_lock_is_exclusive_and_stale_locks_are_taken_over(tmp_path, caplog):
  with WorkdirLock(tmp_path):
    with pytest.raises(WorkdirLockedError, match=rf"pid {os.getpid()} on host"):
      WorkdirLock(tmp_path).acquire()
  assert not (tmp_path / ".lock").exists()   # released

  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  _write_lock(tmp_path, dead.pid, socket.gethostname())
  with caplog.at_level("WARNING", logger="experiments"), WorkdirLock(tmp_path) as lock:
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
  assert "stale lock" in caplog.text and "no longer running" in caplog.text

  _write_lock(tmp_path, 1, "elsewhere", age_s=60)
  with pytest.raises(WorkdirLockedError, match="host elsewhere.*new --workdir"):
    WorkdirLock(tmp_path).acquire()
  _write_lock(tmp_path, 1, "elsewhere", age_s=OTHER_HOST_STALE_S + 60)
  with WorkdirLock(tmp_path):
    pass


def test_analysis_lock_is_exclusive_and_separate_from_the_training_lock(tmp_path):
  with WorkdirLock(tmp_path), AnalysisLock(tmp_path):   # analyze may read a training run
    with pytest.raises(WorkdirLockedError, match=rf"another analyze \(pid {os.getpid()}"):
      AnalysisLock(tmp_path).acquire()
  assert not (tmp_path / ".analyze.lock").exists() and not (tmp_path / ".lock").exists()
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  (tmp_path / ".analyze.lock").write_text(json.dumps(
      {"pid": dead.pid, "host": socket.gethostname(), "started": 0, "started_at": "then"}))
  with AnalysisLock(tmp_path) as lock:   # a stale one is taken over
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()


@pytest.mark.slow
def test_second_training_in_the_same_workdir_exits_2(tmp_path):
  workdir = tmp_path / "run"
  first = subprocess.Popen(
      [sys.executable, "-m", "experiments", "train", f"--config={SMOKE}",
       f"--workdir={workdir}", "--config.train.steps=100000", "--config.train.progress=False"],
      cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 60
    while not (workdir / ".lock").exists():
      assert first.poll() is None and time.time() < deadline, "the first training never started"
      time.sleep(0.1)
    second = _cli("train", f"--config={SMOKE}", f"--workdir={workdir}",
                  "--config.train.progress=False", timeout=120)
    assert second.returncode == 2, second.stderr[-3000:]
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and f"pid {first.pid}" in lines[-1]
    assert "Traceback" not in second.stderr
    # Once in the loop (a step's metrics written: the signal handler is installed by
    # then), SIGTERM saves, stops and releases the lock. The file alone exists earlier.
    metrics = workdir / "metrics.jsonl"
    while not (metrics.exists() and b"train/loss" in metrics.read_bytes()):
      assert first.poll() is None and time.time() < deadline + 60, "the first training died"
      time.sleep(0.1)
  finally:
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=120)
  assert first.returncode in (0, 130)   # the CLI exits 130 for "stopped by a signal"
  assert not (workdir / ".lock").exists()


# --- 5. a failed save --------------------------------------------------------------------


def test_failed_save_is_clear_and_keeps_the_previous_step(tmp_path, smoke_config, monkeypatch):
  from experiments.jobs import run_train as train

  workdir = tmp_path / "run"
  real_save = Checkpointer.save

  def save(self, step, **kwargs):
    if step == 2:
      # What a full disk leaves: a half-written orbax temporary step, then the error.
      half = self.directory / "2.orbax-checkpoint-tmp-1234" / "params"
      half.mkdir(parents=True)
      (half / "part").write_bytes(b"\0" * 10)

      def fail(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

      monkeypatch.setattr(self._manager, "save", fail)
    return real_save(self, step, **kwargs)

  monkeypatch.setattr(Checkpointer, "save", save)
  with pytest.raises(CheckpointSaveError) as e:
    train(smoke_config(steps=2, ckpt_every=1, eval_every=2, async_checkpoint=False), workdir)
  message = str(e.value)
  assert "step 2" in message and "No space left" in message and "step 1" in message
  assert not list((workdir / "checkpoints").glob("*tmp*"))
  assert not (workdir / ".lock").exists()
  monkeypatch.undo()
  with run_checkpointer(workdir, create=False) as ckpt:
    assert ckpt.latest_step() == 1
  assert restore(workdir)[1].restored_step == 1


def test_async_save_failure_surfaces_as_checkpoint_error(tmp_path, monkeypatch):
  import numpy as np

  with Checkpointer(tmp_path, async_save=True) as ckpt:
    ckpt.save(1, params={"w": np.ones(2, np.float32)})
    ckpt.wait()

    def fail():
      raise RuntimeError("write failed") from OSError(errno.EROFS, "Read-only file system")

    ckpt.save(2, params={"w": np.ones(2, np.float32)})
    real_wait = ckpt._manager.wait_until_finished
    real_wait()
    monkeypatch.setattr(ckpt._manager, "wait_until_finished", fail)
    with pytest.raises(CheckpointSaveError, match=r"step 2 .*Read-only file system"):
      ckpt.wait()
    monkeypatch.setattr(ckpt._manager, "wait_until_finished", real_wait)


def _read_only_prefix(directory: Path) -> list[str] | None:
  """A command prefix under which `directory` is read-only (a read-only bind mount in a
  private mount namespace), or None where this machine cannot make one."""
  script = ('mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && '
            '! touch "$0/.probe" 2>/dev/null && exec "$@"')
  prefix = ["unshare", "-m", "sh", "-c", script, str(directory)]
  try:
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
  except (FileNotFoundError, subprocess.TimeoutExpired):
    return None
  return prefix if probe.returncode == 0 else None


def _cli_read_only(directory: Path, *args):
  prefix = _read_only_prefix(directory)
  if prefix is None and os.geteuid() != 0:
    directory.chmod(0o555)   # enough for a non-root user
    try:
      return _cli(*args, timeout=300)
    finally:
      directory.chmod(0o755)
  if prefix is None:
    pytest.skip("this machine cannot make a read-only directory for root (no mount "
                "namespaces); the simulated ENOSPC/EROFS tests above still run")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": ""}
  return subprocess.run([*prefix, sys.executable, "-m", "experiments", *args], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300)


_RESUME_SMOKE_RUN = ("--config.train.steps=3", "--config.train.ckpt_every=1",
                     "--config.train.eval_every=2", "--config.train.progress=False",
                     "--config.train.allow_config_change=True")


def test_read_only_checkpoints_dir_fails_the_save_clearly(smoke_run_copy):
  """A real read-only directory (not a simulated error): the save of step 3 fails with one
  `error:` line, nothing half-written is left, and step 2 is still what restores."""
  workdir, _ = smoke_run_copy
  done = _cli_read_only(workdir / "checkpoints", "train", f"--config={SMOKE}",
                        f"--workdir={workdir}", *_RESUME_SMOKE_RUN)
  assert done.returncode == 2, done.stderr[-3000:]
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "could not save checkpoint step 3" in errors[0], done.stderr
  assert "step 2) is intact" in errors[0]
  assert "Traceback" not in done.stderr and "ERROR:absl" not in done.stderr, done.stderr
  # Besides the run's own timestamped progress lines, only the error line.
  other = [line for line in done.stderr.splitlines()
           if not line.startswith("error:") and not re.match(r"\d\d:\d\d:\d\d ", line)]
  assert not other, done.stderr
  assert run_checkpointer(workdir, create=False).all_steps() == [1, 2]
  assert restore(workdir)[1].restored_step == 2
  assert "Read-only file system" in (workdir / "checkpoints.log").read_text()


def test_read_only_workdir_is_refused_up_front(smoke_run_copy):
  workdir, _ = smoke_run_copy
  done = _cli_read_only(workdir, "train", f"--config={SMOKE}", f"--workdir={workdir}",
                        *_RESUME_SMOKE_RUN)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.startswith("error: cannot write in the workdir"), done.stderr
  assert len(done.stderr.splitlines()) == 1, done.stderr
  assert run_checkpointer(workdir, create=False).all_steps() == [1, 2]


@pytest.mark.slow
def test_eval_while_train_saves_every_two_steps_always_finds_a_step(tmp_path, capsys):
  """A `train` saving every 2 steps and keeping 2 deletes steps while `eval` reads them;
  each `eval` still ends with the newest readable step (tests/experiments/
  test_checkpoint.py forces the deletion mid-read deterministically). The `eval`s run in
  this process, beside the training's: after the first they reuse its compiles."""
  import warnings

  from experiments.cli import run_main

  workdir = tmp_path / "run"
  trainer = subprocess.Popen(
      [sys.executable, "-m", "experiments", "train", f"--config={SMOKE}", f"--workdir={workdir}",
       "--config.train.steps=100000", "--config.train.ckpt_every=2",
       "--config.train.max_to_keep=2", "--config.train.eval_every=100000",
       "--config.train.progress=False"],
      cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 180
    while not (workdir / "checkpoints").is_dir() or len(
        [p for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]) < 2:
      assert trainer.poll() is None and time.time() < deadline, "the training never saved"
      time.sleep(0.2)
    steps = []
    for _ in range(4):
      capsys.readouterr()
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = run_main(["lngram-exp", "eval", f"--workdir={workdir}"])
      stderr = capsys.readouterr().err + "".join(f"{w.message}\n" for w in caught)
      assert status == 0, stderr[-3000:]
      assert "unreadable" not in stderr and "Traceback" not in stderr, stderr
      steps.append(int(re.search(r"checkpoint step (\d+) of", stderr).group(1)))
    assert steps == sorted(steps) and trainer.poll() is None   # it ran alongside throughout
  finally:
    trainer.send_signal(signal.SIGTERM)
    trainer.wait(timeout=120)
  assert not list((workdir / "checkpoints").glob("*.corrupt*"))


# --- 6. a missing step is missing, not corrupt ---------------------------------------------


def test_missing_step_is_not_called_corrupt(smoke_run):
  workdir, _ = smoke_run
  with pytest.raises(MissingStepError, match=r"no checkpoint step 7 .*have \[1, 2\]") as e:
    restore(workdir, step=7)
  assert not isinstance(e.value, CorruptCheckpointError)
  assert "corrupt" not in str(e.value) and "unreadable" not in str(e.value)


# --- kill -9 in the middle of a checkpoint write, then resume -----------------------------


@pytest.mark.slow
def test_kill_9_during_a_save_then_resume_is_bit_identical(tmp_path, smoke_config):
  from experiments.jobs import run_train as train
  from experiments.jobs.lm.evaluate import evaluate_run

  steps = 12
  config = smoke_config(steps=steps, ckpt_every=1, eval_every=steps, max_to_keep=3)
  reference = tmp_path / "reference"
  train(config, reference)

  workdir = tmp_path / "killed"
  child = subprocess.Popen(
      [sys.executable, "-m", "experiments", "train", f"--config={SMOKE}",
       f"--workdir={workdir}", f"--config.train.steps={steps}", "--config.train.ckpt_every=1",
       f"--config.train.eval_every={steps}", "--config.train.max_to_keep=3",
       "--config.train.progress=False"],
      cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  checkpoints = workdir / "checkpoints"
  deadline = time.time() + 90
  try:
    # Kill as soon as a write is in flight (an orbax temporary step exists) after step 3.
    while time.time() < deadline and child.poll() is None:
      if checkpoints.is_dir() and any(p.name.isdigit() and int(p.name) >= 3
                                      for p in checkpoints.iterdir()):
        if any(".orbax-checkpoint-tmp" in p.name for p in checkpoints.iterdir()):
          break
      time.sleep(0.002)
  finally:
    child.kill()
    child.wait()
  assert child.returncode == -signal.SIGKILL, "the training ended before it could be killed"
  assert (workdir / ".lock").exists()   # left behind: the next train takes it over

  result = train(config, workdir)
  assert result["step"] == steps
  assert evaluate_run(workdir) == evaluate_run(reference)
