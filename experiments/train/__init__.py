"""Training and evaluation as library functions (the CLI and notebooks call them).

One loop (`loop.train`) for every run, fed by a `task.Task`; the LM task is
`lm_task.lm_task`, the VLM stages' `experiments.vlm.run.vlm_task`.
"""

from experiments.train.loop import abstract_like, train
from experiments.train.task import BatchSource, Task, make_task, saved_config

__all__ = ["BatchSource", "Task", "abstract_like", "make_task", "saved_config", "train"]
