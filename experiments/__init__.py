"""Experiments built on lngram_jax and pvm_jax: the byte decoder LM, a tiny VLM, data,
one training loop, checkpoints, the `lngram-exp` CLI.

Papers: "Lngram v2: Latent N-Gram Memory with Interpretable Discrete
Representations" (and v1, "Lngram: N-gram Conditional Memory in Latent Space",
arXiv 2605.24869); "Persistent Visual Memory: Sustaining Perception for Deep
Generation in LVLMs", arXiv 2605.00814. Layout and conventions: DESIGN.md §6.

Every run (LM, VLM stage 0, Stage I, Stage II) trains through
`experiments.jobs.run_train` (over the task-agnostic `experiments.trainer.train`)
and restores with `experiments.restore`. The models
and decoding (`experiments.models`) import nothing from the data stack, so they
also run where grain is not installed.
"""

# `from experiments import restore` is the notebook entry point. It is
# resolved on first use so that `import experiments` (the CLI's `configs`,
# usage errors) does not pay for importing orbax and jax.
__all__ = ["restore"]


def __getattr__(name):
  if name == "restore":
    from experiments.jobs.restore import restore
    return restore
  raise AttributeError(f"module 'experiments' has no attribute {name!r}")
