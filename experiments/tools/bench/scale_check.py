"""GPU scale check: the declared family `scale_check` at d 512 x 8 layers, seeds that add up.

    python -m experiments.tools.bench.scale_check --data=pkg:transformers --seeds=0,1 --out=gpu_out/scale
    python -m experiments.tools.bench.scale_check --dry_run --out=/tmp/scale   # CPU, seconds (CI)
    DATA=pkg:transformers SEEDS=0,1 OUT=... bash experiments/tools/bench/scale_check.sh   # the GPU entry

Decides on an accelerator what the CPU reproduction reversed (experiments/RESULTS.md):
the family `FAMILIES["scale_check"]` of experiments/tools/reproduce/design.py, declared
before its runs (Lngram v2 r16 against the memory-free baseline, against v1 at matched
active parameters and against Engram; paired t over seeds, Holm over the three). Each
arm of `ARMS` trains at `SCALE`: d 512, 8 layers (memory in layers 1 and 4, shallow and
intermediate), 32 rows x 512 bytes = 16,384 bytes a step, 1,000 steps, bfloat16 compute
with float32 parameters; the same seed gives every arm the same backbone init and the
same batches. The arms are matched by the project's parameter accounting
(experiments/models/params.py), printed as a table before training:
  baseline    no memory;
  lngram_r16  Lngram v2 r16 (experiments/configs/lm_lngram.py's defaults);
  lngram_v1   v1 at v2 r16's active parameters: v1's own d -> d router alone would hold
              262k a layer at d 512 (1.5x v2 r16's active count), so its router is v2's
              (16 routes x 4 bits, `n_routes`) and its row width Dm the one whose active
              count is closest (`match_v1`: Dm 8, 168.7k vs 176.2k a layer);
  engram      Engram with v2 r16's table parameters (`match_engram`: its smallest table
              base within 0.05%).

Data (`--data`, default $SCALE_CHECK_DATA, else the embedded standard library): training
text of >= MIN_TRAIN_BYTES (30 MB) that a run sees less than once: steps x batch x
seq_len rows against the training split's rows, refused at one epoch or more (the
standard library's ~11 MB training split is too small at this scale). `--data` is a
folder of text files or `pkg:NAME`, the source folder of the installed Python package
NAME (e.g. transformers, which the GPU image holds: 51.0 MB of training text in
5.24, read 0.32 times a run); its content sha256 (the corpus manifest's) is
recorded, and the family pairs only runs on the same data. Validation: the capped
per-document set of experiments/data/validation.py (32 KB of every validation file, at
most 512 KB) without the files that have a near-duplicate in the training split
(`data.dedup_validation`), per-document losses kept.

Every arm x seed that finishes is RECORDED like a run of the CPU queue
(experiments/tools/reproduce/records.py): its run directory `<out>/runs/<arm>_s<seed>`
(repro.json stamp with the declaration's digest, data and validation, parameters and
device; metrics.jsonl; eval_per_doc.json; the corpus manifest) is copied to
`<records>/<arm>_s<seed>` (default experiments/results/records/scale_check; the shell
entry writes under $OUT and packs them into one archive). An arm x seed already recorded
under this declaration (in the repository's records or `--records`) is skipped, so
separate GPU runs of ~15 minutes add seeds: 4 arms x 2 seeds a run, seed by seed
(`--seeds`), until the declared seeds are in. `python -m experiments.tools.reproduce
declared` prints the family's section from the records.

The deadline (`--budget-s` from the start) is checked before each run: an arm is skipped
when the previous compiles say it could not even compile in what is left, and after its
first timed steps when its projected end passes the deadline; an arm already running
stops at the deadline ("truncated", its curve kept, no record). A persistent compilation
cache (`--cache-dir`) makes the second seed of an arm (and a rerun) skip compiling.
`<out>/scale_check.json` is rewritten after every arm.

Imports no grain (the GPU machine has none): batches are packed here with
`experiments.data.packing` (numpy).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

from experiments.data import validation
from experiments.data.corpus import corpus_spec, load_corpus, write_manifest
from experiments.data.packing import epoch_order, num_rows, pack_row
from experiments.tools.bench.scale_check_arms import ARMS, arm_configs, param_markdown, param_table
from experiments.tools.bench.scale_check_train import train_arm
from experiments.tools.reproduce import records as run_records
from experiments.tools.reproduce.design import DECLARED, FAMILIES, RECORDS, declaration_digest

FAMILY = "scale_check"
SCALE_DESIGN = 2          # 1: the one-seed check on the retired two-file validation
# The scale-up: the backbone, the rows, the schedule (the arms' memory configs are their own).
SCALE = dict(model=dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64,
                        ffn_dim=1536, max_len=512, dtype="bfloat16", param_dtype="float32"),
             memory_layers=(1, 4), seq_len=512, batch_size=32, steps=1000, lr=1e-3,
             warmup_steps=100, log_every=25, eval_every=250, max_files=0)
SMOKE = dict(model=dict(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                        ffn_dim=64, max_len=32, dtype="bfloat16", param_dtype="float32"),
             memory_layers=(1,), seq_len=32, batch_size=2, steps=4, lr=1e-3, warmup_steps=1,
             log_every=2, eval_every=4, max_files=6, val_doc_cap=256)
MIN_TRAIN_BYTES = 30_000_000
SCALE_RECORDS = Path(RECORDS) / FAMILY


# --- data ---------------------------------------------------------------------------------


def resolve_data(spec: str) -> tuple[str, dict]:
  """(the folder `data.path` reads, "" for the standard library; what it is): `spec` is
  "" (the embedded standard library), a folder, or `pkg:NAME` (an installed package's
  source folder, its version recorded)."""
  if not spec:
    return "", {"spec": "stdlib", "python": platform.python_version()}
  if spec.startswith("pkg:"):
    name = spec[4:]
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
      raise ValueError(f"scale_check: --data={spec}: no installed package {name!r}.")
    try:
      version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      version = None
    return str(list(found.submodule_search_locations)[0]), {"spec": spec, "version": version}
  if not Path(spec).is_dir():
    raise ValueError(f"scale_check: --data={spec!r} is not a folder.")
  return spec, {"spec": "folder"}


class Rows:
  """Packed rows of the corpus: the training stream in the seed's epoch order."""

  def __init__(self, corpus, seq_len: int, seed: int):
    self.seq_len, self.seed = seq_len, seed
    self.train = corpus.train_docs
    self.lengths = np.asarray([d.size for d in self.train], np.int64)
    self.rows_per_epoch = num_rows(int(self.lengths.sum()), seq_len)
    self._epoch = None

  def batch(self, step: int, batch_size: int) -> dict:
    rows = []
    for i in range(step * batch_size, (step + 1) * batch_size):
      epoch, r = divmod(i, self.rows_per_epoch)
      if self._epoch is None or self._epoch[0] != epoch:
        self._epoch = (epoch, *epoch_order(self.lengths, self.rows_per_epoch, self.seed, epoch))
      _, order, offsets, perm = self._epoch
      rows.append(pack_row(self.train, order, offsets, int(perm[r]), self.seq_len))
    return {k: np.stack([row[k] for row in rows]) for k in rows[0]}


