"""Mesh training: bytes each collective moves per step, predicted and measured; step-time ratios.

    python -m experiments.tools.bench.mesh_train                                # lm_lngram.py, bytes + timing
    python -m experiments.tools.bench.mesh_train --config=lm_lngram.py:smoke --batch-size=8 --no-timing
    python -m experiments.tools.bench.mesh_train --steps 5 --repeats 3 --layouts "1 device,data=8"

For each layout (`LAYOUTS`: 1 device, data=8, fsdp=8, table=8, data=2×table=4,
data=4×fsdp=2, data=2×seq=2×table=2; a layout the config cannot be split over is
skipped with the reason) the run's train state and step are built exactly as the
trainer builds them (`experiments.trainer.init_train_state` with the LM's placement
rules, `TrainState.step_fn` with the LM loss traced on the mesh), lowered and compiled. From `compiled.as_text()`
every all-reduce / all-gather / reduce-scatter / collective-permute / all-to-all
is summed with `experiments.tools.bench.sharding.collective_bytes` (the bytes each
device contributes: an all-gather its piece, a reduce-scatter its whole input, an
all-reduce and a collective-permute their buffer; long tuples, `mesh[...]` replica
groups and singleton groups are read by its `normalise_hlo`). Bytes are per device per step; a collective-permute counts its whole
buffer even on devices whose pair is themselves or who have no neighbour to send
to (so it is an upper bound). `--no-timing` compiles with LLVM optimisation off
(`FAST_COMPILE`): the HLO, hence every collective, is the same, only codegen differs.

PREDICTION (first principles; `predict`, per device per step, float32, w = a
parameter's bytes, k = the devices its spec splits it over, "local" = w/k; b =
B/(data·fsdp) rows, t = T/seq steps, n = b·t tokens held by a device; L_m Lngram
layers, L_a attention layers; Hq, Dr = |N|·Dm, d, R, M (bits), N orders, C conv
context steps, Hkv, dh):

  gradients (tokens split over data·fsdp·seq > 1): every gradient is summed over the
    token shards once: all-reduce of its local bytes, Σ w/k. An fsdp-split parameter
    instead: reduce-scatter of its gradient (the whole fsdp-replicated input, w·fsdp/k)
    and, if data·seq > 1, an all-reduce of the resulting shard (w/k).
  fsdp: every fsdp-split parameter is all-gathered once in the forward (its local
    bytes), the gathered copy reused by the backward.
  table (route-parallel merge), per Lngram layer: forward pmax of m and psum of l and
    u, n·Hq·(Dr+2)·4 bytes; backward the one psum of dh, n·d·4. The tables' and the
    router's gradients stay in their shards (only summed over the token shards, above).
    The Lngram parameters used before the merge on every table shard (q_norm, W_Q,
    W_K = the first half of w_kv, mem_norm) get partial gradients from each shard's
    routes: one more all-reduce (over table) of their bytes.
  seq (context parallelism), per Lngram layer: collective-permutes of the left halo:
    forward router logits b·(N-1)·(R/table)·M·4, valid b·(N-1)·1, segment ids
    b·(N-1)·4 and the conv's input b·C·d·4 and segment ids b·C·4; backward the
    cotangents of the logits and conv halos again. Attention (XLA's choice, predicted
    as the textbook one), per layer: all-gather of K and V, 2·n·Hkv·dh·4, and of the
    key segment ids n·4; backward reduce-scatter of dK and dV, 2·n·seq·Hkv·dh·4.
  1 device: nothing. Scalars (loss and token sums, norms) are left out (< 1 kB).

WHERE MEASURED AND PREDICTED DIFFER (lm_lngram, XLA:CPU, jax 0.10; see the table):
  * tied embeddings: the embedding's two gradient contributions (the input gather's
    scatter-add and the output projection's dot) are all-reduced separately before
    they are added, so every data-parallel layout all-reduces the embedding twice
    (+256·d·4 bytes: +0.6% at d=128, +25% in the smoke model).
  * fsdp: XLA:CPU emits no reduce-scatter: it all-reduces full gradients and slices
    them (and all-gathers the norm scales a second time in the backward), so fsdp
    shows all-reduce where a reduce-scatter was predicted; the totals agree (1.00-1.01).
    fsdp does not split the Lngram tables (only `table` does): at d=128 17.1 of the
    20.5 MiB of parameters stay replicated and are all-reduced as under data=8.
  * seq: the Lngram halos are as predicted, byte for byte. The gradients of the
    parameters outside the shard_map (everything but the Lngram layers) are
    all-reduced twice, once over seq and once over data, not once over both (+3.2 MiB
    at d=128); attention's K and V go through a collective-permute (a device reorder:
    half the pairs are a device with itself) before the all-gather, and dK, dV come
    back by all-reduce + collective-permute (4 MiB against the 3 MiB predicted).
  * table (the route-parallel merge, the dh psum, the pre-merge gradients, the tables'
    gradients kept in their shards) and data: as predicted, to within the scalars
    (after the tied embedding above).

Timing (unless --no-timing): `--steps` steps per layout per round, layouts
interleaved round after round (`--repeats`), median seconds per step and its ratio
to the 1-device step. The host devices share this machine's cores, so a ratio
shows the overhead of the collectives and of replicated work, not a speed-up.
"""

