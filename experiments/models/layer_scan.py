"""Runs of branch-free blocks stacked and run as one `jax.lax.scan` (`DecoderLM(scan=True)`).

`layer_spans` cuts the layers into entries of `DecoderLM.blocks`: one layer each,
or (scan) every run of two or more layers without a branch and of one FFN kind as
one entry. `stack_blocks` stacks a run's parameters on a leading layer axis (the
same weights as the unrolled blocks); `scan_blocks` runs a body over that axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.block import Block
from experiments.models.config import LMConfig


def layer_spans(config: LMConfig, scan: bool) -> tuple[tuple[int, int], ...]:
  """[start, stop) of each entry of `DecoderLM.blocks`: one layer each, or with `scan`
  every run of two or more layers without a memory or beside-FFN branch, and of one
  FFN kind (dense or MoE: stacked blocks must share their parameter shapes), as one."""
  if not scan:
    return tuple((i, i + 1) for i in range(config.n_layers))
  n = config.n_layers
  branched = set(config.memory_layers) | set(config.ffn_branch_layers)
  moe = set(config.moe_layers)
  spans, start = [], 0
  for i in range(n + 1):
    if i < n and i not in branched and (i == start or (i in moe) == (start in moe)):
      continue   # the run from `start` goes on
    if i > start:
      spans.append((start, i))
    if i < n and i in branched:
      spans.append((i, i + 1))
      start = i + 1
    else:
      start = i
  return tuple(spans)


def stack_blocks(blocks) -> Block:
  """One Block whose every parameter is those of `blocks` stacked on a new axis 0."""
  splits = [nnx.split(block) for block in blocks]
  return nnx.merge(splits[0][0], jax.tree.map(lambda *xs: jnp.stack(xs), *(s for _, s in splits)))


def scan_blocks(stack: Block, body, carry, xs=None):
  """`jax.lax.scan` of body(block, carry, x) over the layers of a stacked Block."""
  graphdef, state = nnx.split(stack)
  return jax.lax.scan(lambda c, sx: body(nnx.merge(graphdef, sx[0]), c, sx[1]), carry,
                      (state, xs))
