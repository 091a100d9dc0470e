"""A two-minute demo: a byte-level model with one Lngram v2 layer learns Python source.

    python -m lngram_jax.demo                  # ~150 steps, then the same model without memory
    python -m lngram_jax.demo --steps 3 --no-baseline

The model is an embedding, one LngramV2 layer (one-bit surrogate) added to the
residual stream, an RMSNorm and a linear readout to 256 byte logits:

    h = E[x_t];  h = h + Lngram(h);  p(x_{t+1}) = softmax(RMSNorm(h) W_out)

Without the memory branch this is a bigram model (the next byte from the
current one). With it, the router hashes each byte into R codes of M bits and the
tables hold one entry per n-gram of codes (n = 2, 3), so the model can use the
previous two bytes and, through the dilated conv, a few more.

Data: ~200 KB of the Python standard library's own source (no download): `*.py`
files outside test folders, in sorted path order; the files after the training
slice are the validation slice. Optimiser: AdamW with the paper's groups (tables
at 4x the learning rate; no weight decay on tables and router), cosine schedule
with warm-up. Prints the loss every `--log-every` steps, the final train and
validation loss in bits per byte, the mean route mass and the number of distinct
codes each route uses on the validation slice.
"""

from __future__ import annotations

import argparse
import math
import os
import sysconfig
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lngram_jax.config import LngramConfig
from lngram_jax.layer import LngramV2
from lngram_jax.norms import rms_norm

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_bytes(train_bytes: int, val_bytes: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(train, val, number of files): whole files, sorted by relative path."""
  root = Path(sysconfig.get_paths()["stdlib"])
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    paths += [Path(dirpath, f) for f in filenames if f.endswith(".py")]
  paths.sort(key=lambda p: p.relative_to(root).as_posix())
  train, val, used = bytearray(), bytearray(), 0
  for path in paths:
    target = train if len(train) < train_bytes else val
    if len(val) >= val_bytes:
      break
    target += path.read_bytes()
    used += 1
  if len(val) < val_bytes:
    raise RuntimeError(f"the standard library under {root} holds fewer than "
                       f"{train_bytes + val_bytes} bytes of Python source.")
  as_array = lambda b: np.frombuffer(bytes(b), np.uint8).astype(np.int32)
  return as_array(train[:train_bytes]), as_array(val[:val_bytes]), used


class ByteLM(nnx.Module):
  """Embedding, optional Lngram v2 memory, RMSNorm, linear byte readout."""

  def __init__(self, d_model: int, memory: LngramConfig | None, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(stddev=0.02)
    self.embed = nnx.Param(nnx.initializers.normal(stddev=1.0)(rngs.params(), (256, d_model)))
    self.memory = LngramV2(memory, rngs=rngs) if memory is not None else None
    self.out_norm = nnx.Param(jnp.ones((d_model,)))
    self.w_out = nnx.Param(init(rngs.params(), (d_model, 256)))

  def __call__(self, tokens_BxT, *, return_aux=False):
    h_BxTxD = jnp.take(self.embed[...], tokens_BxT, axis=0)
    aux = {}
    if self.memory is not None:
      delta_BxTxD, aux = self.memory(h_BxTxD, return_aux=True)
      h_BxTxD = h_BxTxD + delta_BxTxD
    logits_BxTxV = rms_norm(h_BxTxD, self.out_norm[...]) @ self.w_out[...]
    return (logits_BxTxV, aux) if return_aux else logits_BxTxV


def next_byte_loss(model: ByteLM, window_BxT1, *, return_aux=False):
  """Mean next-byte cross entropy in nats over windows of T+1 bytes."""
  logits_BxTxV, aux = model(window_BxT1[:, :-1], return_aux=True)
  loss = optax.softmax_cross_entropy_with_integer_labels(
      logits_BxTxV.astype(jnp.float32), window_BxT1[:, 1:]).mean()
  return (loss, aux) if return_aux else loss


def _group(path) -> str:
  names = [getattr(k, "key", getattr(k, "name", "")) for k in path]
  if "tables" in names:
    return "tables"
  if "router_w" in names or "embed" in names:
    return "no_decay"
  return "default"


def make_optimizer(params, *, lr: float, steps: int) -> optax.GradientTransformation:
  """AdamW; tables at 4x the LR and, with the router, without weight decay."""
  warmup = max(1, steps // 10)

  def adamw(peak, weight_decay):
    schedule = optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(steps, warmup + 1))
    return optax.adamw(schedule, b2=0.95, weight_decay=weight_decay)

  labels = jax.tree_util.tree_map_with_path(lambda path, _: _group(path), params)
  return optax.multi_transform(
      {"tables": adamw(4 * lr, 0.0), "no_decay": adamw(lr, 0.0), "default": adamw(lr, 0.1)},
      labels)


def windows(data: np.ndarray, seq_len: int) -> np.ndarray:
  """Non-overlapping windows of seq_len + 1 bytes (each shares its last byte)."""
  n = (len(data) - 1) // seq_len
  starts = np.arange(n) * seq_len
  return np.stack([data[s:s + seq_len + 1] for s in starts])


def train(model: ByteLM, train_data, val_data, *, steps, batch, seq_len, lr, log_every,
          seed, label, log=print) -> dict:
  """Trains in place; returns final train/val bits per byte and memory statistics."""
  graphdef, params = nnx.split(model)
  tx = make_optimizer(params, lr=lr, steps=steps)
  opt_state = tx.init(params)

  @jax.jit
  def train_step(params, opt_state, window_BxT1):
    loss_fn = lambda p: next_byte_loss(nnx.merge(graphdef, p), window_BxT1)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def evaluate(params, window_BxT1):
    return next_byte_loss(nnx.merge(graphdef, params), window_BxT1, return_aux=True)

  rng = np.random.default_rng(seed)
  start = time.perf_counter()
  losses = []
  for step in range(1, steps + 1):
    offsets = rng.integers(0, len(train_data) - seq_len - 1, size=batch)
    window_BxT1 = jnp.asarray(np.stack([train_data[o:o + seq_len + 1] for o in offsets]))
    params, opt_state, loss = train_step(params, opt_state, window_BxT1)
    losses.append(loss)  # stays on device: no host sync between logs
    if step % log_every == 0 or step == steps:
      recent = float(jnp.mean(jnp.stack(losses[-log_every:])))
      if not math.isfinite(recent):
        raise FloatingPointError(f"{label}: loss became {recent} at step {step}.")
      log(f"[{label}] step {step:4d}  train loss {recent / math.log(2):.3f} bits/byte  "
          f"({time.perf_counter() - start:.1f}s)")
  nnx.update(model, params)
  val_windows = jnp.asarray(windows(val_data, seq_len))
  # As many training windows as validation ones, spread over the training slice.
  all_train = windows(train_data, seq_len)
  pick = np.linspace(0, len(all_train) - 1, num=len(val_windows)).astype(int)
  train_windows = jnp.asarray(all_train[pick])
  train_loss, _ = evaluate(params, train_windows)  # same shape: one compilation
  val_loss, aux = evaluate(params, val_windows)
  result = {"train_bpb": float(train_loss) / math.log(2),
            "val_bpb": float(val_loss) / math.log(2),
            "seconds": time.perf_counter() - start}
  if model.memory is not None:
    codes = np.asarray(aux["codes"]).reshape(-1, model.memory.config.routes)
    result["route_mass"] = float(jnp.mean(aux["route_mass"]))
    result["codes_used_per_route"] = [len(np.unique(codes[:, r])) for r in range(codes.shape[1])]
  return result


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m lngram_jax.demo",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--lr", type=float, default=1e-2, help="peak LR (tables get 4x)")
  parser.add_argument("--train-bytes", type=int, default=200_000)
  parser.add_argument("--val-bytes", type=int, default=20_000)
  parser.add_argument("--log-every", type=int, default=25)
  parser.add_argument("--surrogate", default="onebit", help="router gradient of the layer")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--no-baseline", action="store_true",
                      help="skip the same model without the memory branch")
  args = parser.parse_args(argv)
  for name in ("steps", "batch", "seq_len", "train_bytes", "val_bytes", "log_every"):
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  memory = LngramConfig(d_model=64, routes=8, bits=4, orders=(2, 3), mem_dim=32, q_heads=4,
                        kv_heads=2, head_dim=16, surrogate=args.surrogate)
  train_data, val_data, n_files = stdlib_bytes(args.train_bytes, args.val_bytes)
  print(f"data: {len(train_data)} train + {len(val_data)} validation bytes from the first "
        f"{n_files} standard-library files (sorted paths, test folders skipped)")
  print(f"memory: R={memory.routes} M={memory.bits} orders={memory.orders} "
        f"mem={memory.mem_dim} surrogate={memory.surrogate}; jax {jax.__version__}")
  hp = dict(steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
            log_every=args.log_every, seed=args.seed)
  runs = {"lngram": ByteLM(64, memory, rngs=nnx.Rngs(args.seed))}
  if not args.no_baseline:
    runs["no memory"] = ByteLM(64, None, rngs=nnx.Rngs(args.seed))
  results = {}
  for label, model in runs.items():
    results[label] = train(model, train_data, val_data, label=label, **hp)
  for label, r in results.items():
    print(f"{label:>9}: train {r['train_bpb']:.3f} bits/byte, validation {r['val_bpb']:.3f} "
          f"bits/byte ({r['seconds']:.0f}s)")
  lngram = results["lngram"]
  print(f"route mass (mean over heads and validation positions): {lngram['route_mass']:.3f}")
  print(f"distinct codes used per route on validation (of {memory.codes_per_route}): "
        f"{lngram['codes_used_per_route']}")
  return results


if __name__ == "__main__":
  main()
