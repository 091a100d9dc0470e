"""Tables and plots of the Lngram reproductions, generated from their run records.

    python -m experiments.tools.report [--root=experiments/results/records]
                                 [--out=experiments/results/lngram]
                                 [--write=experiments/RESULTS.md]

By default reads the records the queue keeps in the repository
(experiments/tools/reproduce/records.py: the few files of each finished run that its numbers come
from, copied out of `runs/repro/...`), so the report regenerates on any checkout;
`--root=runs/repro` (or a smoke queue's root) reads run directories themselves. Reads
every run of `experiments.tools.reproduce.plan()` that has written metrics (stale
directories of an older design are never read) and prints the Markdown of RESULTS.md's
Lngram section: where its numbers come from (provenance.py); the runs still pending; the
summary table of the pre-declared claim family (family.py), each claim a paired contrast
over seeds (experiments/analysis/stats/: the paired t-test with its 95% CI, the exact
sign-flip test, a document-bootstrap CI from the per-document validation losses, Holm over
the family, the minimum detectable effect; a claim worded as non-inferiority tested against
its declared margin, margins.py)
with its verdict computed from those numbers (App. A.5's also says whether any STE run
collapsed, collapse.py); the controls; the same family and controls re-scored without
the validation documents that have a near-duplicate in training (a declared sensitivity
analysis, sensitivity.py); the previous section's
verdicts beside this design's (previous.py); per setting, each arm's
final validation bits per unit (mean ± sd over its finished seeds), memory parameters
(total / active per token, from the config file) and median training tokens/s, plus one
validation-curve plot per setting (PNG under `--out`); then the ID analyses and the
insertion comparison read from `<run>/analysis/*.json`
(`python -m experiments.tools.reproduce analyze`), and the state of PVM's long-answer rerun
(`vlm_long`, with each finished run's item and answer accuracy). Nothing is typed by hand except the
paper's figures and the declared margins and thresholds: rerun this after more runs finish. `--write=FILE` replaces the
generated part of FILE (between its BEGIN and END marker lines) instead of printing it, and
leaves the hand-written text around it as it was.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from experiments.configs import load_config
from experiments.models import lm_config, params
from experiments.tools import reproduce
from experiments.tools.report import sensitivity as report_sensitivity
from experiments.tools.report import vlm as report_vlm
from experiments.tools.report.analyses import id_section, insertion_section
from experiments.tools.report.collect import collect, mean_std
from experiments.tools.report.family import UNIT_OF, summary
from experiments.tools.report.provenance import flag_mismatches, provenance

RESULTS_DIR = Path(__file__).resolve().parents[2]   # experiments/, which holds RESULTS.md


def memory_params(config_spec: str) -> tuple[int, int]:
  """(total, active per token) of the memory branches of a config file's model."""
  config = load_config(f"{reproduce.CONFIGS}/{config_spec}")
  if config.data.get("kind") == "tokens" and not config.model.vocab_size:
    config.model.vocab_size = reproduce.TOKEN_VOCAB   # the token data's vocabulary
  return params.memory_params(lm_config(config))


def table(experiment: str, arms: dict) -> str:
  lines = [f"#### {experiment}", "",
           "| arm | config | final val. bits/unit | seeds done | memory params total / active | "
           "tokens/s |", "|---|---|---:|---|---:|---:|"]
  for name, entry in arms.items():
    done_finals = [s["final"] for s in entry["seeds"].values() if s["final"] is not None]
    done = sorted(seed for seed, s in entry["seeds"].items() if s["final"] is not None)
    running = sorted(seed for seed, s in entry["seeds"].items() if s["final"] is None)
    seeds = ", ".join(map(str, done)) + (f" (running: {running})" if running else "")
    total, active = memory_params(entry["config"])
    speeds = [s["tok_s"] for s in entry["seeds"].values() if s["tok_s"] is not None]
    speed = f"{statistics.median(speeds):.0f}" if speeds else "–"
    lines.append(f"| {name} | `{entry['config']}` | {mean_std(done_finals)} | {seeds or '–'} | "
                 f"{total / 1e6:.3f}M / {active / 1e6:.3f}M | {speed} |")
  return "\n".join(lines)


