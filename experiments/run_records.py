"""Run records: the small files of a finished run that its results are read from, kept
where the repository keeps them.

A run directory holds checkpoints and TensorBoard logs and stays out of version control;
what a report reads from it is a few small files. `write_record(workdir, record_dir)`
copies those into `record_dir` (the same names, `analysis/` included) and adds
`provenance.json` (the corpus content hash and the run's wall time, which the run
directory tells through a 100 KB manifest and file times that a copy does not keep). A
record is then read exactly like the run directory it came from, so a result outlives
the machine that trained it. Files a run does not write (a VLM run has no
`metrics.jsonl`, an LM run no `metrics.json`) are simply absent from its record.

Imports nothing from the experiment stack: `experiments.reproduce` maps its runs to
record directories, `experiments.results` reads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# What the reproduction report reads from a run directory.
FILES = ("repro.json",            # the queue's stamp: design version, steps
         "metrics.jsonl",         # an LM run's metrics rows, its validation curve
         "eval_per_doc.json",     # the final evaluation per validation document
         "metrics.json",          # a VLM run's stage history and final evaluation
         "attention_decay.json")  # a VLM base's visual attention against position
ANALYSIS_GLOB = "analysis/*.json"  # `lngram-exp analyze` results of an LM run
PROVENANCE = "provenance.json"
MANIFEST = "corpus_manifest.json"


def run_provenance(workdir: Path) -> dict:
  """{"corpus", "wall_s"} of a run: its record's provenance.json, else from the run
  directory itself, the corpus content hash of its manifest (written at the start) and
  the time from that manifest to its last metrics row (pauses of resumed runs included);
  None where unknown."""
  workdir = Path(workdir)
  try:
    kept = json.loads((workdir / PROVENANCE).read_text())
    return {"corpus": kept.get("corpus"), "wall_s": kept.get("wall_s")}
  except (OSError, ValueError, AttributeError):
    pass
  manifest, metrics = workdir / MANIFEST, workdir / "metrics.jsonl"
  if not manifest.exists():
    return {"corpus": None, "wall_s": None}
  try:
    corpus = json.loads(manifest.read_text()).get("content_sha256")
  except (OSError, ValueError, AttributeError):
    corpus = None
  wall = metrics.stat().st_mtime - manifest.stat().st_mtime if metrics.exists() else None
  return {"corpus": corpus, "wall_s": wall}


def record_files(workdir: Path) -> list[Path]:
  """The files of `workdir` a record keeps, relative to it, that exist."""
  workdir = Path(workdir)
  found = [Path(name) for name in FILES if (workdir / name).is_file()]
  found += sorted(p.relative_to(workdir) for p in workdir.glob(ANALYSIS_GLOB) if p.is_file())
  return found


def _write_atomic(path: Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_bytes(data)
  os.replace(tmp, path)


def write_record(workdir: Path, record_dir: Path) -> list[str]:
  """Copies `workdir`'s record files into `record_dir` (replacing older copies: a record
  mirrors its run's latest output) with its provenance; returns the names written.
  Each file is replaced whole, so a reader never sees half of one."""
  workdir, record_dir = Path(workdir), Path(record_dir)
  if workdir.resolve() == record_dir.resolve():
    raise ValueError(f"a record of {workdir} cannot be written into itself")
  names = record_files(workdir)
  if not names:
    raise FileNotFoundError(f"{workdir} holds none of the files a record keeps "
                            f"({', '.join(FILES)}, {ANALYSIS_GLOB})")
  written = []
  for name in names:
    data = (workdir / name).read_bytes()
    target = record_dir / name
    if not (target.is_file() and target.read_bytes() == data):
      _write_atomic(target, data)
      written.append(str(name))
  provenance = json.dumps(run_provenance(workdir), sort_keys=True) + "\n"
  if (workdir / MANIFEST).exists():   # else the record keeps what it had
    target = record_dir / PROVENANCE
    if not (target.is_file() and target.read_text() == provenance):
      _write_atomic(target, provenance.encode())
      written.append(PROVENANCE)
  return written