def epochs(corpus, scale: dict) -> float:
  """The share of an epoch of the training split a run reads."""
  rows = num_rows(corpus.train_bytes, scale["seq_len"])
  return scale["steps"] * scale["batch_size"] / max(rows, 1)


def check_data(corpus, scale: dict, *, smoke: bool) -> None:
  """Refuses data a run reads once or more, and (for the declared runs, not a dry run or
  a run of other steps) under MIN_TRAIN_BYTES."""
  seen = epochs(corpus, scale)
  if seen >= 1.0:
    raise ValueError(
        f"scale_check: {scale['steps']} steps x {scale['batch_size']} rows x "
        f"{scale['seq_len']} bytes read the {corpus.train_bytes:,} training bytes "
        f"{seen:.2f} times; pass --data=<a folder or pkg:NAME of >= "
        f"{MIN_TRAIN_BYTES // 1_000_000} MB of text> (the standard library is too small).")
  if not smoke and corpus.train_bytes < MIN_TRAIN_BYTES:
    raise ValueError(
        f"scale_check: the training split holds {corpus.train_bytes:,} bytes, under the "
        f"declared {MIN_TRAIN_BYTES:,}; pass --data=<a folder or pkg:NAME of >= "
        f"{MIN_TRAIN_BYTES // 1_000_000} MB of text>.")


