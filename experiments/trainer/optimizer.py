"""The one optimiser: AdamW groups, warmup + cosine, global-norm clipping, a trainable mask.

Groups, chosen from each parameter's path in the trained module's pure-dict
state (DESIGN.md §2, "optimiser groups"; paper Table 13):
  table     memory tables (`.../memory/tables/<j>`): table_lr_mult × the base
            learning rate (4e-4 vs 1e-4 in the paper), no weight decay.
  no_decay  the Lngram router (`router_w`) and every norm scale: no weight
            decay (decaying a router or a norm gain pulls it towards a
            degenerate value rather than regularising).
  decay     everything else: base learning rate and `weight_decay`.
  backbone, backbone_no_decay
            only with `optim.backbone_lr` > 0 (opt-in, the pretrained-backbone
            recipe of Table 13; absent or 0 = the groups above, as every
            earlier run had them): parameters outside the memory and
            beside-FFN slots train at their own peak `backbone_lr` (cosine to
            `backbone_min_lr_ratio`, default `min_lr_ratio`) with
            `weight_decay` (norm scales without); the branches' non-table
            parameters then take the base learning rate without weight decay.
  frozen    leaves the run's trainable mask excludes (VLM Stage I/II): their
            gradient is zeroed before clipping and their update is
            `optax.set_to_zero`, so they stay bit-for-bit unchanged and hold
            no Adam moments.
            `optim.freeze` (optional, a tuple or comma-separated names) adds
            every parameter with one of those path components, e.g.
            "router_w": the random-router control of the ID analyses (the
            Lngram router stays at its init, so its codes are a fixed random
            projection of the layer input).
  gate      only with `optim.gate_lr_mult` > 0 (opt-in): the beside-FFN
            branch's scalar gate λ (`.../ffn_branch/gate`) at that multiple
            of the base learning rate, no weight decay. λ starts at 0 and Adam
            moves it by about the learning rate per step, so at the branch's
            LR it can stay too small for the branch to act (DESIGN.md §5.2).
Clipping is one global norm over the trainable leaves, before the per-group
updates.

Schedule: linear warmup from 0 over `optim.warmup_steps` (or, if
`optim.warmup_frac` > 0, over that share of the run: the VLM recipe), then
cosine to `min_lr_ratio` × peak (the table group: `table_min_lr_ratio` if
given and > 0, the recipe's 4e-4 -> 1e-5 beside 1e-4 -> 2e-6). A constant learning rate is warmup 0 and
min_lr_ratio 1 (Stage II GRPO).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from experiments.trainer.keypaths import path_names, path_str

GROUPS = ("decay", "no_decay", "table")
BACKBONE_GROUPS = ("backbone", "backbone_no_decay")
FROZEN = "frozen"
# The slots whose modules are inserted branches rather than the backbone (experiments/models/lm.py).
BRANCH_SLOTS = ("memory", "ffn_branch")


def param_group(path: tuple[str, ...]) -> str:
  """The optimiser group of a parameter from its path components."""
  if "memory" in path and "tables" in path:
    return "table"
  # Memory-branch biases (b_k, b_v of Engram and Lngram v1) and norm scales are not
  # decayed, as usual (other modules' groups stay as their recorded runs had them).
  is_memory_bias = "memory" in path and str(path[-1]).startswith("b_")
  if path[-1] == "router_w" or is_memory_bias or any("norm" in str(part) for part in path):
    return "no_decay"
  return "decay"


def backbone_group(path: tuple[str, ...]) -> str:
  """The group of a parameter when the backbone has its own learning rate."""
  group = param_group(path)
  if any(slot in path for slot in BRANCH_SLOTS):
    return "no_decay" if group == "decay" else group
  return "backbone" if group == "decay" else "backbone_no_decay"


def backbone_lr(optim) -> float:
  """`optim.backbone_lr` (absent or 0: the backbone shares the base groups)."""
  return float(optim.get("backbone_lr", 0.0) or 0.0) if optim is not None else 0.0


def frozen_names(optim) -> tuple[str, ...]:
  """`optim.freeze`: path components whose parameters stay at init (absent: none)."""
  names = optim.get("freeze", ()) if optim is not None else ()
  if isinstance(names, str):
    names = names.split(",")
  return tuple(str(n) for n in names if str(n))


def gate_lr_mult(optim) -> float:
  """`optim.gate_lr_mult` (absent or 0: the gate stays in its usual group)."""
  return float(optim.get("gate_lr_mult", 0.0) or 0.0) if optim is not None else 0.0


def is_gate(path: tuple[str, ...]) -> bool:
  """The beside-FFN branch's scalar gate λ (PVM and the iso-parameter MLP)."""
  return "ffn_branch" in path and path[-1] == "gate"


def param_labels(params, trainable: Callable[[str], bool] | None = None, optim=None) -> dict:
  """A tree like `params` holding each leaf's group name (or "frozen"); `optim`: the
  optim block, whose `backbone_lr` > 0 selects the backbone groups, `freeze` freezes
  parameters by name and `gate_lr_mult` > 0 gives the branch gate its own group."""
  group = backbone_group if backbone_lr(optim) > 0 else param_group
  frozen = frozen_names(optim)
  gate = gate_lr_mult(optim) > 0
  def label(path, _):
    names = path_names(path)
    if trainable is not None and not trainable(path_str(path)):
      return FROZEN
    if any(n in frozen for n in names):
      return FROZEN
    if gate and is_gate(names):
      return "gate"
    return group(names)
  return jax.tree_util.tree_map_with_path(label, params)


