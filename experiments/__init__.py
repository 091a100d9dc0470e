"""Experiments built on lngram_jax: decoder LM, data, training, checkpoints, CLI.

The model and decoding (`experiments.models`) import nothing from the data
stack, so they also run where grain is not installed.
"""

# `from experiments import restore` is the notebook entry point. It is
# resolved on first use so that `import experiments` (the CLI's `configs`,
# usage errors) does not pay for importing orbax and jax.
__all__ = ["restore"]


def __getattr__(name):
  if name == "restore":
    from experiments.checkpoint import restore
    return restore
  raise AttributeError(f"module 'experiments' has no attribute {name!r}")