def plot(experiment: str, arms: dict, out: Path) -> Path | None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, ax = plt.subplots(figsize=(6, 4))
  drawn = False
  for name, entry in arms.items():
    curves = [dict(s["curve"]) for s in entry["seeds"].values() if s["curve"]]
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    if not steps:
      continue
    values = np.array([[c[s] for s in steps] for c in curves])
    mean = values.mean(0)
    ax.plot(steps, mean, marker="o", label=f"{name} ({len(curves)} seeds)")
    if len(curves) > 1:
      ax.fill_between(steps, values.min(0), values.max(0), alpha=0.2)
    drawn = True
  if not drawn:
    plt.close(fig)
    return None
  ax.set_xlabel("step")
  ax.set_ylabel(f"validation bits per {UNIT_OF.get(experiment, 'byte')}")
  ax.set_title(f"{experiment} (band: min–max over seeds)")
  ax.legend(fontsize=7)
  out.mkdir(parents=True, exist_ok=True)
  path = out / f"{experiment}.png"
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return path


def pending_runs(root: Path) -> list[str]:
  """The keys of the queue's runs not finished under `root` (stale ones marked)."""
  return [r.key + (" (stale)" if reproduce.stale(r, root) else "")
          for r in reproduce.plan() if not reproduce.finished(r, root)]


NOTES = {"bytes": "tokens/s: the median over each run's logged intervals on a shared "
                  "machine where other jobs ran at times, so it is not a benchmark; "
                  "`python -m experiments.tools.bench.train` measures every arm side by side "
                  "(BENCHMARKS.md).",
         "tokens": "Bits per unit are bits per TOKEN of the 4,096-id BPE here."}


def report(root: Path, out: Path) -> str:
  results = collect(root)
  pending = pending_runs(root)
  parts = [provenance(results) if results else
           f"No finished run of this design under {root} yet.", ""]
  if pending:
    parts += [f"Runs pending ({len(pending)} of {len(reproduce.plan())}; "
              "`python -m experiments.tools.reproduce run`): " + ", ".join(pending), ""]
  parts += [summary(results, root), ""]
  mismatched = flag_mismatches(results)
  if mismatched:
    parts += [mismatched, ""]
  for experiment, arms in results.items():
    if experiment not in reproduce.SETTINGS:   # the VLM rerun has its own table below
      continue
    # The v3 controls score the deduplicated validation set: their own section below.
    arms = {a: e for a, e in arms.items() if a not in report_sensitivity.V3_ARMS}
    parts.append(table(experiment, arms))
    if experiment in NOTES:
      parts.append("\n" + NOTES[experiment])
    path = plot(experiment, arms, out)
    if path is not None:
      # Links relative to experiments/RESULTS.md, where the section goes.
      link = os.path.relpath(path.resolve(), RESULTS_DIR.resolve())
      parts.append(f"\n![{experiment}]({Path(link).as_posix()})")
    parts.append("")
  parts += [id_section(root), "", insertion_section(root, results), "",
            "#### Declared controls (Reproductions v3)", "",
            reproduce.declared.controls_section(root), "",
            "#### The GPU scale check (declared)", "",
            reproduce.declared.scale_section(root), "",
            report_vlm.vlm_section(root), ""]
  return "\n".join(parts)


BEGIN = "<!-- BEGIN generated by `python -m experiments.tools.report --write` -->"
END = "<!-- END generated -->"


def splice(document: str, generated: str) -> str:
  """`document` with the text between its BEGIN and END marker lines replaced by
  `generated`; refuses a document without exactly one of each, in that order, so a
  regeneration can never drop the hand-written text around the tables."""
  lines = document.splitlines(keepends=True)
  begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
  ends = [i for i, line in enumerate(lines) if line.strip() == END]
  if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
    raise ValueError(f"expected one line {BEGIN!r} and, after it, one line {END!r}; "
                     f"found {len(begins)} and {len(ends)}")
  body = generated.strip("\n") + "\n"
  return "".join(lines[:begins[0] + 1]) + "\n" + body + "\n" + "".join(lines[ends[0]:])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default=str(reproduce.RECORDS),
                      help="the records (default) or a queue's run directories")
  parser.add_argument("--out", default="experiments/results/lngram",
                      help="where the plots go")
  parser.add_argument("--write", default=None, metavar="FILE",
                      help="replace FILE's generated part (e.g. experiments/RESULTS.md) "
                           "instead of printing it")
  ns = parser.parse_args(argv)
  text = report(Path(ns.root), Path(ns.out))
  if ns.write is None:
    print(text)
    return
  target = Path(ns.write)
  try:
    updated = splice(target.read_text(), text)
  except ValueError as error:
    parser.error(f"{target}: {error}")
  target.write_text(updated)
  print(f"wrote the generated part of {target}")


if __name__ == "__main__":
  main()