# --- the check ----------------------------------------------------------------------------


def recorded(records: list[Path], key: str, data_sha: str,
             smoke: bool = False) -> tuple[bool, str | None]:
  """(recorded under this declaration on this data, why it cannot be recorded here): a
  record of `key` (<arm>_s<seed>) in any of `records` under the declared digest (a dry
  run's records count for dry runs only)."""
  for base in records:
    stamp_path = Path(base) / key / "repro.json"
    try:
      stamp = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
      continue
    if ((stamp.get("declared") or {}).get(FAMILY) != DECLARED[FAMILY]
        or bool(stamp.get("smoke")) != smoke):
      continue
    if not (Path(base) / key / validation.PER_DOC_FILE).is_file():
      continue
    if (stamp.get("data") or {}).get("sha256") != data_sha:
      return False, (f"{stamp_path.parent} holds {key} on other data "
                     f"({str((stamp.get('data') or {}).get('sha256'))[:16]}…)")
    return True, None
  return False, None


def run(out_dir, *, smoke: bool = False, budget_s: float = 840.0, arms=None, seeds=(0,),
        steps: int | None = None, cache_dir: str | None = None, data: str = "",
        records: str | None = None, log=print) -> dict:
  """The scale check; returns (and writes) `<out_dir>/scale_check.json`. Records every
  finished arm x seed under `records` (default: SCALE_RECORDS; a dry run's: <out>/records)
  unless `steps` overrides the declared scale."""
  start = time.perf_counter()
  deadline = start + budget_s
  if cache_dir:
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  scale = dict(SMOKE if smoke else SCALE)
  if steps:
    scale["steps"] = steps
  digest = _declared_digest(arms)
  seeds = tuple(int(s) for s in seeds)
  folder, about = resolve_data(data)
  configs = arm_configs(scale, smoke=smoke, seed=seeds[0], names=arms)
  table = param_table(configs)
  log(f"[scale_check] parameters (the project's accounting, all layers):\n"
      f"{param_markdown(table)}")
  first = next(iter(configs.values()))[1]
  first.data.path = folder
  record = steps is None
  corpus, (batches, names), val_about = _load_data(first, scale, about,
                                                   smoke=smoke or not record, log=log)
  data_sha = about["sha256"]
  records_dir = Path(records) if records else (out_dir / "records" if smoke else SCALE_RECORDS)
  searched = [records_dir] + ([] if smoke or records_dir == SCALE_RECORDS else [SCALE_RECORDS])
  result = {"smoke": smoke, "scale": dict(scale), "budget_s": budget_s,
            "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
            "jax": jax.__version__, "python": platform.python_version(),
            "tokens_per_step": scale["seq_len"] * scale["batch_size"], "data": about,
            "validation": val_about, "val_tokens": val_about["units"], "declared": digest,
            "params": table, "seeds": list(seeds), "records": str(records_dir), "arms": []}
  summary_path = out_dir / "scale_check.json"
  compiles: list[float] = []
  for seed in seeds:
    seeded = arm_configs(scale, smoke=smoke, seed=seed, names=arms)
    for name, (spec, config) in seeded.items():
      config.data.path = folder
      key = f"{name}_s{seed}"
      entry = {"arm": name, "seed": seed, "config": spec}
      done, clash = recorded(searched, key, data_sha, smoke) if record else (False, None)
      left = deadline - time.perf_counter()
      if done or clash:
        entry.update(status="recorded" if done else "refused", reason=clash or "")
        log(f"[scale_check] {key}: {'already recorded' if done else clash}")
      elif left <= 0 or (compiles and left < min(compiles)):
        entry.update(status="skipped", reason=f"{left:.0f} s left" + (
            f", the fastest compile took {min(compiles):.0f} s" if compiles else ""))
        log(f"[scale_check] {key}: skipped ({left:.0f} s left)")
      else:
        log(f"[scale_check] {key} ({spec}): {left:.0f} s left")
        workdir = out_dir / "runs" / key
        stamp = _stamp(result, key, name, seed, spec)
        arm = train_arm(name, config, Rows(corpus, scale["seq_len"], seed), (batches, names),
                        scale, deadline=deadline, workdir=workdir, stamp=stamp)
        entry |= arm
        compiles.append(arm["compile_s"])
        if arm["status"] == "done" and record:
          write_manifest(corpus, workdir)
          run_records.write_record(workdir, records_dir / key)
          entry["record"] = str(records_dir / key)
        log(f"[scale_check] {key}: {arm['status']}, final val. "
            f"{arm.get('final_eval_bpb', float('nan')):.4f} bits/byte, "
            f"{arm.get('step_s', float('nan')) * 1e3:.1f} ms/step, compile {arm['compile_s']} s")
      result["arms"].append(entry)
      result["wall_s"] = round(time.perf_counter() - start, 2)
      summary_path.write_text(json.dumps(result, indent=1))
  result["wall_s"] = round(time.perf_counter() - start, 2)
  summary_path.write_text(json.dumps(result, indent=1))
  return result