from __future__ import annotations

import os

_DEVICES_FLAG = "--xla_force_host_platform_device_count"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
  # Read when the CPU backend starts, i.e. at the first device query below.
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICES_FLAG}=8".strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from experiments.configs import load_config  # noqa: E402
from experiments.jobs.checks import check_fits  # noqa: E402
from experiments.jobs.lm.task import lm_loss  # noqa: E402
from experiments.models import DecoderLM, layout, lm_config  # noqa: E402
from experiments.tools.bench.sharding import collective_bytes, normalise_hlo  # noqa: E402
from experiments.trainer import optimizer as optim_lib  # noqa: E402
from experiments.trainer import placement as mesh_lib  # noqa: E402
from experiments.trainer.state import init_train_state  # noqa: E402

OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
LAYOUTS = {
    "1 device": {},
    "data=8": dict(data=8),
    "fsdp=8": dict(fsdp=8),
    "table=8": dict(table=8),
    "data=2×table=4": dict(data=2, table=4),
    "data=4×fsdp=2": dict(data=4, fsdp=2),
    "data=2×seq=2×table=2": dict(data=2, seq=2, table=2),
}
# Bytes-only compiles: the same HLO passes, LLVM codegen without optimisation (~2x faster).
FAST_COMPILE = {"xla_backend_optimization_level": 0}
# Lngram parameters used before the route-parallel merge (partial gradients per table shard).
_BEFORE_MERGE = {"q_norm": 1.0, "w_q": 1.0, "mem_norm": 1.0, "w_kv": 0.5}   # w_kv: its W_K half


def load(spec: str):
  """A config from `lm_lngram.py[:arg]` (under experiments/configs) or a path."""
  if "/" not in spec.split(":")[0]:
    spec = f"experiments/configs/{spec}"
  return load_config(spec)


# --- the run's step on a mesh, as the loop builds it -------------------------------------------


@dataclasses.dataclass
class Built:
  mesh: object
  step: object          # the jitted train step (`TrainState.step_fn`)
  state: dict
  rest: dict
  batch: dict           # on the mesh
  params: dict          # host copies of the initial parameters (for `predict`)
  lngram_paths: frozenset


def host_batch(config, seed: int = 0) -> dict:
  """One LM batch of the config's shape (the token values do not change the program)."""
  B, T = config.data.batch_size, config.data.seq_len
  inputs = np.random.default_rng(seed).integers(0, 256, (B, T), dtype=np.int32)
  return {"inputs": inputs, "targets": np.roll(inputs, -1, axis=1),
          "segment_ids": np.ones((B, T), np.int32),
          "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
          "loss_mask": np.ones((B, T), np.float32)}


