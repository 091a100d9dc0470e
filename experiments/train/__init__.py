"""Training and evaluation as library functions (the CLI and notebooks call them)."""

from experiments.train.loop import abstract_like, init_model, saved_config, train

__all__ = ["abstract_like", "init_model", "saved_config", "train"]
