"""GPU scale check: the main arms at a scale-up, 1,000 steps each, under a wall-clock deadline.

    python -m experiments.bench.scale_check --out=gpu_out/scale        # one H200, <= 9 min
    python -m experiments.bench.scale_check --smoke --out=/tmp/scale   # CPU dry run, seconds
    bash experiments/bench/scale_check.sh                              # the GPU entry (OUT=...)

Every arm of the reproduction's comparison (`ARMS`, in priority order: the
baseline and Lngram v2 r16 first, then the arms that beat it on bytes at d = 128,
then the rest) trains on the embedded corpus (the Python standard library's own
source, nothing downloaded) at `SCALE`: d 512, 8 layers (memory in layers 1 and 4,
shallow and intermediate), 32 rows x 512 bytes = 16,384 tokens per step, 1,000
steps, bfloat16 compute with float32 parameters. The same seed gives every arm the
same batches. A persistent compilation cache (`--cache-dir`) makes a rerun skip
compilation.

The deadline (`--budget-s` from the start, default 510 s) is checked before each
run: an arm is skipped when the previous compiles say it could not even compile in
what is left, and after its first timed steps when its projected end passes the
deadline (status "skipped", the projection recorded); an arm already running stops
at the deadline ("truncated", its curve kept). Each arm writes `<out>/<arm>.jsonl`
(one row per logged step: step, train bits/byte, validation bits/byte at the
evaluation steps, seconds since its start) as it runs, and `<out>/scale_check.json`
is rewritten after every arm (status, final validation bits/byte, s/step, compile
s, parameters), so a run cut short keeps what it measured.

Imports no grain (the GPU machine has none): batches are packed here with
`experiments.data.packing` (numpy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from experiments.configs import load_config
from experiments.data.corpus import corpus_spec, load_corpus
from experiments.data.packing import epoch_order, num_rows, pack_row
from experiments.models import DecoderLM, lm_config
from experiments.tasks.lm import lm_loss
from experiments.trainer import optimizer as optim_lib
from experiments.trainer.placement import make_train_mesh
from experiments.trainer.state import init_train_state
from experiments.trainer.step import WEIGHT

# name, config file[:arg]; the order is the priority under the deadline.
ARMS = (
    ("baseline", "lm_baseline.py"),
    ("lngram_r16", "lm_lngram.py:r16"),
    ("engram", "lm_engram.py"),
    ("lngram_v1", "lm_lngram_v1.py"),
    ("lngram_r64", "lm_lngram.py:r64"),
    ("pkm", "lm_pkm.py"),
    ("sparse_ffn", "lm_sparse_ffn.py:matched-to=r16"),
)
# The scale-up: the backbone, the rows, the schedule (the arms' memory configs are their own).
SCALE = dict(model=dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64,
                        ffn_dim=1536, max_len=512, dtype="bfloat16", param_dtype="float32"),
             memory_layers=(1, 4), seq_len=512, batch_size=32, steps=1000, lr=1e-3,
             warmup_steps=100, log_every=25, eval_every=250, eval_rows=64)
SMOKE = dict(model=dict(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                        ffn_dim=64, max_len=32, dtype="bfloat16", param_dtype="float32"),
             memory_layers=(1,), seq_len=32, batch_size=2, steps=4, lr=1e-3, warmup_steps=1,
             log_every=2, eval_every=4, eval_rows=2, max_files=6)
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
                max_files=scale.get("max_files", 0))
  c.optim.update(lr=scale["lr"], warmup_steps=scale["warmup_steps"])
  c.train.update(steps=scale["steps"], seed=seed)
  return c


class Rows:
  """Packed rows of the corpus: the training stream in the seed's epoch order, the
  validation rows in path order (every arm reads the same ones)."""

  def __init__(self, corpus, seq_len: int, seed: int):
    self.seq_len, self.seed = seq_len, seed
    self.train = corpus.train_docs
    self.lengths = np.asarray([d.size for d in self.train], np.int64)
    self.rows_per_epoch = num_rows(int(self.lengths.sum()), seq_len)
    self.val = corpus.val_docs
    val_lengths = np.asarray([d.size for d in self.val], np.int64)
    self.val_order, self.val_offsets, _ = epoch_order(
        val_lengths, num_rows(int(val_lengths.sum()), seq_len), None, 0)
    self._epoch = None

  def batch(self, step: int, batch_size: int) -> dict:
    rows = []
    for i in range(step * batch_size, (step + 1) * batch_size):
      epoch, r = divmod(i, self.rows_per_epoch)
      if self._epoch is None or self._epoch[0] != epoch:
        self._epoch = (epoch, *epoch_order(self.lengths, self.rows_per_epoch, self.seed, epoch))
      _, order, offsets, perm = self._epoch
      rows.append(pack_row(self.train, order, offsets, int(perm[r]), self.seq_len))
    return {k: np.stack([row[k] for row in rows]) for k in rows[0]}

  def validation(self, n_rows: int, batch_size: int) -> list[dict]:
    n = min(n_rows, num_rows(int(self.val_offsets[-1]), self.seq_len))
    rows = [pack_row(self.val, self.val_order, self.val_offsets, r, self.seq_len)
            for r in range(n)]
    return [{k: np.stack([row[k] for row in rows[i:i + batch_size]]) for k in rows[0]}
            for i in range(0, n, batch_size)]


def _param_count(params) -> int:
  return int(sum(x.size for x in jax.tree.leaves(params)))


def _eval_bits(eval_fn, params, rest, batches) -> float:
  nats = tokens = 0.0
  for b in batches:
    n, t = jax.device_get(eval_fn(params, rest, b))
    nats, tokens = nats + float(n), tokens + float(t)
  return nats / max(tokens, 1.0) / np.log(2.0)


def _make_eval(graphdef):
  @jax.jit
  def evaluate(params, rest, batch):
    _, metrics = lm_loss(nnx.merge(graphdef, params, rest), batch)
    # lm_loss gives the mean bits/byte and the tokens it averaged over.
    tokens = metrics[WEIGHT]
    return metrics["train/bits_per_byte"] * np.log(2.0) * tokens, tokens
  return evaluate


def train_arm(name: str, config, rows: Rows, val_batches, scale: dict, *, deadline: float,
              curve_path: Path) -> dict:
  """Trains one arm; returns its summary (status "done", "skipped" or "truncated").

  After compiling, `probe_steps` steps warm up and the next `probe_steps` are timed:
  the projected end (now + the remaining steps at that pace) decides whether it goes on.
  """
  probe_steps = max(1, min(5, (config.train.steps - 1) // 3))
  t0 = time.perf_counter()
  model = DecoderLM(lm_config(config), rngs=nnx.Rngs(params=config.train.seed))
  ts = init_train_state(model, config.optim, (config.train.steps,), make_train_mesh({}))
  del model
  lr = optim_lib.learning_rate_schedule(config.optim, config.train.steps)
  step_fn = ts.step_fn(0, lm_loss, lr)
  eval_fn = _make_eval(ts.graphdef)
  state, rest = ts.state, ts.rest
  out = {"arm": name, "params": _param_count(state["params"]), "steps": config.train.steps}
  state, metrics = step_fn(state, rest, rows.batch(0, scale["batch_size"]))
  jax.block_until_ready(metrics)
  out["compile_s"] = round(time.perf_counter() - t0, 2)
  curve = curve_path.open("w")
  steps, status, timed_from, t_timed = config.train.steps, "done", None, None
  try:
    step = 1
    while step < steps:
      if step == 1 + probe_steps:
        jax.block_until_ready(metrics)
        timed_from, t_timed = step, time.perf_counter()
      batch = rows.batch(step, scale["batch_size"])
      state, metrics = step_fn(state, rest, batch)
      step += 1
      if timed_from is not None and step == timed_from + probe_steps:
        jax.block_until_ready(metrics)
        per_step = (time.perf_counter() - t_timed) / probe_steps
        out["step_s"] = round(per_step, 5)
        # The remaining steps, and one evaluation pass per eval_every (about a step each).
        n_evals = steps // scale["eval_every"] + 1
        projected = time.perf_counter() + per_step * (steps - step + n_evals * len(val_batches))
        if projected > deadline:
          out.update(status="skipped", reason=f"projected end {projected - deadline:.0f} s past "
                     f"the deadline ({per_step * 1e3:.1f} ms/step)")
          return out
      if step % scale["log_every"] == 0 or step == steps:
        row = {"step": step, "train_bpb": float(jax.device_get(metrics["train/bits_per_byte"])),
               "t_s": round(time.perf_counter() - t0, 2)}
        if step % scale["eval_every"] == 0 or step == steps:
          row["eval_bpb"] = _eval_bits(eval_fn, state["params"], rest, val_batches)
        curve.write(json.dumps(row) + "\n")
        curve.flush()
        if not np.isfinite(row["train_bpb"]):
          raise FloatingPointError(f"{name}: train bits/byte {row['train_bpb']} at step {step}")
      # Past the deadline after the probe has let the run go on: stop, keep the curve.
      if "step_s" in out and time.perf_counter() > deadline and step < steps:
        status = "truncated"
        break
    out["final_eval_bpb"] = _eval_bits(eval_fn, state["params"], rest, val_batches)
    out.update(status=status, trained_steps=step, wall_s=round(time.perf_counter() - t0, 2))
    if timed_from is not None and "step_s" not in out:
      out["step_s"] = round((time.perf_counter() - t_timed) / max(step - timed_from, 1), 5)
    return out
  finally:
    curve.close()


def run(out_dir, *, smoke: bool = False, budget_s: float = 510.0, arms=None, seed: int = 0,
        steps: int | None = None, cache_dir: str | None = None, log=print) -> dict:
  """The scale check; returns (and writes) `<out_dir>/scale_check.json`."""
  start = time.perf_counter()
  deadline = start + budget_s
  if cache_dir:
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  scale = dict(SMOKE if smoke else SCALE)
  if steps:
    scale["steps"] = steps
  chosen = [(n, s) for n, s in ARMS if arms is None or n in arms]
  unknown = set(arms or ()) - {n for n, _ in ARMS}
  if unknown:
    raise ValueError(f"scale_check: unknown arms {sorted(unknown)}; "
                     f"choose from {[n for n, _ in ARMS]}.")
  configs = {n: arm_config(s, scale, smoke=smoke, seed=seed) for n, s in chosen}
  corpus = load_corpus(corpus_spec(configs[chosen[0][0]]))
  rows = Rows(corpus, scale["seq_len"], seed)
  val_batches = rows.validation(scale["eval_rows"], scale["batch_size"])
  result = {"smoke": smoke, "scale": {k: v for k, v in scale.items()}, "budget_s": budget_s,
            "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
            "jax": jax.__version__, "python": platform.python_version(),
            "tokens_per_step": scale["seq_len"] * scale["batch_size"],
            "val_tokens": int(sum(b["loss_mask"].sum() for b in val_batches)), "arms": []}
  summary_path = out_dir / "scale_check.json"
  compiles: list[float] = []
  for name, spec in chosen:
    left = deadline - time.perf_counter()
    if left <= 0 or (compiles and left < min(compiles)):
      result["arms"].append({"arm": name, "config": spec, "status": "skipped",
                             "reason": f"{left:.0f} s left" + (
                                 f", the fastest compile took {min(compiles):.0f} s"
                                 if compiles else "")})
      log(f"[scale_check] {name}: skipped ({left:.0f} s left)")
    else:
      log(f"[scale_check] {name} ({spec}): {left:.0f} s left")
      arm = train_arm(name, configs[name], rows, val_batches, scale, deadline=deadline,
                      curve_path=out_dir / f"{name}.jsonl")
      arm["config"] = spec
      compiles.append(arm["compile_s"])
      result["arms"].append(arm)
      log(f"[scale_check] {name}: {arm['status']}, final val. "
          f"{arm.get('final_eval_bpb', float('nan')):.4f} bits/byte, "
          f"{arm.get('step_s', float('nan')) * 1e3:.1f} ms/step, compile {arm['compile_s']} s")
    result["wall_s"] = round(time.perf_counter() - start, 2)
    summary_path.write_text(json.dumps(result, indent=1))
  return result


def markdown(result: dict) -> str:
  lines = [f"Scale check on {result['device']} ({result['backend']}, jax {result['jax']}): "
           f"{result['tokens_per_step']:,} tokens per step, {result['scale']['steps']} steps, "
           f"budget {result['budget_s']:.0f} s, wall {result['wall_s']:.0f} s.", "",
           "| arm | status | params | final val. bits/byte | ms/step | compile s |",
           "| --- | --- | ---: | ---: | ---: | ---: |"]
  for a in result["arms"]:
    bpb = a.get("final_eval_bpb")
    step = a.get("step_s")
    lines.append(f"| {a['arm']} | {a['status']} | {a.get('params', '–')} | "
                 f"{'–' if bpb is None else f'{bpb:.4f}'} | "
                 f"{'–' if step is None else f'{1e3 * step:.1f}'} | {a.get('compile_s', '–')} |")
  return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="scale_out", help="output directory")
  parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU dry run)")
  parser.add_argument("--budget-s", type=float, default=510.0,
                      help="deadline, seconds from the start (default 510: 9 min less startup)")
  parser.add_argument("--arms", default="", help="comma-separated subset of the arms")
  parser.add_argument("--steps", type=int, default=0, help="steps per arm (default: the scale's)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--cache-dir", default=os.environ.get("JAX_COMPILATION_CACHE_DIR", ""),
                      help="persistent compilation cache (default $JAX_COMPILATION_CACHE_DIR)")
  return parser.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    result = run(args.out, smoke=args.smoke, budget_s=args.budget_s,
                 arms=[a for a in args.arms.split(",") if a] or None, seed=args.seed,
                 steps=args.steps or None, cache_dir=args.cache_dir or None)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  text = markdown(result)
  (Path(args.out) / "scale_check_table.txt").write_text(text)   # the Markdown table
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
