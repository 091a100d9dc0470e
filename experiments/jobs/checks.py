"""Checks before anything is built: config numbers, memory, the mesh, a resumed run's config.

Each refuses with one line naming the field and value (the CLI prints it as
`error: ...`, exit 2), before a corpus is read or a parameter allocated.
"""

from __future__ import annotations

import logging
import math
import os
import re

from flax import nnx

from experiments.trainer.errors import ConfigMismatchError, config_diff

log = logging.getLogger("experiments")

# --- checks before anything is built ------------------------------------------------------

# (field, test, what it must be): numbers a run cannot use, rejected with the field named.
_POSITIVE_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                 "a positive int")
_NONNEG_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
               "an int >= 0")
_POSITIVE = (lambda v: _is_number(v) and v > 0, "a number > 0")
_NONNEG = (lambda v: _is_number(v) and v >= 0, "a number >= 0")
_UNIT_OPEN = (lambda v: _is_number(v) and 0 <= v < 1, "in [0, 1)")
_UNIT = (lambda v: _is_number(v) and 0 <= v <= 1, "in [0, 1]")
# AdamW moves each parameter by about lr per step: above 1 no run trains (and 1e99 becomes
# inf in float32, failing only after the step compiled). Tables take lr·table_lr_mult.
_LR = (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1] (AdamW's step size)")
_LR_MULT = (lambda v: _is_number(v) and 0 < v <= 1000, "a number in (0, 1000]")
_CHECKS = {
    "train.steps": _POSITIVE_INT,
    "train.log_every": _POSITIVE_INT,
    "train.eval_every": _POSITIVE_INT,
    "train.ckpt_every": _POSITIVE_INT,
    "train.max_to_keep": _POSITIVE_INT,
    "train.seed": _NONNEG_INT,
    "data.batch_size": _POSITIVE_INT,
    "data.seq_len": _POSITIVE_INT,
    "data.eval_batches": _POSITIVE_INT,
    "data.max_files": _NONNEG_INT,
    "data.val_doc_cap": _NONNEG_INT,
    "data.val_budget": _NONNEG_INT,
    "data.seed": _NONNEG_INT,
    "data.val_fraction": _UNIT_OPEN,
    "optim.lr": _LR,
    "optim.table_lr_mult": _LR_MULT,
    "optim.weight_decay": _NONNEG,
    "optim.b1": _UNIT_OPEN,
    "optim.b2": _UNIT_OPEN,
    "optim.eps": _POSITIVE,
    "optim.warmup_steps": _NONNEG_INT,
    "optim.warmup_frac": _UNIT_OPEN,
    "optim.min_lr_ratio": _UNIT,
    "optim.clip_norm": _NONNEG,
}


def _is_number(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def check_blocks(config) -> None:
  """Refuses a config without a block its job reads, in one line (a config file that
  builds its ConfigDict by hand may leave one out). The VLM stages check their own."""
  from experiments.jobs.registry import job_of
  blocks = job_of(config).BLOCKS
  missing = [b for b in blocks if b not in config]
  if missing:
    raise ValueError(f"the config has no {', '.join(missing)} block"
                     f"{'s' if len(missing) > 1 else ''}: {job_of(config).A_CONFIG} holds "
                     f"{', '.join(blocks)} (start from experiments/configs/base.py's "
                     "base_config()).")


def check_experiment_config(config) -> None:
  """Rejects numbers a run cannot use (steps <= 0, a negative LR, ...), naming the field.

  Fields a config does not have are skipped (the LM and VLM configs differ);
  the model block is checked by its own config class (`lm_config`, `vlm_config`), and
  what only one job's config holds by that job's `check` (experiments/jobs/<job>/).
  """
  check_blocks(config)
  for field, (ok, what) in _CHECKS.items():
    block, _, name = field.partition(".")
    if block not in config or name not in config[block]:
      continue
    value = config[block][name]
    if not ok(value):
      raise ValueError(f"{field}={value!r} must be {what}.")


# --- memory estimate ----------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, field: str = "max_memory") -> int:
  """'8GiB', '512MB', '1e9' -> bytes."""
  match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
  unit = match and match.group(2).lower()
  if not match or unit not in _UNITS:
    raise ValueError(f"{field}={text!r} is not a size like 8GiB, 512MB or 1e9.")
  try:
    value = float(match.group(1)) * _UNITS[unit]
  except ValueError:
    raise ValueError(f"{field}={text!r} is not a size like 8GiB, 512MB or 1e9.") from None
  if not value > 0:
    raise ValueError(f"{field}={text!r} must be > 0.")
  return int(value)


def format_bytes(n: float) -> str:
  for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{int(n)} B"


def machine_memory() -> int | None:
  """Physical memory of this machine in bytes (None where the OS does not say)."""
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def module_bytes(build) -> int:
  """Bytes of the parameters of the module `build()` makes, from shapes alone
  (nnx.eval_shape: no arrays)."""
  import jax
  abstract = nnx.eval_shape(build)
  leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
  return sum(int(leaf.size) * leaf.dtype.itemsize for leaf in leaves)


def lm_param_bytes(model_config) -> int:
  """Bytes of a decoder LM's parameters (an LMConfig), from shapes alone."""
  from experiments.models import DecoderLM
  return module_bytes(lambda: DecoderLM(model_config, rngs=nnx.Rngs(0)))


def memory_plan(config, devices: int, *, token_shards: int | None = None,
                model=None) -> dict[str, int]:
  """Bytes per device of parameters, AdamW state and training activations with the
  parameters and optimizer state sharded over `devices` (fsdp) and the global batch
  split over them: a rough plan, from shapes alone, before anything is allocated.
  `model`: the LM config when the caller built it (else built from `config`).

  Activations: what the backward keeps per token and layer, about (14·d + 3·ffn)
  values in the compute dtype (one d-vector per layer with `remat`, plus one
  layer's worth), and the chunked cross entropy's three float32 [chunk, V] arrays
  (experiments/models/cross_entropy.py: the [B, T, V] logits never exist whole).
  """
  import math

  import jax.numpy as jnp

  if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
    raise ValueError(f"plan_devices={devices!r} must be an int >= 1 (the devices to plan "
                     "the memory for).")
  if model is None:
    from experiments.hf.backbone import with_hf_backbone
    from experiments.models.config import lm_config
    model = lm_config(with_hf_backbone(config))   # init_from=hf:DIR: its backbone
  lm = model
  params = lm_param_bytes(lm)
  mu = state_dtype_bytes(config)
  # nu in the parameters' dtype; mu in optim.state_dtype when given.
  opt = params + (params * mu // jnp.dtype(lm.param_dtype).itemsize if mu else params)
  rows = math.ceil(int(config.data.batch_size) / devices)
  tokens = rows * int(config.data.seq_len)
  if token_shards is not None:   # a mesh's data·fsdp·seq split of the batch's tokens
    tokens = math.ceil(int(config.data.batch_size) * int(config.data.seq_len) / token_shards)
  act = jnp.dtype(lm.dtype).itemsize
  per_layer = (14 * lm.d_model + 3 * lm.ffn_dim) * act
  kept = (lm.n_layers * lm.d_model * act + per_layer) if lm.remat else lm.n_layers * per_layer
  from experiments.models.cross_entropy import LOGITS_BUDGET
  shards = devices if token_shards is None else token_shards
  logits = 3 * min(LOGITS_BUDGET // shards, tokens * lm.vocab_size * 4)
  return {"devices": devices, "params": math.ceil(params / devices),
          "optimizer": math.ceil(opt / devices),
          "activations": tokens * kept + logits}


def state_dtype_bytes(config) -> int:
  """Bytes per value of AdamW's first moment (0: the parameters' dtype)."""
  name = config.get("optim", {}).get("state_dtype", "") or ""
  return {"": 0, "float32": 4, "bfloat16": 2}.get(name, 0)


def plan_line(config, devices: int, *, model=None) -> str:
  """One line: `memory_plan` for `devices`, for the log before a run allocates."""
  plan = memory_plan(config, devices, model=model)
  total = plan["params"] + plan["optimizer"] + plan["activations"]
  return (f"memory per device on {devices} device{'s' if devices > 1 else ''} (fsdp): "
          f"parameters {format_bytes(plan['params'])}, optimizer state "
          f"{format_bytes(plan['optimizer'])}, activations {format_bytes(plan['activations'])}"
          f" (batch {config.data.batch_size} x {config.data.seq_len}); total "
          f"{format_bytes(total)}")


def check_memory(checked, limit: int | None = None) -> int | None:
  """Refuses a checked config (`experiments.jobs.Checked`) whose parameters + optimizer
  state (AdamW's two moments, each the size of the parameters) exceed `limit` (default:
  the machine's memory) before anything is allocated; returns the estimate in bytes
  (None for a job whose checkpoint sets the size)."""
  from experiments.jobs.registry import job
  params = job(checked.job).param_bytes(checked)
  if params is None:
    return None
  need = 3 * params
  available = machine_memory()
  limits = [(limit, "the --max_memory limit")] if limit else []
  if available:
    limits.append((available, "this machine's memory"))
  for cap, what in limits:
    if need > cap:
      raise ValueError(
          f"the model needs about {format_bytes(need)} for parameters + optimizer state "
          f"({format_bytes(need / 3)} of parameters, AdamW's two moments), more than "
          f"{what} ({format_bytes(cap)}); shrink the model (e.g. model.memory.routes, "
          "bits, orders, mem_dim) or raise --max_memory.")
  return need


# --- the mesh -------------------------------------------------------------------------------


def lngram_halo(memory) -> int:
  """How far Lngram's n-gram windows and conv reach back (0 for other branches)."""
  if hasattr(memory, "max_order") and hasattr(memory, "conv_context"):
    return max(memory.max_order - 1, memory.conv_context)
  return 0


def check_fits(mesh, *, batch_size: int, seq_len: int | None = None, memory=None) -> None:
  """Refuses a mesh the run cannot be split over, naming the numbers."""
  import numpy as np

  from experiments.trainer.placement import BATCH_AXES
  rows = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
  if batch_size % rows:
    raise ValueError(f"data.batch_size={batch_size} must be a multiple of mesh.data × "
                     f"mesh.fsdp × mesh.expert = {rows} (each shard takes whole rows).")
  seq = int(mesh.shape["seq"])
  halo = lngram_halo(memory)
  if seq > 1:
    if seq_len is None:
      raise ValueError(f"mesh.seq={seq}: this run has no token sequence to split (only the "
                       "byte LM supports context parallelism); use mesh.seq=1.")
    if seq_len % seq or seq_len // seq < max(halo, 1):
      raise ValueError(f"data.seq_len={seq_len} must split into mesh.seq={seq} blocks of "
                       f"at least {max(halo, 1)} steps (the Lngram windows and conv "
                       "reach that far into the left block).")
  table = int(mesh.shape["table"])
  routes = getattr(memory, "routes", None)
  if table > 1 and type(memory).__name__ == "LngramConfig" and routes % table:
    raise ValueError(f"model.memory.routes={routes} must be a multiple of mesh.table={table}: "
                     "each table shard owns whole routes (their rows and every "
                     "counterfactual row of the surrogate gradient).")


# --- a resumed run's config -------------------------------------------------------------------

# The parts of the experiment config a resume may not change silently: they
# define the optimiser and its LR schedule (warmup + cosine over train.steps).
_SCHEDULE_KEYS = (("optim",), ("train", "steps"), ("vlm", "stage", "curriculum"))


def _pick(tree: dict, keys: tuple) -> object:
  for key in keys:
    if not isinstance(tree, dict) or key not in tree:
      return "<absent>"
    tree = tree[key]
  return tree


def _lines(diff) -> str:
  return "; ".join(f"{path}: {old!r} -> {new!r}" for path, old, new in diff)


def check_resume_config(directory, saved: dict, wanted: dict, allow_change: bool,
                        later_defaults: dict | None = None) -> None:
  """Compares a checkpoint's config JSON with the requested run's (before reading arrays).

  `later_defaults`: {"optim.state_dtype": "", ...}, fields added to the configs after
  a run may have been saved; absent from the saved run and at that default now
  counts as unchanged.
  """
  model_diff = (config_diff(saved.get("kind", "lm"), wanted.get("kind", "lm"), "kind")
                + config_diff(saved.get("model", {}), wanted.get("model", {}), "model")
                + config_diff(saved.get("trained") or {}, wanted.get("trained") or {},
                              "trained"))
  if model_diff:
    raise ConfigMismatchError(
        f"{directory} holds a run of a different model than the one requested: "
        f"{_lines(model_diff)}. Train this model in a new --workdir, or pass the --config "
        "that matches the run to resume it (the run's config: "
        "`experiments.restore(workdir)[1]`).")
  old, new = saved.get("experiment", {}), wanted.get("experiment", {})
  later = later_defaults or {}
  schedule_diff = []
  for keys in _SCHEDULE_KEYS:
    if _pick(old, keys) == "<absent>" and _pick(new, keys) == "<absent>":
      continue
    schedule_diff += config_diff(_pick(old, keys), _pick(new, keys), ".".join(keys))
  schedule_diff = [(path, was, now) for path, was, now in schedule_diff
                   if not (was == "<absent>" and path in later and later[path] == now)]
  if not schedule_diff:
    return
  if not allow_change:
    raise ConfigMismatchError(
        f"resuming the run in {directory} would change its optimiser or LR schedule: "
        f"{_lines(schedule_diff)}. Pass the --config the run was started with, or use a new "
        "--workdir, or add --config.train.allow_config_change=True to resume with these "
        "changes (the schedule then changes at the resume step).")
  for path, was, now in schedule_diff:
    log.warning("resume: %s changed %r -> %r (allowed by train.allow_config_change).",
                path, was, now)