def check_mesh(config, mesh) -> None:
  """The LM task's `check_mesh` (experiments/jobs/checks.py): ValueError if it cannot split."""
  check_fits(mesh, batch_size=config.data.batch_size, seq_len=config.data.seq_len,
             memory=lm_config(config).memory)


def build(config, block: dict) -> Built:
  """State and train step on the mesh of `block`, as the trainer builds them."""
  mesh = mesh_lib.make_train_mesh(block)
  check_mesh(config, mesh)
  module = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=config.train.seed))
  paths = layout.lngram_paths(module)
  host = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param)))
  steps = config.train.steps
  ts = init_train_state(module, config.optim, (steps,), mesh,
                        rules=layout.placement_rules(module))
  lr_fn = optim_lib.learning_rate_schedule(config.optim, steps)
  step = ts.step_fn(0, functools.partial(lm_loss, mesh=mesh), lr_fn,
                    grad_accum=int(config.train.get("grad_accum", 1)))
  batch = ts.placement.put_batch(host_batch(config), tokens=True)
  return Built(mesh, step, ts.state, ts.rest, batch, host, paths)


def compile_step(built: Built, *, fast: bool = False):
  """The compiled step (its loss traces the model on the mesh, as the trainer's does)."""
  lowered = built.step.lower(built.state, built.rest, built.batch)
  return lowered.compile(FAST_COMPILE) if fast else lowered.compile()


# --- measured: collectives in the compiled HLO --------------------------------------------------

def measured_bytes(hlo_text: str) -> dict[str, int]:
  """Bytes per device per collective kind in a compiled step's HLO."""
  found = collective_bytes(hlo_text)
  return {op: int(found.get(op, 0)) for op in OPS}


def collective_lines(hlo_text: str) -> list[tuple[str, int, str, str]]:
  """(kind, bytes, result shape, op_name) of every collective that moves bytes (--verbose)."""
  out = []
  for line in normalise_hlo(hlo_text).splitlines():
    found = {k: v for k, v in collective_bytes(line).items() if v}
    if found:
      (kind, n), = found.items()
      shape = re.search(r"=\s*(\([^=]*?\)|\S+)\s", line).group(1)
      name = re.search(r'op_name="([^"]*)"', line)
      out.append((kind, n, shape, name.group(1) if name else ""))
  return out


# --- predicted ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Term:
  op: str
  bytes: float
  what: str


