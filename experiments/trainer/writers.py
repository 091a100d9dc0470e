"""Run outputs: metrics as JSON lines + TensorBoard events, a progress bar, loss plots.

Keys are flat and slash-named (`train/loss`, `eval/bits_per_byte`,
`lngram/1/route_mass`). `metrics.jsonl` is the source of truth; TensorBoard
events (via tensorboardX, if installed) and `loss_curve.png` are views of it.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss_curve.png"
log = logging.getLogger("experiments")


class MetricsWriter:
  """Appends `{"step": s, **scalars}` lines and mirrors them to TensorBoard."""

  def __init__(self, workdir, *, resume_step: int = 0):
    self.workdir = Path(workdir)
    self.path = self.workdir / METRICS_FILE
    self.workdir.mkdir(parents=True, exist_ok=True)
    # A resumed run forgets what its predecessor logged after the checkpoint.
    keep = [r for r in read_metrics(self.workdir) if r["step"] <= resume_step]
    self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    self._file = open(self.path, "a")  # noqa: SIM115 — closed in close()
    self._tb = _tensorboard_writer(self.workdir / "tensorboard")

  def write(self, step: int, scalars: dict) -> None:
    scalars = {k: float(v) for k, v in scalars.items()}
    self._file.write(json.dumps({"step": int(step), **scalars}) + "\n")
    self._file.flush()
    if self._tb is not None:
      for key, value in scalars.items():
        self._tb.add_scalar(key, value, global_step=int(step))

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()


class NullWriter:
  """What processes other than process 0 write: nothing (process 0 logs for all)."""

  def write(self, step: int, scalars: dict) -> None:
    del step, scalars

  def close(self) -> None:
    pass


def _tensorboard_writer(logdir: Path):
  try:
    from tensorboardX import SummaryWriter
  except ImportError:
    log.warning("tensorboardX is not installed: no TensorBoard events are written.")
    return None
  return SummaryWriter(logdir=str(logdir), flush_secs=10)


def read_metrics(workdir) -> list[dict]:
  path = Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Progress:
  """A one-line progress bar: step, loss, tokens/s, ETA.

  On a terminal the line is redrawn in place; otherwise (CI logs, pipes) one
  line is printed every `every` steps.
  """

  def __init__(self, total: int, *, start: int = 0, tokens_per_step: int, every: int,
               enabled: bool = True, stream=None):
    self.total, self.start, self.every = total, start, max(every, 1)
    self.tokens_per_step = tokens_per_step
    self.enabled = enabled
    self.stream = stream or sys.stderr
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self._t0 = time.perf_counter()
    self._timed_from = start  # the first step's compile time is excluded
    self._last_len = 0

  def update(self, step: int, loss: float) -> None:
    if not self.enabled or not (self.tty or step % self.every == 0 or step == self.total):
      return
    now = time.perf_counter()
    if step == self.start + 1:
      self._t0, self._timed_from = now, step
    rate = (step - self._timed_from) / max(now - self._t0, 1e-9)
    tok_s = rate * self.tokens_per_step
    eta = (self.total - step) / rate if rate > 0 else math.inf
    width = 24
    filled = int(width * step / max(self.total, 1))
    line = (f"step {step:>{len(str(self.total))}}/{self.total} "
            f"[{'#' * filled}{'.' * (width - filled)}] loss {loss:.4f} | "
            f"{tok_s / 1e3:7.1f}k tok/s | ETA {_duration(eta)}")
    if self.tty:
      pad = " " * max(self._last_len - len(line), 0)
      self.stream.write("\r" + line + pad)
      self._last_len = len(line)
    else:
      self.stream.write(line + "\n")
    self.stream.flush()

  def close(self) -> None:
    if self.enabled and self.tty:
      self.stream.write("\n")
      self.stream.flush()


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "--:--"
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def plot_curves(workdir) -> Path | None:
  """Writes loss_curve.png: train and validation bits per byte vs step (LM runs), else
  the train loss (and GRPO's mean reward)."""
  rows = read_metrics(workdir)
  if not rows:
    return None
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    log.warning("matplotlib is not installed: no loss plot is written.")
    return None
  fig, ax = plt.subplots(figsize=(7, 4))
  curves = (("train/bits_per_byte", "train"), ("eval/bits_per_byte", "validation"))
  ylabel = "bits per byte"
  if not any("train/bits_per_byte" in r for r in rows):
    curves, ylabel = (("train/loss", "train loss"), ("train/reward", "mean reward")), "value"
  for key, label in curves:
    pts = [(r["step"], r[key]) for r in rows if key in r]
    if pts:
      steps, values = zip(*pts, strict=True)
      ax.plot(steps, values, marker="o" if label == "validation" else None, label=label)
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  ax.set_title(Path(workdir).name)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  path = Path(workdir) / PLOT_FILE
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
