"""The paper's Table 12: prefill / decode latency and memory of a 2B decoder with Lngram v2.

    python -m experiments.tools.bench.lm_efficiency --json lm_efficiency.json          # on a GPU
    python -m experiments.tools.bench.lm_efficiency --smoke                            # CPU, < 60 s
    python -m experiments.tools.bench.lm_efficiency --configs baseline,r64/m4/KV8 --repeats 5

The model (`BACKBONE`): the paper benchmarks Keye2B (App. D.2) without stating
its LM's shape; we take a Qwen3-1.7B-class decoder (the LM of the paper's own
SigLIP2 + Qwen3-1.7B comparison, Table 5): 28 layers, d 2048, GQA 16 query / 8
KV heads of 128, SwiGLU FFN 6144 (3·d), RoPE, tied embeddings, bfloat16
activations and parameters, random weights (the paper measures speed). The vocabulary is the repository's byte vocabulary (256, not
Qwen's 152k: a large output head would dilute every overhead), `--vocab` changes it.
Lngram v2 sits in the memory slot of layers 1 and 13 (0-based; the paper's
Table 13 "insertion layers 2, 14" for Keye2B, which its analyses call Layers 1
and 13), with the paper's Keye2B settings wherever a configuration name is
silent: R 121, 4 bits, 2/3-gram tables, memory dim 128, 16 query heads, KV 16,
head dim = memory dim, conv kernel 4 / dilation 3, sink, W_O and conv taps drawn
nonzero so the branch does real work. The eight rows are parsed by
experiments/configs/lm_lngram.py's own arg parser (`r64/m4/KV8` -> `r64,m4,kv8`
on top of those defaults).

Per configuration (B = 1 unless stated):
  prefill   latency at 256 / 512 / 1024 tokens (a cache of T + `--new-tokens`
            slots is built, the last position's logits returned) and its peak
            memory;
  decode    per-token latency after a 1024-token prefill, B = 1 and B = 8:
            `--new-tokens` greedy steps in one `lax.scan` program on a donated
            cache (updated in place; a new prefill, untimed, before each call),
            time / steps, and its peak memory.
Overheads are relative to the baseline (no memory), from the best of
`--repeats` rounds (median also kept); the target is <= +2% for prefill at 1024
and for decode (PASS/FAIL per column), next to the paper's own overhead on an
H800 (r64/m4/KV8: +6.1% prefill at 1024, +8.0% decode).

Compile time: the dense blocks between memory layers run as `lax.scan` over
stacked weights (`DecoderLM(scan=True)`), so a program holds five block bodies
(3 dense scans, 2 memory blocks) instead of 28 blocks. The scanned decode step
is not the model's, though: its compiled loop copied the whole carried K/V stacks
at every layer, 1.8x the unrolled time per token on an H200, and still copies each
layer's K/V slice and weights out of the stacks (`experiments/models/lm.py`; 1.3-1.6x
on CPU, from 2.4x: `experiments.tools.bench.scan_decode`), so the GPU suite times
Table 12 with `--impl loop`, the same `DecoderLM` unrolled (28 blocks: slower to
compile); `--loop-check ROWS`
times just those rows that way (prefill at the longest prompt, decode B = 1)
right after their scanned rows and reports scan / loop time: ~1 means the
scanned numbers are the model's. XLA may copy a layer's weights out of the
stack per scan step on some versions (a cost the unrolled model does not pay,
which would shrink every overhead); `weights_gbps` (backbone parameter bytes /
decode time per token at B = 1) shows whether decode reads the weights at
memory speed (H200: ~4,800 GB/s peak).

Peak memory: with `memory_stats()` (GPU) it is the bytes in use before the call
plus the compiled program's temporaries and outputs (`memory_analysis()`; JAX
cannot reset the device peak counter, whose running value is kept too as
`device_peak_gib`); without it (CPU) the live argument bytes take the place of
the bytes in use. `memory_source` says which (`measure.py`).

Each configuration runs in a worker thread under `--config-limit-s`: a hung
compile costs that row only. The JSON is rewritten after every row. The
layer-level decode table (`--layer-decode`, on by default, run first): one
Lngram v2 layer (r64/m4/KV8/mem128, d 2048, bf16) decoding one token after a
1024-token prefill through `lngram_jax.decode`, B = 1 and 8, `--new-tokens`
steps in one scan; target <= 0.15 ms/token (the authors' module: 1.38 ms).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.params import memory_params as count_memory_params
from experiments.tools.bench.lm_efficiency_table import (
  CONFIGS,
  LAYER_TARGET_MS,
  PAPER,
  PAPER_LENGTHS,
  TARGET,
  report,
  scan_over_loop,
  summarize,
)
from experiments.tools.bench.measure import (
  format_gib,
  memory_source,
  nbytes,
  run_with_limit,
  time_program,
)
from experiments.tools.bench.scan_lm import (
  BACKBONE,
  SMOKE_BACKBONE,
  PureLM,
  build_lm,
  lm_config,
  lngram_config,
)
from lngram_jax.config import READOUTS
from lngram_jax.decode import lngram_decode_step, prefill_decode_state
from lngram_jax.layer import LngramV2

# Run order: the baseline first (every overhead needs it), the paper's headline row
# next, the 1.2B-parameter r512 last (a time limit hits the least informative row).
RUN_ORDER = ("baseline", "r64/m4/KV8", "r16/m4/KV8", "r121/m4/KV16", "r23/m4/KV8/mem256",
             "r16/m5/KV2", "r123/m4/KV2", "r512/m4/KV8/mem256")
SMOKE_LENGTHS = (16, 32, 64)
SMOKE_CONFIGS = ("baseline", "r64/m4/KV8")   # --smoke alone: under a minute on 2 cores
LAYER_DECODE = "r64/m4/KV8"   # the layer-level decode row: mem128 (the default)


# --- one row --------------------------------------------------------------------


def bench_config(name: str, a, log=print) -> dict:
  """Every phase of one row; a phase that would start past the row's limit is skipped."""
  t_start = time.perf_counter()
  lengths = a.lengths
  decode_after = lengths[-1]
  cfg = lm_config(name, smoke=a.smoke, readout=a.readout,
                  max_len=decode_after + a.new_tokens, overrides=a.overrides)
  lm = build_lm(cfg, scan=a.impl == "scan")
  n_params = nbytes(nnx.state(lm, nnx.Param)) // cfg.param_dtype.itemsize
  memory_params = count_memory_params(cfg)[0]
  model = PureLM(lm)
  del lm
  params = model.params
  row = {"name": name, "lngram": None if cfg.memory is None else {
      k: getattr(cfg.memory, k) for k in ("routes", "bits", "orders", "mem_dim", "q_heads",
                                           "kv_heads", "head_dim", "readout")},
         "memory_layers": list(cfg.memory_layers), "params": n_params,
         "memory_params": memory_params, "param_bytes": nbytes(params),
         "backbone_bytes": (n_params - memory_params) * cfg.param_dtype.itemsize,
         "prefill": {}, "decode": {}, "skipped": []}
  rng = np.random.default_rng(0)
  programs = {}   # (B, T) -> compiled prefill

  def over_limit(what):
    if time.perf_counter() - t_start > a.config_limit_s:
      row["skipped"].append(what)
      log(f"  {name}: {what} skipped (row past its {a.config_limit_s:.0f}s limit)")
      return True
    return False

  for T in lengths:
    if over_limit(f"prefill_{T}"):
      continue
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (1, T)), jnp.int32)
    # The longest prompt's cache has room for the decode steps: the same program
    # then builds the B = 1 decode cache.
    fn = functools.partial(model.prefill, cache_len=decode_after + a.new_tokens
                           if T == decode_after else T + a.new_tokens)
    r = time_program(fn, (params, tokens), a.repeats)
    programs[(1, T)] = r.pop("compiled")
    del r["output"]
    row["prefill"][str(T)] = r
    log(f"  {name}: prefill T={T}: {r['best_ms']:.2f} ms (median {r['median_ms']:.2f}), "
        f"{format_gib(r['memory_gib'])}; compile {r['compile_s']:.1f}s")
  for B in a.decode_batches:
    if over_limit(f"decode_b{B}"):
      continue
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (B, decode_after)), jnp.int32)
    prefill = programs.pop((B, decode_after), None) or jax.jit(
        functools.partial(model.prefill, cache_len=decode_after + a.new_tokens))

    def fresh(prefill=prefill, tokens=tokens):
      logits_BxV, cache = prefill(params, tokens)
      return params, cache, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)

    # The cache is donated: decode updates it in place, as a server would, and the
    # decode memory is one cache, not an input and an output copy.
    fn = functools.partial(_decode_tokens, model, steps=a.new_tokens)
    r = time_program(fn, fresh(), a.repeats, donate=(1,), fresh=fresh)
    del r["output"], r["compiled"], prefill
    for key in ("best_ms", "median_ms"):
      r[key.replace("_ms", "_ms_per_token")] = r.pop(key) / a.new_tokens
    if B == 1:   # the backbone's weights are read whole per token; Lngram tables sparsely
      r["weights_gbps"] = row["backbone_bytes"] / (r["best_ms_per_token"] * 1e-3) / 1e9
    row["decode"][str(B)] = r
    log(f"  {name}: decode B={B}: {r['best_ms_per_token']:.3f} ms/token (median "
        f"{r['median_ms_per_token']:.3f}), {format_gib(r['memory_gib'])}; compile "
        f"{r['compile_s']:.1f}s")
  row["wall_s"] = time.perf_counter() - t_start
  return row