def frozen_mask(params, trainable: Callable[[str], bool] | None = None, optim=None):
  """A tree like `params`, True at each frozen leaf (`param_labels`' "frozen"), or None
  when no leaf is frozen: the train step differentiates the other leaves only."""
  mask = jax.tree.map(lambda label: label == FROZEN, param_labels(params, trainable, optim))
  return mask if any(jax.tree.leaves(mask)) else None


def group_sizes(params, trainable: Callable[[str], bool] | None = None,
                optim=None) -> dict[str, int]:
  """Parameter count per group (for the run log)."""
  names = GROUPS + (BACKBONE_GROUPS if backbone_lr(optim) > 0 else ())
  names += ("gate",) if gate_lr_mult(optim) > 0 else ()
  sizes = dict.fromkeys(names + ((FROZEN,) if trainable or frozen_names(optim) else ()), 0)
  labels = jax.tree.leaves(param_labels(params, trainable, optim))
  for label, leaf in zip(labels, jax.tree.leaves(params), strict=True):
    sizes[label] += int(leaf.size)
  return sizes


def learning_rate_schedule(optim, total_steps: int, *, multiplier: float = 1.0,
                           peak: float | None = None, min_ratio: float | None = None):
  """Linear warmup from 0 to `lr`·multiplier (or `peak`), then cosine to
  min_ratio·peak (default `min_lr_ratio`)."""
  peak = optim.lr * multiplier if peak is None else peak
  min_ratio = optim.min_lr_ratio if not min_ratio else min_ratio
  # optim.schedule_steps > 0: the schedule of a run that long, whatever the steps trained
  # (a longer cosine stopped early: the Lngram v2 paper's App. A.5). Absent / 0: off.
  total_steps = int(optim.get("schedule_steps", 0) or 0) or total_steps
  frac = float(optim.get("warmup_frac", 0.0) or 0.0)
  if frac > 0:
    # The VLM recipe: a share of each phase (at least one step).
    warmup = max(1, int(round(frac * total_steps)))
  else:
    warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1), end_value=peak * min_ratio)


STATE_DTYPES = ("float32", "bfloat16")


def state_dtype(optim):
  """`optim.state_dtype` (optional): the dtype of AdamW's first moment, the mixed-
  precision policy's optimiser state ("float32" or "bfloat16"; None = the
  parameters' dtype). optax keeps the second moment in the parameters' dtype."""
  name = optim.get("state_dtype", None) or None
  if name is None:
    return None
  if name not in STATE_DTYPES:
    raise ValueError(f"optim.state_dtype={name!r} is not one of {STATE_DTYPES}.")
  return jnp.dtype(name)


def make_optimizer(optim, params, total_steps: int, *,
                   trainable: Callable[[str], bool] | None = None
                   ) -> optax.GradientTransformation:
  """The full optimiser for `params` (a pure dict) from the `optim` config block.

  `trainable(path) -> bool` (path as 'lm/blocks/1/ffn_branch/gate') selects
  the leaves that train; None trains every leaf.
  """
  base = learning_rate_schedule(optim, total_steps)
  table = learning_rate_schedule(optim, total_steps, multiplier=optim.table_lr_mult,
                                 min_ratio=optim.get("table_min_lr_ratio", None))
  mu_dtype = state_dtype(optim)
  adamw = lambda lr, wd: optax.adamw(lr, b1=optim.b1, b2=optim.b2, eps=optim.eps,
                                     weight_decay=wd, mu_dtype=mu_dtype)
  labels = param_labels(params, trainable, optim)
  transforms = {"decay": adamw(base, optim.weight_decay), "no_decay": adamw(base, 0.0),
                "table": adamw(table, 0.0)}
  if backbone_lr(optim) > 0:
    backbone = learning_rate_schedule(optim, total_steps, peak=backbone_lr(optim),
                                      min_ratio=optim.get("backbone_min_lr_ratio", None))
    transforms |= {"backbone": adamw(backbone, optim.weight_decay),
                   "backbone_no_decay": adamw(backbone, 0.0)}
  if gate_lr_mult(optim) > 0:
    gate = learning_rate_schedule(optim, total_steps, multiplier=gate_lr_mult(optim))
    transforms["gate"] = adamw(gate, 0.0)
  label_leaves = jax.tree.leaves(labels)
  if frozen_names(optim) and FROZEN not in label_leaves:
    raise ValueError(f"optim.freeze={frozen_names(optim)} names no parameter of the model.")
  chain = [optax.clip_by_global_norm(optim.clip_norm)]
  if trainable is not None or FROZEN in label_leaves:
    # Frozen gradients are zeroed first so the global norm is that of the
    # trainable leaves alone.
    frozen = jax.tree.map(lambda label: label == FROZEN, labels)
    chain.insert(0, optax.masked(optax.set_to_zero(), frozen))
    transforms[FROZEN] = optax.set_to_zero()
  return optax.chain(*chain, optax.multi_transform(transforms, labels))