def _declared_digest(arms) -> str:
  """The family's declaration digest; refuses an unknown arm, and a family that differs
  from its declaration (experiments/tools/reproduce/design.py)."""
  unknown = set(arms or ()) - {n for n, _ in ARMS}
  if unknown:
    raise ValueError(f"scale_check: unknown arms {sorted(unknown)}; "
                     f"choose from {[n for n, _ in ARMS]}.")
  digest = declaration_digest(FAMILIES[FAMILY])
  if digest != DECLARED[FAMILY]:
    raise ValueError(f"scale_check: the family {FAMILY!r} differs from its declaration "
                     f"(digest {digest[:16]}… vs {DECLARED[FAMILY][:16]}…).")
  return digest


def _load_data(first, scale: dict, about: dict, *, smoke: bool, log):
  """(corpus, (validation batches, DocNames), what the validation set is) of the first arm's
  data config; refuses data a run would see once or more (unless `smoke`); adds the data's
  hash, sizes and epochs a run to `about`."""
  corpus = load_corpus(corpus_spec(first))
  check_data(corpus, scale, smoke=smoke)
  data_sha = corpus.manifest["content_sha256"]
  about |= {"sha256": data_sha, "train_bytes": corpus.train_bytes,
            "train_files": len(corpus.train_paths), "val_files": len(corpus.val_paths),
            "epochs": round(epochs(corpus, scale), 4)}
  batches, names = validation.config_batches(
      corpus.val_docs, corpus.val_paths, first.data, default=list,
      train=(corpus.train_paths, corpus.train_docs))
  val_units = int(sum(b["loss_mask"].sum() for b in batches))
  dedup = names.dedup.describe() if names.dedup is not None else {}
  val_about = {"docs": len(names), "units": val_units,
               "largest_share": round(_largest_share(batches, len(names)), 6),
               "removed_count": dedup.get("count", 0), "removed": dedup.get("removed", [])}
  log(f"[scale_check] data {about['spec']} sha256 {data_sha[:16]}…: {corpus.train_bytes:,} "
      f"training bytes, {about['epochs']:.2f} epochs a run; validation {len(names)} "
      f"documents, {val_units:,} scored bytes, {val_about['removed_count']} left out as "
      f"near-duplicates of training files")
  return corpus, (batches, names), val_about


