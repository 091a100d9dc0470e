"""What a run directory says about its run: stamped (`stamp`, STAMP), stale, finished,
recorded (its record under `records_root`, and whether a retrain still equals it), and
the XLA flags and CPUs it trained under."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.tools.reproduce import records as run_records
from experiments.tools.reproduce.design import (
  DESIGN,
  STAMP,
  VLM,
  YOUNG_STEPS,
  Run,
  plan,
  records_root,
  run_dir,
  steps,
  token_data,
)
from experiments.trainer.writers import bits_value, read_metrics


def stamped_steps(run: Run, root: Path | None = None) -> int:
  """The steps the run's stamp says it trains (a smoke queue's 4), else `steps(run)`."""
  try:
    return int(json.loads((run_dir(run, root) / STAMP).read_text()).get("steps", steps(run)))
  except (OSError, ValueError):
    return steps(run)


def stale(run: Run, root: Path | None = None) -> bool:
  """The directory exists with training output but not this design's stamp."""
  workdir = run_dir(run, root)
  if not (workdir / "metrics.jsonl").exists() and not (workdir / "checkpoints").exists():
    return False
  try:
    return json.loads((workdir / STAMP).read_text()).get("design") != DESIGN
  except (OSError, ValueError):
    return True


def final_eval(rows: list[dict], steps: int) -> float | None:
  """Validation bits per unit of the metrics row at step `steps`, if the run got there:
  `eval/bits_per_byte` or `eval/bits_per_token` (a token run recorded before that name
  holds its bits per token as `eval/bits_per_byte`; experiments/trainer/writers.py)."""
  for row in rows:
    if row.get("step") == steps and bits_value(row, "eval") is not None:
      return bits_value(row, "eval")
  return None


def final_bits_per_byte(run: Run, root: Path | None = None) -> float | None:
  """Validation bits per unit of the run's final evaluation; None until it is written
  (or when the directory is stale)."""
  if stale(run, root):
    return None
  return final_eval(read_metrics(run_dir(run, root)), stamped_steps(run, root))


def finished(run: Run, root: Path | None = None) -> bool:
  """The final evaluation's metrics row exists (the loop writes it last), not stale; a
  VLM run's `metrics.json` (its stage's final evaluation, written after training)."""
  if run.experiment == VLM:
    return not stale(run, root) and (run_dir(run, root) / "metrics.json").exists()
  return final_bits_per_byte(run, root) is not None


def recorded(run: Run, root: Path | None = None) -> bool:
  """The run's record (experiments/tools/reproduce/records.py) says it finished, under this design."""
  return finished(run, records_root(root))


def record(run: Run, root: Path | None = None) -> list[str]:
  """Writes (or refreshes) the record of a run finished under `root`; the names written.
  A record is kept, and says so, where the run trained again differs from it (`diverged`);
  it then takes only the analyses it lacks, named as a twin's (`add_twin_analyses`)."""
  if not finished(run, root):
    return []
  differs = diverged(run, root)
  if differs:
    print(f"record {run.key} kept: {differs}", flush=True)
    base = next((run_dir(r, root) for r in plan() if r.key == run.after), None)
    return run_records.add_twin_analyses(run_dir(run, root), run_dir(run, records_root(root)),
                                         differs, base, YOUNG_STEPS)
  return run_records.write_record(run_dir(run, root), run_dir(run, records_root(root)))


def diverged(run: Run, root: Path | None = None) -> str | None:
  """Why a recorded run trained again under `root` is not its record, or None: the first
  logged number that differs (`run_records.first_difference`). Runs that started from
  the record's checkpoint would not share the new one, so neither the record nor the
  pairing may silently change; delete the record (and those runs') to accept the new run."""
  if not recorded(run, root):
    return None
  return difference_line(*run_records.first_difference(run_dir(run, root),
                                                        run_dir(run, records_root(root))))


def difference_line(compared: int, first: dict | None) -> str | None:
  """`run_records.first_difference`'s result as the line `list` and the queues print;
  None where nothing differs."""
  if first is None:
    return None
  return (f"trained again, it differs from its record at step {first['step']} "
          f"({first['key']} {first['run']!r} vs {first['record']!r}; {compared} logged steps "
          f"agreed before it): another CPU or other XLA flags (stamp `cpus`, `xla_flags`)?")


def refresh_record(run: Run, root: Path) -> None:
  """After a run trained (or was analysed): its record, written or refreshed (`record`),
  and a line saying what was written."""
  written = record(run, root)
  if written:
    print(f"record {run.key}: {', '.join(written)} -> {run_dir(run, records_root(root))}",
          flush=True)


def status(run: Run, root: Path) -> str:
  """done (finished here, or recorded: trained elsewhere), stale, part or todo."""
  if stale(run, root):
    return "stale"
  if finished(run, root) or recorded(run, root):
    return "done"
  return "part" if (run_dir(run, root) / "metrics.jsonl").exists() else "todo"


def _stamped_list(workdir: Path, key: str) -> list[str]:
  try:
    values = json.loads((Path(workdir) / STAMP).read_text()).get(key, [])
  except (OSError, ValueError, AttributeError):
    return []
  return [str(v) for v in values] if isinstance(values, list) else []


def xla_flags_seen(workdir: Path) -> list[str]:
  """The XLA_FLAGS every attempt at the run trained under, from its stamp ([] if none
  recorded). Float rounding follows XLA's thread count, so runs trained (or resumed) under
  different flags are not bit-comparable; the report prints what the runs used."""
  return _stamped_list(workdir, "xla_flags")


def cpus_seen(workdir: Path) -> list[str]:
  """The CPUs (`cpu_signature`) every attempt at the run trained on ([] if none recorded):
  XLA's CPU kernels follow the vector ISA, so one config and seed can end differently on
  another machine (DESIGN: the byte baseline's seed 0 trained on two machines)."""
  return _stamped_list(workdir, "cpus")


def cpu_signature() -> str:
  """This machine's CPU as far as float rounding goes: its model name and the widest
  vector ISA XLA can use (avx512 / avx2 / the architecture otherwise)."""
  import platform

  model, flags = "", set()
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = line.partition(":")
      if key.strip() == "model name" and not model:
        model = value.strip()
      elif key.strip() in ("flags", "Features") and not flags:
        flags = set(value.split())
  except OSError:
    pass
  isa = next((name for name, flag in (("avx512", "avx512f"), ("avx2", "avx2"))
              if flag in flags), platform.machine())
  return f"{model or platform.processor() or platform.machine()} ({isa})"


def prepared_val_fraction(root: Path) -> float | None:
  """The validation fraction the token data under `root` was prepared with (its
  manifest's split), or None where none is prepared."""
  try:
    manifest = json.loads((token_data(root) / "manifest.json").read_text())
    return float(manifest["split"]["val_fraction"])
  except (OSError, ValueError, KeyError, TypeError):
    return None
