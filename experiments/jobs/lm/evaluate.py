"""Evaluating a finished (or running) LM run from its checkpoint."""

from __future__ import annotations


def evaluate_run(workdir, *, step: int | None = None, max_batches: int | None = None) -> dict:
  """Validation bits per unit (and memory-branch metrics) of a checkpoint in `workdir`:
  `eval/bits_per_byte` for a run on a byte corpus, `eval/bits_per_token` on token data.

  Data settings come from the run's saved config; `max_batches` overrides
  data.eval_batches. An LM command: a VLM run is evaluated by `analyze`.
  """
  return evaluate_checkpoint(workdir, step=step, max_batches=max_batches)[0]


def evaluate_checkpoint(workdir, *, step: int | None = None, max_batches: int | None = None,
                        mesh: dict | None = None) -> tuple[dict, int]:
  """(`evaluate_run`'s metrics, the checkpoint step they come from).

  `mesh`: a `mesh` block ({"data": 2, "table": 4}; experiments/trainer/placement.py)
  to evaluate on a device mesh, as training does; None: one device.
  """
  import ml_collections

  from experiments.data import eval_batches, load_corpus, validation  # needs grain
  from experiments.data.corpus import corpus_spec
  from experiments.data.tokens import run as token_run
  from experiments.jobs.checks import check_fits
  from experiments.jobs.lm.task import evaluate_model
  from experiments.jobs.restore import restore_module
  from experiments.models.layout import placement_rules
  from experiments.trainer import placement

  model, saved, used_step = restore_module(workdir, step)
  require_lm(saved, workdir, "eval")
  config = ml_collections.ConfigDict(saved["experiment"])
  dc = config.data
  unit = "byte"
  if token_run.data_kind(config) == "tokens":   # the manifest's validation split
    batches, unit = token_run.eval_data(config, workdir, max_batches), "token"
  else:   # the per-document set when the run has data.val_doc_cap (validation.py)
    corpus = load_corpus(corpus_spec(config))
    batches, _ = validation.config_batches(
        corpus.val_docs, corpus.val_paths, dc, max_batches=max_batches,
        default=lambda: eval_batches(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size,
                                     max_batches=max_batches or dc.eval_batches))
  if not mesh:
    return evaluate_model(model, batches, unit=unit), used_step
  device_mesh = placement.make_train_mesh(mesh)
  check_fits(device_mesh, batch_size=dc.batch_size, seq_len=dc.seq_len,
             memory=model.config.memory)
  placement.place_model(model, device_mesh, rules=placement_rules(model))
  return evaluate_model(model, batches, mesh=device_mesh, unit=unit), used_step


def require_lm(saved: dict, workdir, command: str) -> None:
  """`eval` and `sample` read text runs; a VLM run says so clearly."""
  from experiments.jobs.registry import saved_job_name
  if saved_job_name(saved) != "lm":
    raise ValueError(
        f"lngram-exp {command} is an LM command, and {workdir} is a VLM run; use "
        f"`lngram-exp analyze --workdir={workdir}` (accuracy by length, attention decay, "
        "LogitLens, grounding) instead.")