def _stamp(result: dict, key: str, name: str, seed: int, spec: str) -> dict:
  """The run directory's repro.json: what a record of this arm x seed was trained under."""
  scale = result["scale"]
  return {"design": SCALE_DESIGN, "key": f"{FAMILY}/{key}", "arm": name, "seed": seed,
          "config": spec, "steps": scale["steps"], "smoke": result["smoke"],
          "declared": {FAMILY: result["declared"]}, "scale": dict(scale),
          "data": result["data"], "validation": result["validation"],
          "params": next(r for r in result["params"] if r["arm"] == name),
          "device": result["device"], "backend": result["backend"],
          "jax": result["jax"], "python": result["python"]}


def _largest_share(batches, n_docs: int) -> float:
  per = np.zeros(n_docs)
  for b in batches:
    for d, m in zip(b["doc"], b["loss_mask"], strict=True):
      if d >= 0:
        per[d] += m.sum()
  return float(per.max() / max(per.sum(), 1.0)) if n_docs else 0.0


def markdown(result: dict) -> str:
  data = result.get("data", {})
  lines = [f"Scale check on {result['device']} ({result['backend']}, jax {result['jax']}): "
           f"{result['tokens_per_step']:,} bytes a step, {result['scale']['steps']} steps, "
           f"data {data.get('spec')} sha256 {str(data.get('sha256'))[:16]}… "
           f"({data.get('train_bytes', 0):,} training bytes, {data.get('epochs', 0):.2f} "
           f"epochs a run), budget {result['budget_s']:.0f} s, wall "
           f"{result.get('wall_s', 0):.0f} s.", "", param_markdown(result["params"]), "",
           "| arm | seed | status | final val. bits/byte | ms/step | compile s |",
           "| --- | ---: | --- | ---: | ---: | ---: |"]
  for a in result["arms"]:
    bpb = a.get("final_eval_bpb")
    step = a.get("step_s")
    lines.append(f"| {a['arm']} | {a['seed']} | {a['status']} | "
                 f"{'–' if bpb is None else f'{bpb:.4f}'} | "
                 f"{'–' if step is None else f'{1e3 * step:.1f}'} | "
                 f"{a.get('compile_s', '–')} |")
  return "\n".join(lines) + "\n"


def _seeds(args) -> tuple[int, ...]:
  if args.seeds:
    return tuple(int(s) for s in args.seeds.split(",") if s.strip())
  return (args.seed,)


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="scale_out", help="output directory")
  parser.add_argument("--dry_run", "--smoke", dest="smoke", action="store_true",
                      help="tiny shapes on a slice of the standard library (CPU, CI)")
  parser.add_argument("--budget-s", type=float, default=840.0,
                      help="deadline, seconds from the start (default 840: a 15-minute slot "
                           "less start-up)")
  parser.add_argument("--arms", default="", help="comma-separated subset of the arms")
  parser.add_argument("--steps", type=int, default=0,
                      help="steps per arm (default: the scale's; another count writes no record)")
  parser.add_argument("--seed", type=int, default=0, help="one seed")
  parser.add_argument("--seeds", default="", help="comma-separated seeds (overrides --seed)")
  parser.add_argument("--data", default=os.environ.get("SCALE_CHECK_DATA", ""),
                      help="training text: a folder, or pkg:NAME (an installed package's "
                           "source); default $SCALE_CHECK_DATA, else the standard library")
  parser.add_argument("--records", default="",
                      help="where the finished arm x seed records go (default "
                           f"{SCALE_RECORDS}; a dry run's: <out>/records)")
  parser.add_argument("--cache-dir", default=os.environ.get("JAX_COMPILATION_CACHE_DIR", ""),
                      help="persistent compilation cache (default $JAX_COMPILATION_CACHE_DIR)")
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    result = run(args.out, smoke=args.smoke, budget_s=args.budget_s,
                 arms=[a for a in args.arms.split(",") if a] or None, seeds=_seeds(args),
                 steps=args.steps or None, cache_dir=args.cache_dir or None, data=args.data,
                 records=args.records or None)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  text = markdown(result)
  (Path(args.out) / "scale_check_table.txt").write_text(text)   # the Markdown tables
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
