"""`restore(workdir)`: rebuild a trained model from its checkpoint alone.

The notebook entry point (`from experiments import restore`). The model
config comes from the checkpoint's JSON, so no config file or command line is
needed; parameters land on one CPU device whatever trained them. Follows the
flax recipe: `nnx.eval_shape` for an abstract model, orbax restore into its
abstract parameter state, `nnx.merge`. Needs neither grain nor an optimizer.
"""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from experiments.checkpoint.manager import Checkpointer, CheckpointError
from experiments.models import DecoderLM, LMConfig


def restore(workdir, step: int | None = None, *, device=None):
  """Returns (model, config) of the run in `workdir`.

  Args:
    workdir: the run directory given to `train` (holds `checkpoints/`).
    step: a checkpoint step; None takes the newest valid one (a corrupt newest
      checkpoint is skipped with a warning).
    device: where the parameters go; default the first CPU device.

  Returns:
    model: a `DecoderLM` with the trained parameters.
    config: the run's experiment config (ml_collections.ConfigDict); the
      model config is `model.config`.
  """
  ckpt = Checkpointer(workdir, async_save=False, create=False)
  if step is None:
    found_step, saved = ckpt.newest_readable_config()
  else:
    found_step, saved = step, ckpt.read_json(step, "config")
  lm_cfg = LMConfig.from_dict(saved["model"])
  device = device or jax.devices("cpu")[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  abstract_model = nnx.eval_shape(lambda: DecoderLM(lm_cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract_model, nnx.Param)
  abstract_params = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
      nnx.to_pure_dict(abstract_params))
  restored = ckpt.restore_latest_valid(abstract_params=abstract_params, step=step)
  if restored["config"]["model"] != saved["model"]:
    raise CheckpointError(
        f"checkpoint step {restored['meta']['step']} in {ckpt.directory} was made by a "
        f"different model config than step {found_step}; pass step= explicitly.")
  model = nnx.merge(graphdef, restored["params"])
  config = ml_collections.ConfigDict(restored["config"]["experiment"])
  return model, config
