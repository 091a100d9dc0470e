"""The GPU scale check's arms (experiments/tools/bench/scale_check.py), matched by the
project's parameter accounting (experiments/models/params.py): each arm's experiment config
at a scale, lngram_v1 at v2 r16's active parameters and Engram at its table parameters, and
the table of their parameters printed before training."""

from __future__ import annotations

import bisect

from flax import nnx

from experiments.configs import load_config
from experiments.models import DecoderLM, lm_config
from experiments.models.arms import engram as engram_arm
from experiments.models.arms import lngram_v1 as v1_arm
from experiments.models.params import branch_param_count, memory_params

# name, config file[:arg] before matching (`arm_configs` sizes lngram_v1 and engram).
ARMS = (
    ("baseline", "lm_baseline.py"),
    ("lngram_r16", "lm_lngram.py:r16"),
    ("lngram_v1", "lm_lngram_v1.py"),
    ("engram", "lm_engram.py"),
)
CONFIG_DIR = "experiments/configs"


def arm_config(spec: str, scale: dict, *, smoke: bool, seed: int):
  """The arm's experiment config at `scale` (smoke: its own `smoke` shrink first)."""
  path, _, arg = spec.partition(":")
  arg = ",".join(a for a in (arg, "smoke" if smoke else "") if a)
  c = load_config(f"{CONFIG_DIR}/{path}" + (f":{arg}" if arg else ""))
  c.model.update(vocab_size=256, **scale["model"])
  if c.model.memory_layers:
    c.model.memory_layers = tuple(scale["memory_layers"])
  c.data.update(seq_len=scale["seq_len"], batch_size=scale["batch_size"], seed=seed,
                max_files=scale.get("max_files", 0), dedup_validation=True)
  if scale.get("val_doc_cap"):
    c.data.val_doc_cap = scale["val_doc_cap"]
  c.optim.update(lr=scale["lr"], warmup_steps=scale["warmup_steps"])
  c.train.update(steps=scale["steps"], seed=seed)
  return c


def _memory(config):
  return lm_config(config).memory


def match_v1(v2_memory, d_model: int, *, max_dm: int = 256) -> tuple[int, int]:
  """(routes, Dm) of v1 at v2's active parameters a layer: v2's routes and bits (router
  d -> R·M), the row width whose active count is closest to v2's."""
  target = branch_param_count(v2_memory)["active"]

  def active(dm):
    return branch_param_count(v1_arm.LngramV1Config(
        d_model=d_model, bits=v2_memory.bits, orders=v2_memory.orders, mem_dim=dm,
        n_routes=v2_memory.routes))["active"]

  dm = min(range(1, max_dm + 1), key=lambda m: (abs(active(m) - target), m))
  return v2_memory.routes, dm


def match_engram(v2_memory, engram_memory) -> int:
  """Engram's table base whose tables hold v2's table parameters most closely (ties: the
  smaller), by bisection (the tables grow with the base)."""
  target = branch_param_count(v2_memory)["tables"]

  def tables(base):
    return branch_param_count(engram_arm.EngramConfig(**{
        **{f: getattr(engram_memory, f) for f in ("d_model", "orders", "heads", "head_dim",
                                                   "vocab_size", "case_fold", "hash_seed")},
        "table_base": base}))["tables"]

  high = 2
  while tables(high) < target:
    high *= 2
  first = bisect.bisect_left(range(high + 1), target, lo=2, key=tables)  # tables >= target
  return min((b for b in (first - 1, first) if b >= 2),
             key=lambda b: (abs(tables(b) - target), b))


def arm_configs(scale: dict, *, smoke: bool, seed: int, names=None) -> dict:
  """{arm: (spec, config)} with lngram_v1 and engram matched to lngram_r16 at `scale`."""
  v2 = _memory(arm_config("lm_lngram.py:r16", scale, smoke=smoke, seed=seed))
  d = scale["model"]["d_model"]
  out = {}
  for name, spec in ARMS:
    if names is not None and name not in names:
      continue
    if name == "lngram_v1":
      routes, dm = match_v1(v2, d)
      spec = f"lm_lngram_v1.py:r{routes},mem{dm}"
      config = arm_config(spec, scale, smoke=smoke, seed=seed)
      config.model.memory.update(bits=v2.bits)   # v2's router width (R·M) at any scale
    elif name == "engram":
      eng = _memory(arm_config(spec, scale, smoke=smoke, seed=seed))
      spec = f"lm_engram.py:base{match_engram(v2, eng)}"
      config = arm_config(spec, scale, smoke=smoke, seed=seed)
    else:
      config = arm_config(spec, scale, smoke=smoke, seed=seed)
    out[name] = (spec, config)
  return out


def param_table(configs: dict) -> list[dict]:
  """Per arm: backbone, memory total / active / tables (all layers), from the configs."""
  rows = []
  for name, (spec, config) in configs.items():
    model = lm_config(config)
    shapes = nnx.eval_shape(lambda m=model: DecoderLM(m, rngs=nnx.Rngs(params=0)))
    total = int(sum(v.size for _, v in nnx.to_flat_state(nnx.state(shapes, nnx.Param))))
    mem_total, mem_active = memory_params(model)
    per_layer = branch_param_count(model.memory) if model.memory is not None else {}
    tables = len(model.memory_layers) * int(per_layer.get("tables", per_layer.get("values", 0)))
    rows.append({"arm": name, "config": spec, "backbone": total - mem_total,
                 "memory_total": int(mem_total), "memory_active": int(mem_active),
                 "memory_tables": tables})
  return rows


def param_markdown(rows: list[dict]) -> str:
  ref = next((r for r in rows if r["arm"] == "lngram_r16"), None)

  def ratio(r, key):
    return f" ({r[key] / ref[key]:.3f}x)" if ref and ref[key] and r[key] else ""

  lines = ["| arm | config | backbone | memory total | memory active | memory tables |",
           "|---|---|---:|---:|---:|---:|"]
  lines += [f"| {r['arm']} | `{r['config']}` | {r['backbone']:,} | {r['memory_total']:,}"
            f"{ratio(r, 'memory_total')} | {r['memory_active']:,}{ratio(r, 'memory_active')} | "
            f"{r['memory_tables']:,}{ratio(r, 'memory_tables')} |" for r in rows]
  return "\n".join(lines)
