"""The PVM decode-cost bench (experiments/tools/bench/pvm_decode_cost.py) at CI widths.

Timings are not checked (a shared CI machine); what is: the three models share
one backbone that equals a freshly built base model, PVM with a closed gate
decodes the base model's tokens, and the projection to the paper's depth is the
stated arithmetic.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.tools.bench import pvm_decode_cost as bench

SHAPE = dict(batch=2, prompt=5, visual=6, new_tokens=4)


def _cfg(depth, pvm):
  return bench.lm_config("tiny", depth, pvm=pvm, max_len=16, dtype="float32")


def test_shared_backbone_is_the_base_model_and_a_closed_gate_changes_nothing():
  pvm = bench.build(_cfg(2, True))
  base = bench.sharing(pvm, _cfg(2, False))
  fresh = bench.DecoderLM(_cfg(2, False), rngs=nnx.Rngs(0))
  a, b = nnx.state(base, nnx.Param), nnx.state(fresh, nnx.Param)
  assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))
  run = bench._decode_program(SHAPE["new_tokens"])
  kw = dict(batch=2, prompt=5, visual=6, new_tokens=4)
  open_tokens = np.asarray(run(*bench.prepared(pvm, **kw)))
  pvm.blocks[1].ffn_branch.gate[...] = jnp.zeros((), jnp.float32)
  closed = np.asarray(run(*bench.prepared(pvm, **kw)))
  np.testing.assert_array_equal(closed, np.asarray(run(*bench.prepared(base, **kw))))
  assert open_tokens.shape == (4, 2)


def test_projection_to_the_papers_depth():
  # t(L) = 2 + 1·L ms and 0.1 ms per branch -> 36 layers, 3 branches: 38 -> 38.3 ms.
  times = {"base_l1": [3e-3, 4e-3], "base_l2": [4e-3], "pvm_l2": [4.1e-3]}
  s = bench.summarize(times, (1, 2))
  assert math.isclose(s["per_layer_ms"], 1.0) and math.isclose(s["fixed_ms"], 2.0)
  assert math.isclose(s["per_branch_ms"], 0.1, rel_tol=1e-9)
  assert math.isclose(s["projected"]["ratio"], 38.3 / 38.0)
  assert math.isclose(s["measured_ratio"], 4.1 / 4.0)
  assert math.isclose(s["paper"]["ratio"], 25.46 / 24.28)
  assert "ratio 1.0079" in bench.report(s, (1, 2))