def _decode_tokens(model, params, cache, token_B, *, steps):
  """What the decode program returns: the tokens and the final cache (logits dropped)."""
  tokens_BxN, _, cache = model.decode(params, cache, token_B, steps)
  return tokens_BxN, cache


# --- the layer-level decode ----------------------------------------------------


def layer_decode(a, log=print) -> dict:
  """One Lngram v2 layer's decode step, B = 1 and 8, after a `prefill`-token prompt."""
  d = SMOKE_BACKBONE["d_model"] if a.smoke else BACKBONE["d_model"]
  prefill_len = a.lengths[-1]
  cfg = lngram_config(LAYER_DECODE, d, smoke=a.smoke, readout=a.readout)
  layer = LngramV2(cfg, rngs=nnx.Rngs(0))
  k1, k2 = jax.random.split(jax.random.key(1))
  layer.w_o[...] = (0.02 * jax.random.normal(k1, layer.w_o.shape)).astype(layer.w_o[...].dtype)
  layer.conv_kernel[...] = (0.5 * jax.random.normal(k2, layer.conv_kernel.shape)).astype(
      layer.conv_kernel[...].dtype)
  graphdef, state = nnx.split(layer)
  out = {"config": {"name": LAYER_DECODE, "d_model": d, "routes": cfg.routes, "bits": cfg.bits,
                    "mem_dim": cfg.mem_dim, "q_heads": cfg.q_heads, "kv_heads": cfg.kv_heads,
                    "head_dim": cfg.head_dim, "readout": cfg.readout,
                    "dtype": jnp.dtype(cfg.dtype).name},
         "prefill_len": prefill_len, "steps": a.new_tokens, "batches": {}}

  def prefill(state, h_BxTxD):
    return prefill_decode_state(nnx.merge(graphdef, state), h_BxTxD)[1]

  def decode(state, dstate, h_NxBx1xD):
    lyr = nnx.merge(graphdef, state)

    def step(carry, h_Bx1xD):
      dstate, acc_Bx1xD = carry
      y_Bx1xD, dstate = lngram_decode_step(lyr, h_Bx1xD, dstate)
      return (dstate, acc_Bx1xD + y_Bx1xD.astype(jnp.float32)), None

    B = h_NxBx1xD.shape[1]
    (dstate, acc), _ = jax.lax.scan(step, (dstate, jnp.zeros((B, 1, d), jnp.float32)),
                                    h_NxBx1xD)
    return acc, dstate

  for B in a.decode_batches:
    kh, kd = jax.random.split(jax.random.key(10 + B))
    h = jax.random.normal(kh, (B, prefill_len, d), jnp.dtype(cfg.dtype))
    dstate = jax.jit(prefill)(state, h)
    h_steps = jax.random.normal(kd, (a.new_tokens, B, 1, d), jnp.dtype(cfg.dtype))
    r = time_program(decode, (state, dstate, h_steps), a.repeats)
    del r["output"], r["compiled"]
    for key in ("best_ms", "median_ms"):
      r[key.replace("_ms", "_ms_per_token")] = r.pop(key) / a.new_tokens
    r["target_met"] = r["best_ms_per_token"] <= LAYER_TARGET_MS
    out["batches"][str(B)] = r
    log(f"  layer decode B={B}: {r['best_ms_per_token']:.4f} ms/token (median "
        f"{r['median_ms_per_token']:.4f}); compile {r['compile_s']:.1f}s")
  return out


