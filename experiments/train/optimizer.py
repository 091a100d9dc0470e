"""AdamW with parameter groups, warmup + cosine, global-norm clipping (DESIGN.md §2).

Groups, chosen from each parameter's path in the model's pure-dict state:
  table     Lngram tables (`.../lngram/tables/<j>`): table_lr_mult × the base
            learning rate (paper Table 13: 4e-4 vs 1e-4), no weight decay.
  no_decay  the Lngram router (`router_w`) and every norm scale: no weight
            decay (decaying a router or a norm gain pulls it towards a
            degenerate value rather than regularising).
  decay     everything else: base learning rate and `weight_decay`.
Clipping is one global norm over all groups, before the per-group updates.
"""

from __future__ import annotations

import jax
import optax

GROUPS = ("decay", "no_decay", "table")


def param_group(path: tuple[str, ...]) -> str:
  """The optimiser group of a parameter from its path components."""
  if "lngram" in path and "tables" in path:
    return "table"
  last = path[-1]
  if last == "router_w" or any("norm" in part for part in path):
    return "no_decay"
  return "decay"


def _path_names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def param_labels(params) -> dict:
  """A tree like `params` holding each leaf's group name."""
  return jax.tree_util.tree_map_with_path(lambda p, _: param_group(_path_names(p)), params)


def group_sizes(params) -> dict[str, int]:
  """Parameter count per group (for the run log)."""
  sizes = dict.fromkeys(GROUPS, 0)
  labels = jax.tree.leaves(param_labels(params))
  for label, leaf in zip(labels, jax.tree.leaves(params), strict=True):
    sizes[label] += int(leaf.size)
  return sizes


def learning_rate_schedule(optim, total_steps: int, *, multiplier: float = 1.0):
  """Linear warmup from 0 to `lr`·multiplier, then cosine to min_lr_ratio·peak."""
  peak = optim.lr * multiplier
  warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1), end_value=peak * optim.min_lr_ratio)


def make_optimizer(optim, params, total_steps: int) -> optax.GradientTransformation:
  """The full optimiser for `params` (a pure dict) from the `optim` config block."""
  base = learning_rate_schedule(optim, total_steps)
  table = learning_rate_schedule(optim, total_steps, multiplier=optim.table_lr_mult)
  adamw = lambda lr, wd: optax.adamw(lr, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                                     weight_decay=wd)
  return optax.chain(
      optax.clip_by_global_norm(optim.clip_norm),
      optax.multi_transform(
          {"decay": adamw(base, optim.weight_decay),
           "no_decay": adamw(base, 0.0),
           "table": adamw(table, 0.0)},
          param_labels(params)))
