"""Run outputs: metrics as JSON lines + TensorBoard events, a progress bar, loss plots.

Keys are flat and slash-named (`train/loss`, `eval/bits_per_byte`,
`lngram/1/route_mass`). An LM run logs its bits in its data's unit, `bits_per_byte` or
`bits_per_token`; token runs from before that rename logged bits per token as
`bits_per_byte`, so `bits_value` and `bits_unit` read either. `metrics.jsonl` is the
source of truth; TensorBoard
events (via tensorboardX, if installed), a Weights & Biases run (when
`train.wandb_project` is set; `WandbRun`) and `loss_curve.png` are views of it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import string
import sys
import time
from pathlib import Path

from experiments.trainer import durable

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss_curve.png"
WANDB_ID_FILE = "wandb_run_id"   # the run's W&B id: a resumed run logs into the same W&B run
WANDB_EXTRA = "pip install 'lngram-jax[track]'"
log = logging.getLogger("experiments")


class MetricsWriter:
  """Appends `{"step": s, **scalars}` lines and mirrors them to TensorBoard (and to
  `wandb`, a `WandbRun`, when given)."""

  def __init__(self, workdir, *, resume_step: int = 0, wandb: WandbRun | None = None):
    self.workdir = Path(workdir)
    self.path = self.workdir / METRICS_FILE
    self.workdir.mkdir(parents=True, exist_ok=True)
    # A resumed run forgets what its predecessor logged after the checkpoint.
    keep = [r for r in read_metrics(self.workdir) if r["step"] <= resume_step]
    durable.write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))
    self._file = open(self.path, "a")  # noqa: SIM115 — closed in close()
    self._tb = _tensorboard_writer(self.workdir / "tensorboard")
    self._wandb = wandb

  def write(self, step: int, scalars: dict) -> None:
    scalars = {k: float(v) for k, v in scalars.items()}
    self._file.write(json.dumps({"step": int(step), **scalars}) + "\n")
    self._file.flush()
    if self._tb is not None:
      for key, value in scalars.items():
        self._tb.add_scalar(key, value, global_step=int(step))
    if self._wandb is not None:
      self._wandb.write(step, scalars)

  def sync(self) -> None:
    """Flushes the lines written so far to the disk (with each checkpoint: a power cut
    then loses no line of a step that a resume starts after)."""
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self, *, failed: bool = False) -> None:
    """Closes the files; `failed`: training ended by an error (the W&B run is marked so)."""
    self.sync()
    self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close(failed=failed)


class NullWriter:
  """What processes other than process 0 write: nothing (process 0 logs for all)."""

  def write(self, step: int, scalars: dict) -> None:
    del step, scalars

  def sync(self) -> None:
    pass

  def close(self, *, failed: bool = False) -> None:
    del failed


def _tensorboard_writer(logdir: Path):
  try:
    from tensorboardX import SummaryWriter
  except ImportError:
    log.warning("tensorboardX is not installed: no TensorBoard events are written.")
    return None
  return SummaryWriter(logdir=str(logdir), flush_secs=10)


# --- Weights & Biases -------------------------------------------------------------------------


def wandb_tags(value) -> list[str]:
  """`train.wandb_tags` as a list: "a,b" (the command line) or a list/tuple of names."""
  if isinstance(value, str):
    return [t.strip() for t in value.split(",") if t.strip()]
  return [str(t).strip() for t in value or () if str(t).strip()]


# Characters W&B refuses in a project name (wandb.init raises a UsageError naming them).
_WANDB_PROJECT_BAD = ("/", "\\", "#", "?", "%", ":")


def _wandb_hint(e, wandb) -> str:
  """What to do about wandb.init's error `e`, by its cause: a usage error (a bad name or
  setting) is fixed in the config; only a failed login or connection needs `wandb
  login` or offline mode, and not when the run is offline already."""
  if isinstance(e, wandb.errors.UsageError):
    return "fix the train.wandb_* field it names"
  if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
    return f"WANDB_MODE={os.environ['WANDB_MODE']} is set; check WANDB_DIR and the W&B setup"
  return "log in with `wandb login`, or set WANDB_MODE=offline (then `wandb sync`)"


def check_wandb(train_config) -> None:
  """Refuses the `train.wandb_*` fields before a run starts, in one line: a project
  without the wandb package, a field of the wrong type. Empty project: W&B is off.
  `lngram-exp train` runs it once, before it touches the run (experiments/cli/
  preflight.py)."""
  project = train_config.get("wandb_project") or ""
  if not project:
    return
  for field in ("wandb_project", "wandb_entity", "wandb_run_name"):
    value = train_config.get(field) or ""
    if not isinstance(value, str):
      raise ValueError(f"train.{field}={value!r} must be a string.")
  bad = [c for c in _WANDB_PROJECT_BAD if c in project]
  if bad:
    entity = (" (to name the entity, set train.wandb_entity)" if "/" in bad else "")
    raise ValueError(f"train.wandb_project={project!r}: a W&B project name cannot hold "
                     f"{' '.join(map(repr, bad))}{entity}; choose a name without "
                     f"{' '.join(_WANDB_PROJECT_BAD)}.")
  tags = train_config.get("wandb_tags") or ""
  if not isinstance(tags, (str, list, tuple)):
    raise ValueError(f"train.wandb_tags={tags!r} must be comma-separated names (a string) "
                     "or a list of them.")
  _import_wandb()


def _import_wandb():
  """The wandb module, or the one-line refusal naming the extra that installs it."""
  try:
    import wandb
  except ImportError:
    raise ValueError(f"train.wandb_project needs wandb: {WANDB_EXTRA}") from None
  return wandb


def flat_config(tree, prefix: str = "") -> dict:
  """A nested config (dict or ConfigDict) as {"block.field": plain value}: str, int,
  float, bool, None, or a list of them (anything else as its str)."""
  flat = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if hasattr(value, "items"):
      flat.update(flat_config(value, name + "."))
    else:
      flat[name] = _plain(value)
  return flat


def _plain(value):
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return str(value)


def _new_run_id() -> str:
  """An id like W&B's own: 8 lowercase letters and digits."""
  alphabet = string.ascii_lowercase + string.digits
  return "".join(secrets.choice(alphabet) for _ in range(8))


