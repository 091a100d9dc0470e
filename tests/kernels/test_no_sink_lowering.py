"""With the sink off (b0 = -inf) the Pallas readouts still lower for CUDA and TPU.

Lowered on CPU (DESIGN.md §5), at the paper's r23/m4/KV8/mem256 shapes (Hq = 16,
Dh = 256, so Hq·Dh = 4096 ≠ d = 2048): the layer's `pallas` readout (Triton and
Mosaic) and its `pallas_fused` read (Triton), forward and backward, with b0 = -inf
compiled in as a constant.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from lowering import KERNEL_CALL, lower_text

from lngram_jax import LngramConfig, LngramV2, core
from lngram_jax.fused import FusedSpec, fused_readout

CONFIG = LngramConfig(d_model=2048, routes=23, bits=4, orders=(2, 3), mem_dim=256, q_heads=16,
                      kv_heads=8, head_dim=256, sink=False, readout="pallas")
B, T = 1, 16
_MINUS_INF = "0xFF800000"  # float32 -inf as the MLIR text prints it


def _param_avals():
  return jax.eval_shape(lambda: LngramV2(CONFIG, rngs=nnx.Rngs(0)).param_arrays())


def _loss(read, p, h):
  y, trace = core.forward(p, CONFIG, h, read=read)
  return jnp.sum(y) + jnp.sum(trace.lse_BxTxHq)


def _pallas_read(implementation, p, config, q, logits):
  from lngram_jax.pallas import pallas_readout
  readout = functools.partial(pallas_readout, return_lse=True, implementation=implementation,
                              interpret=False)
  lookup = core.plain_lookup(config)
  return core.read_memory(p, config, q, logits, lookup=lookup, readout=readout)


def _fused_read(p, config, q, logits):
  return fused_readout(q, logits, p, FusedSpec(config, interpret=False))


@pytest.mark.parametrize("name", ["triton", "mosaic_tpu", "fused_triton"])
def test_layer_readouts_without_sink_lower(name):
  assert CONFIG.sink_logit == float("-inf")
  if name == "fused_triton":
    read, platform = _fused_read, "cuda"
  else:
    read = functools.partial(_pallas_read, name)
    platform = "cuda" if name == "triton" else "tpu"
  avals = (_param_avals(), jax.ShapeDtypeStruct((B, T, CONFIG.d_model), jnp.float32))
  loss = functools.partial(_loss, read)
  forward_text = lower_text(loss, avals, platform)
  backward_text = lower_text(jax.grad(loss, argnums=(0, 1)), avals, platform)
  assert forward_text.count(KERNEL_CALL[platform]) == 1
  assert backward_text.count(KERNEL_CALL[platform]) == 2  # forward + backward kernels
  assert _MINUS_INF in forward_text
