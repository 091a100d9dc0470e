"""The MoE FFN against the dense FFN of equal active parameters, and its dispatches.

    python -m experiments.tools.bench.moe_efficiency [--tokens=2048 --d_model=256 ...]

One program per row, in the same process: forward + backward (the gradient of
Σ y·r with respect to the parameters and x, jitted) over `tokens` tokens of
width d_model, timed with experiments.tools.bench.measure.time_program:

  dense       SwiGLU of width F = top_k·H + shared width: the MoE's active
              expert parameters (3·d·F; the router's d·E not matched)
  grouped     MoEFFN, dispatch "grouped" (sort + jax.lax.ragged_dot)
  reference   MoEFFN, dispatch "reference" (the per-token loop twin)

Prints the parameter counts and a markdown table with each row's best time and
its ratio to the dense FFN (and grouped / reference).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.layers import SwiGLU
from experiments.models.moe import MoEConfig, MoEFFN, param_count
from experiments.tools.bench.measure import time_program


def _fwd_bwd(module, x_BxTxD, call):
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  r_BxTxD = jax.random.normal(jax.random.key(2), x_BxTxD.shape, x_BxTxD.dtype)

  def fn(params, x_BxTxD):
    def objective(params, x_BxTxD):
      return jnp.sum(call(nnx.merge(graphdef, params, rest), x_BxTxD) * r_BxTxD)
    return jax.grad(objective, argnums=(0, 1))(params, x_BxTxD)

  return fn, (params, x_BxTxD)


def rows(args) -> list[tuple[str, float]]:
  moe = MoEConfig(d_model=args.d_model, n_experts=args.experts, top_k=args.top_k,
                  expert_ffn_dim=args.expert_dim, n_shared_experts=args.shared)
  width = args.top_k * args.expert_dim + moe.shared_width
  x_BxTxD = jax.random.normal(jax.random.key(1), (1, args.tokens, args.d_model), jnp.float32)
  dense = SwiGLU(args.d_model, width, dtype=jnp.float32, param_dtype=jnp.float32,
                 init_std=0.02, out_std=0.02, rngs=nnx.Rngs(0))
  counts = param_count(moe)
  print(f"tokens {args.tokens}, d {args.d_model}, E {args.experts}, top-{args.top_k}, "
        f"H {args.expert_dim}, shared {args.shared}: MoE {counts['total']:,} parameters, "
        f"{counts['active']:,} active; dense width {width}: {3 * args.d_model * width:,}")
  out = [("dense", lambda m, x: m(x), dense)]
  for dispatch in ("grouped", "reference"):
    module = MoEFFN(moe.replace(dispatch=dispatch), init_std=0.02, rngs=nnx.Rngs(0))
    out.append((dispatch, lambda m, x: m(x)[0], module))
  timed = []
  for name, call, module in out:
    fn, fn_args = _fwd_bwd(module, x_BxTxD, call)
    timed.append((name, time_program(fn, fn_args, args.repeats)["best_ms"]))
  return timed


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=2048)
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--experts", type=int, default=8)
  parser.add_argument("--top_k", type=int, default=2)
  parser.add_argument("--expert_dim", type=int, default=256)
  parser.add_argument("--shared", type=int, default=1)
  parser.add_argument("--repeats", type=int, default=5)
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  timed = dict(rows(args))
  print("| FFN (forward + backward) | best ms | / dense |\n| --- | ---: | ---: |")
  for name, ms in timed.items():
    print(f"| {name} | {ms:.2f} | {ms / timed['dense']:.2f}x |")
  print(f"\ngrouped / reference: {timed['grouped'] / timed['reference']:.3f}x")
  return timed


if __name__ == "__main__":
  main()