# --- CLI -----------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m experiments.tools.bench.lm_efficiency",
                              description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="tiny shapes: seconds on CPU")
  p.add_argument("--configs", default="",
                 help="comma-separated rows or 'all' (default all eight; smoke: baseline and "
                 "r64/m4/KV8), e.g. baseline,r64/m4/KV8")
  p.add_argument("--lengths", default="",
                 help="prefill lengths, the last one also the decode prompt (256,512,1024; "
                 "smoke 16,32,64)")
  p.add_argument("--repeats", type=int, default=None, help="timed rounds (10; smoke 2)")
  p.add_argument("--new-tokens", type=int, default=None,
                 help="decode steps per timed call (64; smoke 4)")
  p.add_argument("--decode-batches", default="1,8", help="decode batch sizes (1,8)")
  p.add_argument("--impl", choices=("scan", "loop"), default="scan",
                 help="scan: dense blocks in lax.scan (fast compile); loop: the unrolled "
                 "DecoderLM")
  p.add_argument("--readout", choices=READOUTS, default="absorbed",
                 help="the Lngram readout form (absorbed)")
  p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 256)")
  p.add_argument("--memory-layers", default="",
                 help="0-based layers holding Lngram (default 1,13; smoke 1,2)")
  p.add_argument("--config-limit-s", type=float, default=None,
                 help="per-row time limit (default 60; smoke 30)")
  p.add_argument("--layer-decode", action=argparse.BooleanOptionalAction, default=True,
                 help="also the one-layer decode table (on)")
  p.add_argument("--loop-check", default="",
                 help="rows to time again with --impl loop (the repository's DecoderLM) at "
                 "the longest prompt and decode B = 1, as soon as their scanned rows are "
                 "done, e.g. r64/m4/KV8 (the baseline is added)")
  p.add_argument("--budget-s", type=float, default=1e9,
                 help="wall budget of the whole run: no row starts with under 10 s left")
  p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
  a = p.parse_args(argv)
  names = [n for n in a.configs.replace(",", " ").split() if n]
  if names == ["all"]:
    names = list(CONFIGS)
  elif not names and a.smoke:
    names = list(SMOKE_CONFIGS)
  canon = {c.lower(): c for c in CONFIGS}
  bad = [n for n in names if n.lower() not in canon]
  if bad:
    p.error(f"--configs: unknown rows {bad}; known: {', '.join(CONFIGS)}")
  chosen = {canon[n.lower()] for n in names} or set(CONFIGS)
  loop = [n for n in a.loop_check.replace(",", " ").split() if n]
  bad = [n for n in loop if n.lower() not in canon]
  if bad:
    p.error(f"--loop-check: unknown rows {bad}; known: {', '.join(CONFIGS)}")
  a.loop_check = [canon[n.lower()] for n in loop]
  if a.loop_check and "baseline" not in a.loop_check:
    a.loop_check.insert(0, "baseline")
  try:
    a.lengths = tuple(int(t) for t in a.lengths.split(",") if t) or (
        SMOKE_LENGTHS if a.smoke else PAPER_LENGTHS)
  except ValueError:
    p.error(f"--lengths {a.lengths!r}: expected comma-separated ints")
  if min(a.lengths) < 1:
    p.error("--lengths must be >= 1")
  chosen.add("baseline")   # every overhead is relative to it
  a.names = [n for n in RUN_ORDER if n in chosen]
  a.repeats = a.repeats or (2 if a.smoke else 10)
  a.new_tokens = a.new_tokens or (4 if a.smoke else 64)
  a.config_limit_s = a.config_limit_s or (30.0 if a.smoke else 60.0)
  a.decode_batches = tuple(int(b) for b in a.decode_batches.split(",") if b)
  if min(a.repeats, a.new_tokens, *a.decode_batches) < 1:
    p.error("--repeats, --new-tokens and --decode-batches must be >= 1")
  a.overrides = {} if a.vocab is None else {"vocab_size": a.vocab}
  if a.memory_layers:
    try:
      a.overrides["memory_layers"] = tuple(int(i) for i in a.memory_layers.split(",") if i)
    except ValueError:
      p.error(f"--memory-layers {a.memory_layers!r}: expected comma-separated ints")
  return a