def _keys(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _rules(config):
  """The LM's placement rule (its Lngram layers found on an abstract model)."""
  return layout.placement_rules(
      nnx.eval_shape(lambda: DecoderLM(lm_config(config), rngs=nnx.Rngs(0))))


def predict(config, mesh, params, lngram_paths) -> list[Term]:
  """The bytes each collective should move per device per step (module docstring)."""
  size = {a: int(mesh.shape[a]) for a in mesh_lib.AXES if a in mesh.shape}
  data, fsdp, seq, table = (size.get(a, 1) for a in ("data", "fsdp", "seq", "table"))
  token_shards = data * fsdp * seq
  terms: list[Term] = []
  if mesh.size == 1:
    return terms
  specs = mesh_lib.param_specs(params, mesh, rules=_rules(config))
  grad = gather = scatter = shard_sum = merge_params = 0.0
  for (path, x), spec in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                             jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P)),
                             strict=True):
    keys = _keys(path)
    w = x.size * x.dtype.itemsize
    axes = [a for entry in spec if entry is not None
            for a in ((entry,) if isinstance(entry, str) else entry)]
    local = w / int(np.prod([size[a] for a in axes]))
    if "fsdp" in axes:
      gather += local
      if token_shards > 1:
        scatter += local * fsdp
        if data * seq > 1:
          shard_sum += local
    elif token_shards > 1:
      grad += local
    in_lngram = any(keys[:len(p)] == p for p in lngram_paths)
    if table > 1 and in_lngram and keys[-1] in _BEFORE_MERGE:
      merge_params += local * _BEFORE_MERGE[keys[-1]]
  if grad:
    terms.append(Term("all-reduce", grad, "gradients of the unsplit parameters, summed "
                      "over the token shards"))
  if gather:
    terms.append(Term("all-gather", gather, "fsdp: parameters gathered for the forward"))
  if scatter:
    terms.append(Term("reduce-scatter", scatter, "fsdp: gradients reduce-scattered"))
  if shard_sum:
    terms.append(Term("all-reduce", shard_sum, "fsdp: gradient shards summed over data/seq"))
  if merge_params:
    terms.append(Term("all-reduce", merge_params, "table: Lngram parameters before the "
                      "merge (q_norm, W_Q, W_K, mem_norm), partial per table shard"))

  model = lm_config(config)
  mem = model.memory
  B, T = config.data.batch_size, config.data.seq_len
  b, t = B // (data * fsdp), T // seq
  n = b * t
  act = jnp.dtype(model.dtype).itemsize
  n_lngram = len(lngram_paths)
  if table > 1 and n_lngram:
    stat = max(act, 4)   # the merge's statistics are float32 or wider
    terms.append(Term("all-reduce", n_lngram * n * mem.q_heads * (mem.route_dim + 2) * stat,
                      "table: route-parallel merge (m, l, u), forward"))
    terms.append(Term("all-reduce", n_lngram * n * model.d_model * act,
                      "table: psum of dh, backward"))
  if seq > 1:
    if n_lngram:
      halo, conv = mem.max_order - 1, mem.conv_context
      logits = b * halo * (mem.routes // table) * mem.bits * act
      fwd = logits + b * halo * (1 + 4) + b * conv * (model.d_model * act + 4)
      terms.append(Term("collective-permute", n_lngram * fwd,
                        "seq: Lngram halos (logits, valid, segment ids, conv input), forward"))
      terms.append(Term("collective-permute", n_lngram * (logits + b * conv * model.d_model * act),
                        "seq: Lngram halo cotangents, backward"))
    kv = 2 * n * model.n_kv_heads * model.head_dim * act
    terms.append(Term("all-gather", model.n_layers * (kv + n * 4),
                      "seq: attention K, V and key segment ids gathered"))
    terms.append(Term("reduce-scatter", model.n_layers * kv * seq,
                      "seq: attention dK, dV reduce-scattered"))
  return terms


def totals(terms: list[Term]) -> dict[str, int]:
  out = dict.fromkeys(OPS, 0)
  for term in terms:
    out[term.op] += int(round(term.bytes))
  return out


# --- the benchmark -----------------------------------------------------------------------------


def run(config, names=None, *, timing: bool = True, steps: int = 5, repeats: int = 3,
        verbose: bool = False) -> dict[str, dict]:
  """{layout: {"block", "measured", "predicted" ({kind: bytes}), "terms" (`predict`),
  "collectives" (`collective_lines`), "step_s" (with timing)} or {"block", "skipped"}}."""
  names = list(names or LAYOUTS)
  out, runners = {}, {}
  for name in names:
    block = LAYOUTS[name]
    if int(np.prod(list(block.values()) or [1])) > jax.device_count():
      out[name] = {"block": block, "skipped": f"needs {np.prod(list(block.values()))} devices"}
      continue
    try:
      built = build(config, block)
    except ValueError as e:
      out[name] = {"block": block, "skipped": str(e).split(":")[0].split(" (")[0].strip()}
      continue
    compiled = compile_step(built, fast=not timing)
    text = compiled.as_text()
    terms = predict(config, built.mesh, built.params, built.lngram_paths)
    out[name] = {"block": block, "measured": measured_bytes(text), "predicted": totals(terms),
                 "terms": terms, "collectives": collective_lines(text)}
    if verbose:
      print(f"\n{name}: collectives in the compiled step")
      for kind, n, shape, op_name in out[name]["collectives"]:
        print(f"  {kind:18s} {n:>12,d}  {shape[:90]}  {op_name[-60:]}")
    if timing:
      runners[name] = _runner(compiled, built)
  if runners:
    times = {name: [] for name in runners}
    for _ in range(repeats):
      for name, runner in runners.items():   # interleaved: load hits every layout alike
        times[name].append(runner(steps) / steps)
    for name, seconds in times.items():
      out[name]["step_s"] = statistics.median(seconds)
  return out


def _runner(compiled, built: Built):
  holder = {"state": built.state}
  state, metrics = compiled(holder["state"], built.rest, built.batch)   # warm-up
  jax.block_until_ready(metrics)
  holder["state"] = state

  def run_steps(steps: int) -> float:
    state = holder["state"]
    t0 = time.perf_counter()
    for _ in range(steps):
      state, metrics = compiled(state, built.rest, built.batch)
    jax.block_until_ready((state, metrics))
    holder["state"] = state
    return time.perf_counter() - t0

  return run_steps


def _kib(n: float) -> str:
  return f"{n / 1024:,.1f}"


def markdown(results: dict[str, dict]) -> str:
  """One row per layout: measured / predicted KiB per device per step per collective kind."""
  timed = any("step_s" in r for r in results.values())
  base = results.get("1 device", {}).get("step_s")
  head = ("| layout | " + " | ".join(OPS) + " | total | measured ÷ predicted |"
          + (" ms/step | ÷ 1 device |" if timed else ""))
  lines = [head, "|---|" + "---:|" * (len(OPS) + 2) + ("---:|---:|" if timed else "")]
  for name, r in results.items():
    if "skipped" in r:
      lines.append(f"| {name} | skipped: {r['skipped']} |")
      continue
    m, p = r["measured"], r["predicted"]
    cells = [f"{_kib(m[op])} / {_kib(p[op])}" if m[op] or p[op] else "0" for op in OPS]
    mt, pt = sum(m.values()), sum(p.values())
    ratio = f"{mt / pt:.2f}" if pt else ("—" if not mt else "∞")
    row = f"| {name} | " + " | ".join(cells) + f" | {_kib(mt)} / {_kib(pt)} | {ratio} |"
    if timed:
      s = r.get("step_s")
      row += (f" {1e3 * s:.1f} | {s / base:.2f} |" if s and base else " | |")
    lines.append(row)
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="lm_lngram.py",
                      help="config file under experiments/configs[:arg], e.g. lm_lngram.py:smoke")
  parser.add_argument("--no-timing", action="store_true", help="bytes only (compiles, runs nothing)")
  parser.add_argument("--steps", type=int, default=5, help="steps per layout per timing round")
  parser.add_argument("--repeats", type=int, default=3, help="timing rounds")
  parser.add_argument("--batch-size", type=int, default=0, help="override data.batch_size")
  parser.add_argument("--layouts", default="", help=f"comma-separated subset of {list(LAYOUTS)}")
  parser.add_argument("--verbose", action="store_true", help="list every collective")
  args = parser.parse_args(argv)
  config = load(args.config)
  if args.batch_size:
    config.data.batch_size = args.batch_size
  names = [n for n in args.layouts.split(",") if n] or list(LAYOUTS)
  unknown = sorted(set(names) - set(LAYOUTS))
  if unknown:
    parser.error(f"unknown --layouts {unknown}; choose from {list(LAYOUTS)}")
  model = lm_config(config)
  mem = model.memory
  print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices, "
        f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}")
  print(f"{args.config}: d={model.d_model}, {model.n_layers} layers, Hkv={model.n_kv_heads}, "
        f"dh={model.head_dim}; Lngram R={mem.routes} M={mem.bits} orders={mem.orders} "
        f"Hq={mem.q_heads} Dr={mem.route_dim} in layers {model.memory_layers}; "
        f"batch {config.data.batch_size} x seq {config.data.seq_len}")
  results = run(config, names, timing=not args.no_timing, steps=args.steps,
                repeats=args.repeats, verbose=args.verbose)
  print("\nKiB per device per step, measured / predicted"
        + (f"; step time median of {args.repeats} rounds of {args.steps} steps" if not
           args.no_timing else ""))
  print(markdown(results))
  print("\nPredicted terms (KiB):")
  for name, r in results.items():
    for term in r.get("terms", []):
      print(f"  {name}: {term.op} {_kib(term.bytes)}: {term.what}")
  return results


if __name__ == "__main__":
  main()
