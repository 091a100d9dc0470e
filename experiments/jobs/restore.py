"""`restore(workdir)`: rebuild a trained model (LM, tiny VLM or Qwen3-VL) from its
checkpoint alone.

The notebook entry point (`from experiments import restore`). The model
config comes from the checkpoint's JSON, so no config file or command line is
needed; the module is its job's `build(saved, rngs)` (experiments/jobs/registry.py);
parameters land on one device (default the first CPU device) whatever trained them.
Follows the flax recipe: `nnx.eval_shape` for an abstract module, orbax restore into
its abstract parameter state, `nnx.merge`. Needs neither grain nor an optimizer.

A run may train a wrapper around its model (the stage-0 `CellPretrainer`
adds a classifier head); the saved config says so (`trained`), the whole
trained tree is restored and the model inside it returned.

Restoring reads only: nothing is written into the run directory, and no
process-wide hook or root-logger handler is left behind. The full text of read
failures goes to `log_file` if one is named (else the one-line warnings and
errors are all there is).
"""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from experiments.jobs.registry import job, saved_job_name
from experiments.trainer.checkpoint import CheckpointError, run_checkpointer


def build_trained(saved: dict, rngs: nnx.Rngs):
  """(trained module, model inside it) that a saved config describes (its job's `build`)."""
  return job(saved_job_name(saved)).build(saved, rngs)


def run_job_name(workdir) -> str:
  """"lm", "vlm" or "qwen3vl": the job of the newest readable checkpoint config."""
  with run_checkpointer(workdir, async_save=False, create=False) as ckpt:
    _, saved = ckpt.newest_readable_config(warn=False)
  return saved_job_name(saved)


def restore_module(workdir, step: int | None = None, *, device=None, log_file=None):
  """(model, saved config JSON, step restored) of the run in `workdir`; see `restore`.

  The third value is the step actually restored (the CLI's `eval`/`sample`
  print it); a missing `step` raises `MissingStepError` listing the steps on disk.
  """
  ckpt = run_checkpointer(workdir, async_save=False, create=False, log_file=log_file)
  try:
    if step is None:
      found_step, saved = ckpt.newest_readable_config()
    else:
      found_step, saved = step, ckpt.read_json(step, "config")
    device = device or jax.devices("cpu")[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    abstract_trained, _ = nnx.eval_shape(lambda: build_trained(saved, nnx.Rngs(0)))
    graphdef, abstract_params, rest = nnx.split(abstract_trained, nnx.Param, ...)
    abstract_params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        nnx.to_pure_dict(abstract_params))
    # LM runs written before the branch slots kept Lngram under blocks/<i>/lngram.
    legacy = saved_job_name(saved) == "lm" and "lngram_layers" in saved["model"]
    if legacy:
      abstract_params = _rename_block_key(abstract_params, "memory", "lngram")
    restored = ckpt.restore_latest_valid(abstract_params=abstract_params, step=step,
                                         skip=ckpt.unreadable_configs)
    if legacy:
      restored["params"] = _rename_block_key(restored["params"], "lngram", "memory")
  finally:
    ckpt.close()
  if (restored["config"].get("model"), restored["config"].get("trained")) != (
      saved["model"], saved.get("trained")):
    raise CheckpointError(
        f"checkpoint step {restored['step']} in {ckpt.directory} was made by a "
        f"different model config than step {found_step}; pass step= explicitly.")
  if jax.tree.leaves(rest):
    # Non-Param state (if any) is not saved: the constructor rebuilds it.
    with jax.default_device(device):
      rest = nnx.state(build_trained(saved, nnx.Rngs(0))[0], nnx.Not(nnx.Param))
  trained = nnx.merge(graphdef, restored["params"], rest)
  model = trained.model if (saved.get("trained") or {}).get("wrapper") else trained
  return model, restored["config"], int(restored["step"])


def _rename_block_key(params: dict, old: str, new: str) -> dict:
  blocks = {i: {new if k == old else k: v for k, v in block.items()}
            for i, block in params.get("blocks", {}).items()}
  return {**params, "blocks": blocks} if blocks else params


def restore(workdir, step: int | None = None, *, device=None, log_file=None):
  """Returns (model, config) of the run in `workdir`.

  Args:
    workdir: the run directory given to `train` (holds `checkpoints/`).
    step: a checkpoint step; None takes the newest valid one (a corrupt newest
      checkpoint is skipped with a warning).
    device: where the parameters go; default the first CPU device.
    log_file: a file of yours for the full text of read failures (default none).

  Returns:
    model: a `DecoderLM` (LM runs), a `VLM` (tiny-VLM runs) or a `Qwen3VL`
      (Qwen3-VL runs) with the trained parameters.
    config: the run's experiment config (ml_collections.ConfigDict); the
      model config is `model.config`, and `config.restored_step` is the
      checkpoint step actually restored (the newest VALID one when `step` is
      None: a corrupt newest step is skipped with a warning).
  """
  model, saved, found = restore_module(workdir, step, device=device, log_file=log_file)
  config = ml_collections.ConfigDict(saved["experiment"])
  config.restored_step = int(found)
  return model, config
