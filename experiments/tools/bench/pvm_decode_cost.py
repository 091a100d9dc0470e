"""Decode cost of PVM at Qwen3-VL widths: ms per token with and without the branches.

    python -m experiments.tools.bench.pvm_decode_cost [--widths 8b|4b|tiny] [--depths 1,2]
        [--new-tokens 16 --batch 1 --prompt 64 --visual 256 --repeats 3 --json PATH]

What decoding costs is the text decoder: Qwen3-VL's vision tower, DeepStack
adds and multimodal position ids act at the prefill only (after the image,
all three MRoPE position components advance together, an ordinary RoPE
step), and PVM's keys and values of the image are computed once, at the
prefill, into its `VisualCache`. So each decode step here runs the decoder of
the chosen widths (Qwen3 options: q/k norms) on one new token per row, with
the KV cache and, in the PVM model, the visual cache of `--visual` image
tokens. Full depth (36 layers) does not fit a CPU, so three models are timed (sharing one copy of the backbone weights):

    base at depth L1, base at depth L2, PVM at depth L2 (one branch, last layer)

giving a per-layer cost a = (t2 - t1)/(L2 - L1), a fixed cost c = t1 - L1·a
(embedding, final norm, the vocabulary projection) and a per-branch cost
b = t_pvm - t2. The reported figures: the measured ratio t_pvm / t2 at depth
L2, and the projection to the paper's model, (c + 36a + 3b) / (c + 36a), with
PVM at 3 of 36 layers (paper, Qwen3-VL-8B on one H200 in bfloat16: 24.28 ->
25.46 ms/token, +4.9%). Random weights, λ = 0.5; calls alternate between the models so they
see the same machine load; compilation is excluded (one warm-up call each).
Embeddings are tied here (the decode FLOPs are the same; the memory is not).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.branches import BranchContext, PVMBranchConfig
from experiments.models.config import LMConfig
from experiments.models.lm import DecoderLM
from experiments.tools.bench import targets

PAPER = {"base_ms": 24.28, "pvm_ms": 25.46, "layers": 36, "branches": 3}
GATE = 0.5
# Qwen3-VL text decoders (their config.json text_config): D, FFN, heads, KV heads, head dim.
WIDTHS = {
    "8b": dict(d_model=4096, ffn_dim=12288, n_heads=32, n_kv_heads=8, head_dim=128,
               vocab_size=151936),
    "4b": dict(d_model=2560, ffn_dim=9728, n_heads=32, n_kv_heads=8, head_dim=128,
               vocab_size=151936),
    "tiny": dict(d_model=64, ffn_dim=192, n_heads=4, n_kv_heads=2, head_dim=16,
                 vocab_size=128),
}
LATENT = {"8b": 512, "4b": 512, "tiny": 32}   # the paper's d' (tiny: the CI shape)


def lm_config(widths: str, depth: int, *, pvm: bool, max_len: int, dtype: str,
              vocab: int | None = None) -> LMConfig:
  """The decoder of `widths` at `depth`, PVM at its last layer when `pvm`."""
  w = dict(WIDTHS[widths])
  if vocab:
    w["vocab_size"] = vocab
  base = LMConfig(n_layers=depth, max_len=max_len, rope_theta=5e6, tie_embeddings=True,
                  qk_norm=True, norm_scale_in_dtype=True, dtype=dtype, param_dtype=dtype, **w)
  if not pvm:
    return base
  branch = PVMBranchConfig(d_model=base.d_model, latent_dim=LATENT[widths],
                           head_dim=base.head_dim,
                           backbone_gqa_ratio=base.n_heads // base.n_kv_heads,
                           backbone_ffn_dim=base.ffn_dim, eps=base.norm_eps,
                           dtype=base.dtype, param_dtype=base.param_dtype)
  return base.replace(ffn_branch_layers=(depth - 1,), ffn_branch=branch)


def build(config: LMConfig) -> DecoderLM:
  """The model of `config`, seed 0 (branches are drawn after the backbone), gates at GATE."""
  model = DecoderLM(config, rngs=nnx.Rngs(0))
  for i in config.ffn_branch_layers:
    g = model.blocks[i].ffn_branch.gate
    g[...] = jnp.asarray(GATE, g[...].dtype)
  return model


def sharing(source: DecoderLM, config: LMConfig) -> DecoderLM:
  """The model of `config` (no branches, depth <= source's) holding `source`'s arrays.

  jax arrays are immutable, so the models share one copy of the backbone: at
  8B widths one copy is what fits a CPU machine's memory.
  """
  model = nnx.eval_shape(lambda: DecoderLM(config, rngs=nnx.Rngs(0)))
  theirs = dict(nnx.to_flat_state(nnx.state(source, nnx.Param)))
  nnx.update(model, nnx.from_flat_state(
      {path: theirs[path] for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}))
  return model


def _decode_program(new_tokens: int):
  """jit(state, cache, token) -> tokens: `new_tokens` greedy cached decode steps."""

  @jax.jit
  def run(graphdef, state, cache, tok_B):
    model = nnx.merge(graphdef, state)

    def step(carry, _):
      cache, tok_B = carry
      logits_BxV, cache = model.decode_step(tok_B[:, None], cache)
      tok_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
      return (cache, tok_B), tok_B

    return jax.lax.scan(step, (cache, tok_B), None, length=new_tokens)[1]

  return run


def prepared(model: DecoderLM, *, batch: int, prompt: int, visual: int, new_tokens: int):
  """(graphdef, state, cache after a prefill over [image | prompt], first token)."""
  c = model.config
  key_v, key_t = jax.random.split(jax.random.key(1))
  v_BxNvxD = jax.random.normal(key_v, (batch, visual, c.d_model), jnp.float32).astype(c.dtype)
  tokens_BxT = jax.random.randint(key_t, (batch, prompt), 0, c.vocab_size)
  S = visual + prompt
  ctx = BranchContext(text_mask_BxT=jnp.broadcast_to(jnp.arange(S) >= visual, (batch, S)),
                      visual_BxNvxD=v_BxNvxD)

  @nnx.jit(static_argnames="cache_len")
  def prefill(model, x, cache_len):
    return model.prefill_embedded(x, cache_len=cache_len, context=ctx)

  x_BxSxD = jnp.concatenate([v_BxNvxD, model.embed(tokens_BxT)], axis=1)
  logits, cache = prefill(model, x_BxSxD, S + new_tokens + 1)
  graphdef, state = nnx.split(model)
  return graphdef, state, cache, jnp.argmax(logits[:, -1], -1).astype(jnp.int32)


def time_decode(models: dict, *, batch: int, prompt: int, visual: int, new_tokens: int,
                repeats: int, log=print) -> dict:
  """{name: [seconds per decoded token, one per round]}, rounds alternating models."""
  run = _decode_program(new_tokens)
  ready = {n: prepared(m, batch=batch, prompt=prompt, visual=visual, new_tokens=new_tokens)
           for n, m in models.items()}
  for name, args in ready.items():
    t0 = time.perf_counter()
    jax.block_until_ready(run(*args))
    log(f"{name}: compile + first call {time.perf_counter() - t0:.1f}s")
  times = {name: [] for name in models}
  for _ in range(repeats):
    for name, args in ready.items():
      t0 = time.perf_counter()
      jax.block_until_ready(run(*args))
      times[name].append((time.perf_counter() - t0) / new_tokens)
  return times


def summarize(times: dict, depths: tuple[int, int]) -> dict:
  """Per-token ms (best round), the measured ratio and the projection to 36 layers / 3 branches."""
  L1, L2 = depths
  t1, t2, tp = (1e3 * min(times[k]) for k in ("base_l1", "base_l2", "pvm_l2"))
  a = (t2 - t1) / (L2 - L1)
  c = t1 - L1 * a
  b = tp - t2
  full_base = c + PAPER["layers"] * a
  full_pvm = full_base + PAPER["branches"] * b
  return {
      "ms_per_token": {"base_l1": t1, "base_l2": t2, "pvm_l2": tp},
      "median_ms_per_token": {k: 1e3 * float(np.median(v)) for k, v in times.items()},
      "per_layer_ms": a, "fixed_ms": c, "per_branch_ms": b,
      "measured_ratio": tp / t2,
      "projected": {"layers": PAPER["layers"], "branches": PAPER["branches"],
                    "base_ms": full_base, "pvm_ms": full_pvm,
                    "ratio": full_pvm / full_base if full_base > 0 else None},
      "paper": {**PAPER, "ratio": PAPER["pvm_ms"] / PAPER["base_ms"]},
  }


def report(s: dict, depths) -> str:
  m, p = s["ms_per_token"], s["projected"]
  ratio = "n/a (per-layer time <= 0: too noisy)" if p["ratio"] is None else f"{p['ratio']:.4f}"
  return "\n".join([
      f"decode ms/token: base depth {depths[0]} {m['base_l1']:.3f}, base depth {depths[1]} "
      f"{m['base_l2']:.3f}, PVM depth {depths[1]} {m['pvm_l2']:.3f}",
      f"per layer {s['per_layer_ms']:.3f} ms, fixed {s['fixed_ms']:.3f} ms, per PVM branch "
      f"{s['per_branch_ms']:.3f} ms",
      f"measured PVM/base at depth {depths[1]}: {s['measured_ratio']:.4f}",
      f"projected to {p['layers']} layers, {p['branches']} branches: {p['base_ms']:.2f} -> "
      f"{p['pvm_ms']:.2f} ms/token, ratio {ratio} (paper {s['paper']['ratio']:.4f}: "
      f"{PAPER['base_ms']} -> {PAPER['pvm_ms']} ms on an H200)"])


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m experiments.tools.bench.pvm_decode_cost",
                              description=__doc__.splitlines()[0])
  p.add_argument("--widths", choices=sorted(WIDTHS), default="8b")
  p.add_argument("--depths", default="1,2", help="L1,L2: the two depths timed (L1 < L2)")
  p.add_argument("--new-tokens", type=int, default=16)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--prompt", type=int, default=64)
  p.add_argument("--visual", type=int, default=256, help="image tokens (after the merger)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--vocab", type=int, default=None, help="override the vocabulary size")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
  a = p.parse_args(argv)
  try:
    a.depths = tuple(int(s) for s in a.depths.split(","))
  except ValueError:
    p.error(f"--depths={a.depths!r}: expected L1,L2")
  if len(a.depths) != 2 or not 1 <= a.depths[0] < a.depths[1]:
    p.error(f"--depths={a.depths}: expected two depths 1 <= L1 < L2")
  if min(a.new_tokens, a.batch, a.prompt, a.visual, a.repeats) < 1:
    p.error("--new-tokens, --batch, --prompt, --visual and --repeats must be >= 1")
  return a


def main(argv=None) -> dict:
  a = parse_args(argv)
  L1, L2 = a.depths
  max_len = a.visual + a.prompt + a.new_tokens + 1
  kw = dict(max_len=max_len, dtype=a.dtype, vocab=a.vocab)
  pvm = build(lm_config(a.widths, L2, pvm=True, **kw))
  models = {"base_l1": sharing(pvm, lm_config(a.widths, L1, pvm=False, **kw)),
            "base_l2": sharing(pvm, lm_config(a.widths, L2, pvm=False, **kw)),
            "pvm_l2": pvm}
  device = jax.devices()[0]
  w = WIDTHS[a.widths]
  print(f"jax {jax.__version__}, {device.platform} ({device.device_kind}); Qwen3-VL-{a.widths} "
        f"widths {w}, {a.dtype}; depths {a.depths}; PVM latent {LATENT[a.widths]} at the last "
        f"layer; batch {a.batch}, prompt {a.prompt}, {a.visual} image tokens, "
        f"{a.new_tokens} new tokens, {a.repeats} rounds")
  times = time_decode(models, batch=a.batch, prompt=a.prompt, visual=a.visual,
                      new_tokens=a.new_tokens, repeats=a.repeats)
  summary = summarize(times, a.depths)
  summary["setup"] = {"widths": a.widths, "dtype": a.dtype, "depths": list(a.depths),
                      "batch": a.batch, "prompt": a.prompt, "visual": a.visual,
                      "new_tokens": a.new_tokens, "repeats": a.repeats,
                      "vocab": a.vocab or w["vocab_size"], "jax": jax.__version__,
                      "device": f"{device.platform} ({device.device_kind})"}
  print(report(summary, a.depths))
  summary["targets"] = targets.pvm_decode_lines(summary)
  print("\n".join(summary["targets"]))
  if a.json:
    with open(a.json, "w") as f:
      json.dump(summary, f, indent=1)
  return summary


if __name__ == "__main__":
  main()