class WandbRun:
  """The run's metrics in a Weights & Biases run (process 0 only; `train.wandb_project`).

  The run's id is kept in `<workdir>/wandb_run_id` (written once the W&B run is first
  made; WANDB_RUN_ID, if set then, is the id); a resumed training reads it back and
  continues the same W&B run (`resume="allow"`). W&B's local files go to
  `<workdir>/wandb/` unless WANDB_DIR says otherwise; `train.wandb_entity`,
  `wandb_run_name` and `wandb_tags` are passed only when set, so that W&B's own
  environment variables (WANDB_MODE=offline, WANDB_ENTITY, WANDB_NAME, WANDB_TAGS, ...)
  apply. `config`: the run's config (the W&B run's config, flattened). The fields are
  checked before the run (`check_wandb`); without the wandb package the run is refused
  here in the same line.
  """

  def __init__(self, workdir, train_config, config: dict | None = None):
    wandb = _import_wandb()
    workdir = Path(workdir)
    id_file = workdir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else ""
    resumed = bool(run_id)
    if not run_id:
      run_id = os.environ.get("WANDB_RUN_ID") or _new_run_id()
    kwargs = {"project": train_config.get("wandb_project"), "id": run_id, "resume": "allow"}
    for key, field in (("entity", "wandb_entity"), ("name", "wandb_run_name")):
      if train_config.get(field):
        kwargs[key] = train_config.get(field)
    tags = wandb_tags(train_config.get("wandb_tags") or "")
    if tags:
      kwargs["tags"] = tags
    # WANDB_DIR read now, not left to W&B: it reads its variables once per process.
    kwargs["dir"] = os.environ.get("WANDB_DIR") or str(workdir)
    try:
      self.run = wandb.init(**kwargs)
    except wandb.errors.Error as e:
      raise ValueError(f"train.wandb_project={kwargs['project']!r}: W&B could not start the "
                       f"run ({' '.join(str(e).split())}); {_wandb_hint(e, wandb)}.") from e
    if not resumed:
      durable.write_text(id_file, run_id + "\n")
    if config:
      self.run.config.update(flat_config(config), allow_val_change=True)
    log.info("W&B run %s (%s) in project %s%s", run_id, "resumed" if resumed else "new",
             kwargs["project"], "" if self.run.url is None else f": {self.run.url}")

  def write(self, step: int, scalars: dict) -> None:
    # W&B's history only moves forward: a step it already holds (a resume from a
    # checkpoint older than the last step logged) keeps the values first logged.
    self.run.log(dict(scalars), step=int(step))

  def close(self, *, failed: bool = False) -> None:
    try:
      self.run.finish(exit_code=1 if failed else 0)
    except Exception as e:   # the training's own outcome matters more
      log.warning("W&B: finishing run %s failed: %s", self.run.id, e)


def read_metrics(workdir) -> list[dict]:
  """The rows of `metrics.jsonl`. A last line cut short (a power cut between two
  checkpoints: the lines after the last one are re-logged by the resume) is left out;
  a bad line before the last is one error line naming the file and line."""
  path = Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  lines = [(i, line) for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
           if line.strip()]
  rows = []
  for k, (i, line) in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      if k == len(lines) - 1:
        break
      raise ValueError(f"{path}, line {i}: not a JSON object ({line[:60]!r}); remove the "
                       "line to read the rest.") from None
  return rows


# The units an LM run's bits are logged in (`<split>/bits_per_<unit>`), the new name first:
# a token run from before the rename logged bits per token as `bits_per_byte`, and one
# resumed since holds both names (old lines, then new ones). A run never logs two units.
BITS_UNITS = ("token", "byte")


def bits_value(row: dict, split: str) -> float | None:
  """The bits per unit of a metrics row's `split` ("train" or "eval"): its
  `bits_per_token`, else its `bits_per_byte`; None when it holds neither."""
  for unit in BITS_UNITS:
    key = f"{split}/bits_per_{unit}"
    if key in row:
      return float(row[key])
  return None


def bits_unit(rows: list[dict]) -> str | None:
  """"token" when the rows hold any `*/bits_per_token` (then their `bits_per_byte`
  values are bits per token too, logged before the rename), "byte" when they hold
  `*/bits_per_byte` alone, None when they hold no bits."""
  keys = {k for r in rows for k in r}
  for unit in BITS_UNITS:
    if f"train/bits_per_{unit}" in keys or f"eval/bits_per_{unit}" in keys:
      return unit
  return None


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
  """Writes loss_curve.png: train and validation bits per byte (token) vs step (LM runs
  on byte (token) data; `bits_unit`), else the train loss (and GRPO's mean reward)."""
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
  if any(bits_value(r, "train") is not None for r in rows):
    curves = (("train", lambda r: bits_value(r, "train")),
              ("validation", lambda r: bits_value(r, "eval")))
    ylabel = f"bits per {bits_unit(rows)}"
  else:
    curves = (("train loss", lambda r: r.get("train/loss")),
              ("mean reward", lambda r: r.get("train/reward")))
    ylabel = "value"
  for label, read in curves:
    pts = [(r["step"], read(r)) for r in rows if read(r) is not None]
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
