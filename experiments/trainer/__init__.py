"""The task-agnostic trainer: state, loop, run checkpointing, the workdir lock.

It knows no LM, VLM or Lngram and imports nothing from `experiments.jobs`,
`experiments.models`, `experiments.vlm` or `experiments.analysis` (DESIGN.md §6).
The caller builds a `Task` (experiments/jobs) and hands it to `train`:

    train(task, train_config, workdir, mesh), open_run(workdir), Run   loop.py
    init_train_state(module, optim, phases, mesh), TrainState, abstract_like   state.py
    Task, BatchSource                                                 protocol.py

The names load on first use, so that importing one submodule (the checkpoint
format, the lock) does not import the loop and its optimiser.
"""

_NAMES = {"train": "loop", "open_run": "loop", "Run": "loop",
          "Task": "protocol", "BatchSource": "protocol",
          "init_train_state": "state", "TrainState": "state", "abstract_like": "state"}

__all__ = sorted(_NAMES)


def __getattr__(name):
  if name in _NAMES:
    import importlib
    return getattr(importlib.import_module(f"experiments.trainer.{_NAMES[name]}"), name)
  raise AttributeError(f"module 'experiments.trainer' has no attribute {name!r}")
