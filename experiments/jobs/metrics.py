"""The one metrics protocol of the memory-slot branches (Lngram v2 and every arm).

Training: a branch reports, in its parallel-mode aux dict (the model names them
`memory/<layer>/<name>`):

  aux_loss        a float32 scalar, already weighted, added to the training
                  loss (the sparse FFN's Switch balance loss);
  metric/<name>   float32 scalars, logged as `train/memory/<layer>/<name>`.

Evaluation: a branch class defines

  metric_sums(aux, valid_BxT, segment_ids_BxT)   per batch, inside jit: sums,
                  except keys ending in `_max`, merged by maximum (an indicator
                  of the memory slots or table rows read);
  summarise_metrics(sums) -> {name: float}       on the merged host arrays;

and the summaries are named `<kind>/<layer>/<name>` (`lngram/1/route_mass`,
`pkm/1/slot_usage`). Lngram v2's are in experiments/models/branches.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from experiments.models import branches


def loss_terms(aux: dict):
  """(the sum of every `memory/<i>/aux_loss`, {train metric name: scalar})."""
  total = jnp.zeros((), jnp.float32)
  metrics = {}
  for key, value in aux.items():
    if not key.startswith("memory/"):
      continue
    _, layer, name = key.split("/", 2)
    if name == "aux_loss":
      total = total + value.astype(jnp.float32)
      metrics[f"train/memory/{layer}/aux_loss"] = value
    elif name.startswith("metric/"):
      metrics[f"train/memory/{layer}/{name.removeprefix('metric/')}"] = value
  return total, metrics


def layer_aux(aux: dict, layer: int) -> dict:
  """The aux entries of one memory layer, without their `memory/<layer>/` prefix."""
  prefix = f"memory/{layer}/"
  return {k.removeprefix(prefix): v for k, v in aux.items() if k.startswith(prefix)}


def accumulate(model, aux: dict, valid_BxT, segment_ids_BxT=None) -> dict:
  """Per-batch sums `<layer>/<name>` of every memory layer whose branch defines
  `metric_sums` (inside jit)."""
  out = {}
  for layer in model.config.memory_layers:
    branch = model.blocks[layer].memory
    if hasattr(branch, "metric_sums"):
      sums = branch.metric_sums(layer_aux(aux, layer), valid_BxT, segment_ids_BxT)
      for name, value in sums.items():
        out[f"{layer}/{name}"] = value
  return out


def merge(total: dict | None, batch: dict) -> dict:
  """Host-side running merge: sums, except `_max` keys (elementwise maximum)."""
  batch = {k: np.asarray(v) for k, v in batch.items()}
  if total is None:
    return batch
  return {k: np.maximum(total[k], v) if k.endswith("_max") else total[k] + v
          for k, v in batch.items()}


def summarise(memory_config, stats: dict) -> dict[str, float]:
  """`<kind>/<layer>/<name>` scalars from merged sums."""
  if memory_config is None:
    return {}
  kind = branches.kind_of(memory_config)
  if not hasattr(kind.module, "summarise_metrics"):
    return {}
  out = {}
  for layer in sorted({int(k.split("/", 1)[0]) for k in stats}):
    prefix = f"{layer}/"
    sums = {k.removeprefix(prefix): v for k, v in stats.items() if k.startswith(prefix)}
    for name, value in kind.module.summarise_metrics(sums).items():
      out[f"{kind.name}/{layer}/{name}"] = float(value)
  return out


# --- the MoE FFN (experiments/models/moe/layer.py) -------------------------------------------------
# Its layers report `moe/<layer>/balance_loss` (E·Σ load·P, 1 when balanced) and
# `moe/<layer>/expert_load` [E] (the share of routed slots per expert) in aux, and
# with a capacity factor `moe/<layer>/dropped` (slots dropped by the dispatch).


def moe_layers(aux: dict) -> list[int]:
  return sorted({int(k.split("/")[1]) for k in aux
                 if k.startswith("moe/") and k.endswith("/balance_loss")})


def moe_loss_terms(aux: dict, moe_config):
  """(Σ_layers balance_coef · balance_loss, train metrics): `train/moe_balance_loss`
  (the layers' mean, unweighted), `train/moe/<layer>/load_max` / `load_min`, and with
  a capacity factor `train/moe/<layer>/dropped` (the slots the step dropped)."""
  layers = moe_layers(aux)
  if not layers:
    return jnp.zeros((), jnp.float32), {}
  losses = [aux[f"moe/{i}/balance_loss"].astype(jnp.float32) for i in layers]
  out = {"train/moe_balance_loss": sum(losses) / len(losses)}
  for i in layers:
    load_E = aux[f"moe/{i}/expert_load"]
    out[f"train/moe/{i}/load_max"] = jnp.max(load_E)
    out[f"train/moe/{i}/load_min"] = jnp.min(load_E)
    if f"moe/{i}/dropped" in aux:
      out[f"train/moe/{i}/dropped"] = aux[f"moe/{i}/dropped"].astype(jnp.float32)
  return moe_config.balance_coef * sum(losses), out


def moe_sums(aux: dict) -> dict:
  """Per-batch values `<layer>/{load, balance_loss, batches}` (inside jit) that
  `merge` sums; every eval batch has the same shape, so each weighs the same."""
  out = {}
  for i in moe_layers(aux):
    out[f"{i}/load"] = aux[f"moe/{i}/expert_load"].astype(jnp.float32)
    out[f"{i}/balance_loss"] = aux[f"moe/{i}/balance_loss"].astype(jnp.float32)
    out[f"{i}/batches"] = jnp.ones((), jnp.float32)
  return out


def summarise_moe(stats: dict) -> dict[str, float]:
  """`moe/<layer>/load/<e>` (every expert's share of the routed slots: the full
  vector), `moe/<layer>/load_max`, `load_min` and `balance_loss`, over the batches."""
  out = {}
  for layer in sorted({int(k.split("/", 1)[0]) for k in stats}):
    n = max(float(stats[f"{layer}/batches"]), 1.0)
    load_E = np.asarray(stats[f"{layer}/load"], np.float64) / n
    for e, value in enumerate(load_E):
      out[f"moe/{layer}/load/{e}"] = float(value)
    out[f"moe/{layer}/load_max"] = float(load_E.max())
    out[f"moe/{layer}/load_min"] = float(load_E.min())
    out[f"moe/{layer}/balance_loss"] = float(stats[f"{layer}/balance_loss"]) / n
  return out
