"""What the Lngram reproduction runs have written, read back for the report.

`root` is a queue's run directories or their records (experiments/tools/reproduce/records.py: the same
layout and files, checkpoints left out), which read alike.

`collect(root)` gathers, for every run of `experiments.tools.reproduce.plan()` that has
written metrics (and is not stale: a directory of an older queue design is never
mixed in), its final validation bits per unit (from its per-document evaluation,
`eval_per_doc.json`, when written at the final step, else its metrics), the
per-document sums, its validation curve, its median training tokens/s and where
its numbers come from (corpus hash, training time, XLA flags); `finals` and `mean_std` summarise
an arm's seeds; `read_analysis` reads one
`<run>/analysis/<name>.json` that `lngram-exp analyze` wrote. `experiments.tools.report`
(the tables) and `experiments.tools.report.analyses` (the analysis sections) both read
runs through this module, so neither imports the other's internals. (The plots the
report draws go to the folder `experiments/results/`, which this module does not
touch.)
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from experiments.data.validation import read_per_doc
from experiments.tools import reproduce
from experiments.tools.reproduce.records import run_provenance
from experiments.trainer.writers import bits_value, read_metrics


def eval_curve(rows: list[dict]) -> list[tuple[int, float]]:
  """(step, validation bits per unit) of the metrics rows: `eval/bits_per_byte` of a byte
  run, `eval/bits_per_token` of a token run, or `eval/bits_per_byte` of a token run
  recorded before that name (experiments/trainer/writers.py `bits_value`)."""
  return [(int(r["step"]), bits_value(r, "eval")) for r in rows
          if bits_value(r, "eval") is not None]


def tokens_per_s(rows: list[dict]) -> float | None:
  # The first logged interval includes compilation: skip it.
  values = [float(r["train/tokens_per_s"]) for r in rows if "train/tokens_per_s" in r][1:]
  return statistics.median(values) if values else None


def collect(root: Path) -> dict:
  """{experiment: {name: {"config", "seeds": {seed: {"final", "per_doc", "curve", "tok_s",
  "xla_flags", "cpus", "corpus", "train_s"}}}}} of the runs under `root` that have written
  metrics; "per_doc" is the final evaluation per validation document (experiments/data/validation.py) or None."""
  out: dict = defaultdict(dict)
  runs = reproduce.plan()
  by_key = {r.key: r for r in runs}
  for run in runs:
    workdir = reproduce.run_dir(run, root)
    rows = read_metrics(workdir)
    if not rows or reproduce.stale(run, root):
      continue
    entry = out[run.experiment].setdefault(run.name, {"config": run.config, "seeds": {}})
    # An inserted run's curve continues its backbone's: steps on the model's own clock.
    offset = reproduce.step_offset(run, by_key)
    curve = [(step + offset, value) for step, value in eval_curve(rows)]
    last = reproduce.stamped_steps(run, root)
    final = reproduce.final_eval(rows, last)
    per_doc = read_per_doc(workdir)
    if per_doc is None or per_doc["step"] != last or final is None:
      per_doc = None
    else:   # the same evaluation, summed in float64 per document
      final = float(per_doc["bits_per_unit"])
    entry["seeds"][run.seed] = {"final": final, "per_doc": per_doc,
                                "curve": curve, "tok_s": tokens_per_s(rows),
                                "xla_flags": reproduce.xla_flags_seen(workdir),
                                "cpus": reproduce.cpus_seen(workdir),
                                **run_provenance(workdir)}
  return out


def finals(results: dict, experiment: str, arm: str, seed: int | None = None) -> list[float]:
  """The finished seeds' final bits per unit of an arm of `collect`'s result (only `seed`'s,
  if given)."""
  entry = results.get(experiment, {}).get(arm)
  if entry is None:
    return []
  return [s["final"] for k, s in entry["seeds"].items()
          if s["final"] is not None and (seed is None or k == seed)]


def mean_std(values: list[float], digits: int = 4) -> str:
  """"mean ± sample std" to `digits` decimals; one value alone; "–" for none."""
  if not values:
    return "–"
  if len(values) == 1:
    return f"{values[0]:.{digits}f}"
  return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def read_analysis(workdir: Path, name: str) -> tuple[dict | None, str]:
  """(result, "") of `<workdir>/analysis/<name>.json`, or (None, why it is pending)."""
  path = Path(workdir) / "analysis" / f"{name}.json"
  if not path.exists():
    return None, f"pending: {name} not run on {Path(workdir).name} " \
                 "(python -m experiments.tools.reproduce analyze)"
  try:
    return json.loads(path.read_text()), ""
  except (OSError, ValueError) as e:
    return None, f"pending: {path.name} unreadable ({type(e).__name__})"