def _new_result(a, backbone: dict, lengths: list, device) -> dict:
  """The JSON of a run before its rows: the settings, the device, the paper's Table 12."""
  return {"smoke": a.smoke, "impl": a.impl, "backbone": backbone, "lengths": lengths,
          "decode_batches": list(a.decode_batches), "new_tokens": a.new_tokens,
          "repeats": a.repeats, "readout": a.readout, "target": TARGET,
          "jax_version": jax.__version__, "platform": device.platform,
          "device_kind": device.device_kind, "memory_source": memory_source(),
          "paper": {k: {"prefill_ms": v[0], "prefill_gib": v[1], "decode_ms": v[2],
                        "decode_gib": v[3]} for k, v in PAPER.items()},
          "rows": {}, "summary": {}, "layer_decode": None, "loop_check": None,
          "budget_skipped": []}


def main(argv=None, log=print) -> dict:
  a = parse_args(argv)
  t_main = time.perf_counter()
  device = jax.devices()[0]
  backbone = {**(SMOKE_BACKBONE if a.smoke else BACKBONE), **a.overrides}
  lengths = list(a.lengths)
  log(f"jax {jax.__version__}, {device.platform} ({device.device_kind}); "
      f"{'smoke' if a.smoke else 'paper'} shape {backbone}; impl {a.impl}, readout "
      f"{a.readout}; rows {a.names}; {a.repeats} rounds, {a.new_tokens} decode steps")
  result = _new_result(a, backbone, lengths, device)
  # The loop cross-check: the repository's DecoderLM at the longest prompt, decode B = 1.
  loop_args = argparse.Namespace(**{**vars(a), "impl": "loop", "lengths": a.lengths[-1:],
                                    "decode_batches": (1,)})

  def save():
    result["summary"] = summarize(result["rows"], lengths, a.decode_batches)
    if result["loop_check"] is not None:
      lc = result["loop_check"]
      lc["summary"] = summarize(lc["rows"], loop_args.lengths, loop_args.decode_batches)
      lc["scan_over_loop"] = scan_over_loop(result["rows"], lc["rows"], a.lengths[-1])
    if a.json:
      with open(a.json, "w") as f:
        json.dump(result, f, indent=1, default=float)

  abandoned = False

  def limited(what, fn):
    """fn() under the row limit and what is left of --budget-s; None when skipped."""
    nonlocal abandoned
    left = a.budget_s - (time.perf_counter() - t_main)
    if left < 10:
      result["budget_skipped"].append(what)
      log(f"  {what}: skipped ({a.budget_s:.0f}s budget spent)")
      return None, "skipped: budget"
    t0 = time.perf_counter()
    out, err = run_with_limit(fn, min(a.config_limit_s * 1.5 + 30, left))
    if err:
      abandoned |= err == "timeout"
      log(f"  {what}: {err}")
      out = {"name": what, "error": err, "wall_s": time.perf_counter() - t0}
    return out, err

  if a.layer_decode:   # first: a few small programs, and a row past the step's limit can't lose it
    ld, err = limited("layer decode", functools.partial(layer_decode, a, log=log))
    if ld is not None:
      result["layer_decode"] = ld
      save()

  def loop_check():
    result["loop_check"] = {"impl": "loop", "lengths": list(loop_args.lengths),
                            "decode_batches": [1], "rows": {}}
    for name in a.loop_check:
      row, _ = limited(f"loop {name}", functools.partial(bench_config, name, loop_args,
                                                          log=lambda m: log(f"  [loop]{m}")))
      if row is not None:
        result["loop_check"]["rows"][name] = row
      gc.collect()
      save()

  pending_check = bool(a.loop_check) and a.impl == "scan"
  for name in a.names:
    row, _ = limited(name, functools.partial(bench_config, name, a, log=log))
    if row is not None:
      result["rows"][name] = row
    gc.collect()
    save()
    # The cross-check runs as soon as its rows have their scanned numbers (before the
    # remaining rows: it decides whether the scanned numbers can be trusted).
    if pending_check and all(n in result["rows"] for n in a.loop_check):
      pending_check = False
      loop_check()
  if pending_check:
    loop_check()
  log(report(result))
  if abandoned:   # a wedged worker thread must not keep the process alive
    import os
    import sys
    sys.stdout.flush()
    os._exit(0)
  return result


if __name__ == "__main__":
  main()
