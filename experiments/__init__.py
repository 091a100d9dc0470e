"""Experiments built on lngram_jax: decoder LM, data, training, checkpoints, CLI.

The model and decoding (`experiments.models`) import nothing from the data
stack, so they also run where grain is not installed.
"""

# `restore` (experiments.checkpoint) is re-exported here once it exists:
# `from experiments import restore` is the notebook entry point.
