"""`analyze_lm(workdir, restore=)`: the Lngram ID analyses of an LM run (`lngram-exp analyze`).

    lngram-exp analyze --workdir=runs/lm_lngram \
        --which=utilisation,id_knn,associations,distributed,stability,injection

Reads the run's checkpoint at `step` (default: the newest readable one) through
`restore` (the CLI restores: experiments/jobs/restore.py),
collects the position records ONCE (reference: a seeded sample of the training
files; held-out: the validation files; the same positions for every reader) and
runs the chosen analyses (on a run trained on token data, over tokens: its training
documents, a seeded sample, and its validation documents; experiments/analysis/
token_docs.py and records.py). Each writes `<name>.json`, `<name>.md` (its table) and
`<name>.png` into `<workdir>/analysis/`; the records go to `records_<split>.npz` so
the record analyses can be rerun without the model (`records.load_records`).
Every file is written atomically, every result (and the records' meta) holds
`source`: the checkpoint step, its config digest and the seeds; the whole run
holds `<workdir>/.analyze.lock` (experiments/analysis/output.py).

  utilisation   Table 9: effective codes, normalised entropy, top code, dead codes
  id_knn        Table 1: H_model / Q_route / ID-KNN / nuisance / surface readers, rho,
                the permutation test
  associations  App. C.2: single-code associations replicated on held-out files
  distributed   App. C.3: S_dict and AP over the top-m routes
  stability     App. B.2: address stability between adjacent kept checkpoints
  injection     App. B.3: the Lngram delta disabled per layer and everywhere

stability and injection run their own windows over `n_docs` held-out files
(every byte of a window: n-gram addresses read the previous codes; a token run's
windows hold tokens of its validation documents).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import ml_collections

from experiments.analysis import output

log = logging.getLogger("experiments")

LM_ANALYSES = ("utilisation", "id_knn", "associations", "distributed", "stability",
               "injection")
RECORD_ANALYSES = ("utilisation", "id_knn", "associations", "distributed")
# The record analyses' protocol: 2 = near-duplicate files removed from both splits, a
# per-file cap on positions, permutations within stratum x current byte, rho CIs.
# Results without it (protocol 1) came from the uncapped, undeduplicated records.
RECORD_PROTOCOL = 2


def _progress(name: str):
  def report(done: int, total: int) -> None:
    log.info("analyze %s: %d/%d", name, done, total)
  return report


def _source_line(src: dict | None) -> str:
  if not src:
    return ""
  return (f"Checkpoint step {src['step']}, config sha256 {src['config_sha256'][:16]}, "
          f"seed {src['seed']} (training seed {src['train_seed']}).\n\n")


def write_result(out_dir, name: str, result: dict, module, source: dict | None = None) -> dict:
  """`<name>.json`, `.md` and `.png` of one result in `out_dir`, each written atomically,
  the result with `source` (output.source) when given; returns their paths."""
  from experiments.analysis.id_readers import jsonable
  from experiments.analysis.plots import write_png
  out_dir = Path(out_dir)
  result = jsonable(result if source is None else {**result, "source": source})
  text = module.markdown(result)
  paths = {"json": out_dir / f"{name}.json", "md": out_dir / f"{name}.md",
           "png": out_dir / f"{name}.png"}
  # The PNG and table first, the JSON (what readers and `reproduce` look for) last.
  output.atomic_write(paths["png"], lambda tmp: write_png(tmp, name, result, module, text))
  output.write_text(paths["md"], f"# {name}\n\n{_source_line(source)}{text.rstrip()}\n")
  output.write_json(paths["json"], result)
  return paths


def per_file_cap(max_positions: int | None, max_file_share: float | None) -> int | None:
  """Positions one file may give: `max_file_share` of `max_positions` (at least 1)."""
  if max_file_share is None or max_positions is None:
    return None
  if not 0 < max_file_share <= 1:
    raise ValueError(f"analyze: max_file_share={max_file_share} must be in (0, 1].")
  return max(1, int(max_file_share * max_positions))


def collect(model, config, *, max_positions: int | None, seed: int, n_reference: int,
            progress: bool, out_dir=None, source: dict | None = None, dedup: bool = False,
            max_file_share: float | None = None, workdir=None):
  """(reference, held-out) PositionRecords of the run's corpus, and the corpus (its
  `val_docs` make the stability / injection windows); saved into `out_dir`
  (atomically, `source` in their meta) when given. `dedup`: near-duplicate files
  removed from both splits (`records.split_files`); `max_file_share`: no file gives
  more than that share of a split's positions. A run on token data (`workdir`'s
  `token_data.json`, or `data.kind="tokens"`): its documents, read with the tokenizer
  the run keeps in `workdir` (`token_docs`)."""
  from experiments.analysis import records, token_docs
  unreadable = 0
  if token_docs.is_token_run(workdir, config):
    corpus = token_docs.TokenRunData(workdir, config)
    ref_files, held_files, unreadable = token_docs.split_docs(
        corpus, n_reference=n_reference, seed=seed, dedup=dedup)
  else:
    from experiments.data.corpus import corpus_spec, load_corpus
    corpus = load_corpus(corpus_spec(config))
    ref_files, held_files = records.split_files(corpus, n_reference=n_reference, seed=seed,
                                                dedup=dedup)
  seq_len = min(int(config.data.seq_len), model.config.max_len)
  cap = per_file_cap(max_positions, max_file_share)
  ref = records.collect_records(model, ref_files, split="reference", seq_len=seq_len,
                                max_positions=max_positions, seed=seed, progress=progress,
                                max_per_file=cap)
  held = records.collect_records(model, held_files, split="heldout", seq_len=seq_len,
                                 max_positions=max_positions, seed=seed,
                                 concept_names=ref.concept_names(), progress=progress,
                                 max_per_file=cap)
  for r in (ref, held):
    r.meta["dedup"] = bool(dedup)
  if unreadable:   # token documents whose ids do not read back as their text
    log.warning("analyze: %d token documents skipped: their ids do not read back as their "
                "text with the run's tokenizer.", unreadable)
  if out_dir is not None:
    for r in (ref, held):
      if source is not None:
        r.meta["source"] = source
      records.save_records(r, Path(out_dir) / f"records_{r.split}.npz")
  return ref, held, corpus


def _without_empty_records(which, ref, held) -> tuple:
  """`which` less the record analyses when a split has no position (a run too small, or
  of texts that are not Python source, which the semantic targets read: DESIGN.md §9.1):
  one warning naming them and why; a one-line ValueError if nothing else was asked."""
  if ref.num_positions and held.num_positions:
    return tuple(which)
  skipped = [n for n in which if n in RECORD_ANALYSES]
  rest = tuple(n for n in which if n not in RECORD_ANALYSES)
  why = (f"the records hold {ref.num_positions} reference / {held.num_positions} held-out "
         f"positions ({ref.skipped_files} / {held.skipped_files} documents skipped: they do "
         "not parse as Python source, whose spans are the semantic targets)")
  if not rest:
    raise ValueError(f"analyze: {','.join(skipped)} cannot run on this run: {why}; these "
                     "analyses need a run on Python source (stability and injection do not).")
  log.warning("analyze: %s skipped (nothing written for them): %s.", ",".join(skipped), why)
  return rest


def analyze_lm(workdir, *, restore, which=LM_ANALYSES, step: int | None = None,
               max_positions: int | None = 4000, seed: int = 0, n_reference: int = 256,
               max_queries: int | None = 2000, n_perm: int = 500, n_docs: int = 48,
               windows_per_doc: int = 2, n_boot: int = 10_000, stability_steps=None,
               progress: bool = True, dedup: bool = True, max_file_share: float | None = 0.05,
               perm_strata: str = "nuisance_byte", n_rho_boot: int = 500) -> dict:
  """Runs the chosen analyses on an LM run; returns {name: result}, each with `source`.

  Parameters
  ----------
  workdir : the run directory (`lngram-exp train --workdir`).
  restore : `restore(step) -> (model, saved config JSON, step restored)` of this run's
    checkpoints (the CLI passes `experiments.jobs.restore.restore_module` bound to it;
    restore(None) is the newest readable one).
  which : names from `LM_ANALYSES`.
  step : the checkpoint analysed (default: the newest readable one); a step not on
    disk raises `MissingStepError` naming the kept ones.
  max_positions : sampled positions per split for the position records.
  seed : every sample (files, positions, queries, permutations, bootstrap).
  n_reference : training files drawn as the reference split.
  max_queries, n_perm : held-out queries scored by the readers; permutations of the test.
  n_docs, windows_per_doc : held-out files and windows per file of stability / injection.
  n_boot : document bootstrap resamples of the stability CIs.
  stability_steps : the kept checkpoints stability compares, in order (default: all kept
    up to the analysed step, adjacent pairs); e.g. (100, 300) for one 200-step interval.
  dedup : remove near-duplicate files from both splits (experiments/data/dedup.py).
  max_file_share : no file gives more than this share of a split's positions (None: no cap).
  perm_strata : the permutation test's cells (`id_readers.PERM_STRATA`).
  n_rho_boot : query-file bootstrap resamples of the rho CIs (0: none).
  """
  which = tuple(dict.fromkeys(which))
  unknown = set(which) - set(LM_ANALYSES)
  if unknown:
    raise ValueError(f"analyze: unknown LM analyses {sorted(unknown)}; "
                     f"choose from {','.join(LM_ANALYSES)}.")
  from experiments.analysis.id_readers import PERM_STRATA
  if perm_strata not in PERM_STRATA:   # before anything is restored or collected
    raise ValueError(f"analyze: perm_strata={perm_strata!r} is not one of {PERM_STRATA}.")
  per_file_cap(max_positions, max_file_share)
  workdir = Path(workdir).expanduser().absolute()
  if not (workdir / "checkpoints").is_dir():   # before the lock is written into it
    raise FileNotFoundError(f"no checkpoint directory {workdir / 'checkpoints'}.")
  with output.analysis_lock(workdir):
    return _analyze_lm(workdir, restore, which, step, max_positions=max_positions, seed=seed,
                       n_reference=n_reference, max_queries=max_queries, n_perm=n_perm,
                       n_docs=n_docs, windows_per_doc=windows_per_doc, n_boot=n_boot,
                       stability_steps=stability_steps, progress=progress, dedup=dedup,
                       max_file_share=max_file_share, perm_strata=perm_strata,
                       n_rho_boot=n_rho_boot)


def _analyze_lm(workdir: Path, restore, which, step, *, max_positions, seed, n_reference,
                max_queries, n_perm, n_docs, windows_per_doc, n_boot, stability_steps,
                progress, dedup, max_file_share, perm_strata, n_rho_boot) -> dict:
  from experiments.analysis import probe

  model, saved, step = restore(step)
  if saved.get("kind", "lm") != "lm":
    raise ValueError(f"analyze_lm: {workdir} is a {saved.get('kind')} run, not an LM run.")
  probe.lngram_layers(model)   # a clear error for a model without Lngram
  config = ml_collections.ConfigDict(saved["experiment"])
  out_dir = workdir / "analysis"
  out_dir.mkdir(parents=True, exist_ok=True)
  output.remove_leftovers(out_dir)   # of an earlier analyze killed mid-write
  src = output.source(saved, step, seed)
  log.info("analyze %s: checkpoint step %d, analyses %s", workdir, step, ",".join(which))
  results, modules, t0 = {}, {}, time.time()

  corpus = None
  if set(which) & set(RECORD_ANALYSES):
    ref, held, corpus = collect(model, config, max_positions=max_positions, seed=seed,
                                n_reference=n_reference, progress=progress, out_dir=out_dir,
                                source=src, dedup=dedup, max_file_share=max_file_share,
                                workdir=workdir)
    log.info("analyze: records of %d reference / %d held-out positions (%d / %d files "
             "skipped) in %.0fs", ref.num_positions, held.num_positions, ref.skipped_files,
             held.skipped_files, time.time() - t0)
    which = _without_empty_records(which, ref, held)
    _record_analyses(results, modules, which, ref, held, max_queries=max_queries, seed=seed,
                     n_perm=n_perm, progress=progress, perm_strata=perm_strata,
                     n_rho_boot=n_rho_boot)
  if {"stability", "injection"} & set(which):
    windows = _windows(workdir, config, model, corpus, n_docs=n_docs,
                       windows_per_doc=windows_per_doc, seed=seed)
    _window_analyses(results, modules, which, workdir, restore, model, step, windows,
                     n_boot=n_boot, seed=seed, stability_steps=stability_steps)

  protocol = {"version": RECORD_PROTOCOL, "dedup": bool(dedup),
              "max_file_share": max_file_share, "perm_strata": perm_strata,
              "n_rho_boot": n_rho_boot}
  for name in which:
    if name in RECORD_ANALYSES:
      results[name] = {**results[name], "protocol": protocol}
    results[name] = {**results[name], "source": src}
    write_result(out_dir, name, results[name], modules[name], source=src)
  log.info("analyze: wrote %s (.json, .md, .png) into %s in %.0fs", ",".join(which), out_dir,
           time.time() - t0)
  return results


def _record_analyses(results: dict, modules: dict, which, ref, held, *, max_queries, seed,
                     n_perm, progress, perm_strata, n_rho_boot) -> None:
  """The analyses of the position records (RECORD_ANALYSES in `which`), into `results`
  and `modules` (each result's module, whose `markdown` writes its table)."""
  from experiments.analysis import associations, distributed, id_readers, utilisation
  if "utilisation" in which:
    results["utilisation"], modules["utilisation"] = utilisation.utilisation(ref, held), utilisation
  if "id_knn" in which or "distributed" in which:
    # distributed takes AP_H and AP_N from the id_knn readers on the same queries.
    readers = id_readers.id_knn(ref, held, max_queries=max_queries, seed=seed,
                                n_perm=n_perm if "id_knn" in which else 0, progress=progress,
                                perm_strata=perm_strata,
                                n_boot=n_rho_boot if "id_knn" in which else 0)
    if "id_knn" in which:
      results["id_knn"], modules["id_knn"] = readers, id_readers
  if "associations" in which:
    results["associations"] = associations.associations(ref, held)
    modules["associations"] = associations
  if "distributed" in which:
    results["distributed"] = distributed.distributed(ref, held, max_queries=max_queries,
                                                     seed=seed, readers=readers)
    modules["distributed"] = distributed


def _windows(workdir: Path, config, model, corpus, *, n_docs, windows_per_doc, seed):
  """The held-out windows stability and injection run (the records' corpus when they
  read one; a token run's validation documents' tokens)."""
  from experiments.analysis import probe
  if corpus is None:
    from experiments.analysis import token_docs
    if token_docs.is_token_run(workdir, config):   # its validation documents' tokens
      corpus = token_docs.TokenRunData(workdir, config)
    else:
      from experiments.data.corpus import corpus_spec, load_corpus
      corpus = load_corpus(corpus_spec(config))
  seq_len = min(int(config.data.seq_len), model.config.max_len)
  return probe.file_windows(corpus.val_docs, seq_len=seq_len, max_docs=n_docs,
                            windows_per_doc=windows_per_doc, seed=seed)


def _window_analyses(results: dict, modules: dict, which, workdir: Path, restore, model,
                     step: int, windows, *, n_boot, seed, stability_steps) -> None:
  """stability (between kept checkpoints up to `step`) and injection over `windows`,
  into `results` and `modules`."""
  from experiments.analysis import injection, stability
  from experiments.trainer.checkpoint import run_checkpointer
  if "stability" in which:
    with run_checkpointer(workdir, async_save=False, create=False) as ckpt:
      steps = [s for s in ckpt.all_steps() if s <= step]
    if stability_steps:
      wanted = sorted({int(s) for s in stability_steps})
      missing = [s for s in wanted if s not in steps]
      if missing or len(wanted) < 2:
        raise ValueError(f"analyze stability: --stability_steps={wanted} must name two or "
                         f"more kept checkpoints up to step {step}; kept: {steps}.")
      steps = wanted
    if len(steps) < 2:
      log.info("analyze stability: skipped, the run keeps one checkpoint (steps %s)", steps)
      results["stability"] = {"steps": steps, "rows": [], "n_docs": windows.n_docs,
                              "n_positions": windows.n_positions, "bits": None,
                              "n_boot": n_boot, "seed": seed, "primary": "fixed",
                              "note": "needs two or more kept checkpoints"}
    else:
      models = [restore(s)[0] for s in steps[:-1]]
      models.append(model if steps[-1] == step else restore(steps[-1])[0])
      results["stability"] = stability.address_stability(
          models, steps, windows, n_boot=n_boot, seed=seed, progress=_progress("stability"))
    modules["stability"] = stability
  if "injection" in which:
    results["injection"] = injection.injection(model, windows, progress=_progress("injection"))
    modules["injection"] = injection
