"""Experiments built on lngram_jax and pvm_jax: the decoder LM, the tiny VLM and Qwen3-VL,
data, one training loop, checkpoints, Hugging Face checkpoints, the `lngram-exp` CLI.

Papers: "Lngram v2: Latent N-Gram Memory with Interpretable Discrete
Representations" (and v1, "Lngram: N-gram Conditional Memory in Latent Space",
arXiv 2605.24869); "Persistent Visual Memory: Sustaining Perception for Deep
Generation in LVLMs", arXiv 2605.00814. Layout and conventions: DESIGN.md §6.

Folders, in layers (each imports only those below it; DESIGN.md §6.2): cli (the
commands), plan, jobs (what a run trains: lm, vlm, qwen3vl), analysis, data, hf, vlm,
models, trainer and configs; tools (benchmarks, the reproduction, the report) sit above
all and outside the wheel. Every run trains through `experiments.jobs.run_train` (over
the task-agnostic `experiments.trainer.train`) and restores with `experiments.restore`. The models
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
