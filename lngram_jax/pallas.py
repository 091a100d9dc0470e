"""The absorbed readout with the Pallas sink-readout kernel as its core.

    o, lse = pallas_readout(q, x̂, W_K, W_V, sink_logit=b0, return_lse=True)

Same contract and maths as `readout.absorbed_readout`: the query is absorbed
into the route-token space (q̃ = W_K^κ Q), the kernel
(`kernels.sink_readout.sink_readout_kernel`, on BT = B·T flattened tokens) runs the multi-query
sink attention over x̂, and the result is projected by W_V. This is
`LngramConfig(readout="pallas")`; on CPU the kernel runs in interpret mode.
"""

from __future__ import annotations

import functools

from kernels.sink_readout import sink_readout_kernel
from lngram_jax.readout import absorbed_readout, mqa_sink_attention


def pallas_attention(q_BxTxHqxDr, mem_BxTxRxDr, *, sink_logit, scale, **kernel_options):
  """`mqa_sink_attention`'s contract on [B, T, ...] arrays, by the kernel over BT = B·T tokens."""
  core = functools.partial(sink_readout_kernel, **kernel_options)
  return mqa_sink_attention(q_BxTxHqxDr, mem_BxTxRxDr, sink_logit=sink_logit, scale=scale,
                            core=core)


def pallas_readout(q_BxTxHqxDh, mem_hat_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *,
                   sink_logit, return_lse=False, **kernel_options):
  """The absorbed readout with the kernel as its core.

  Same contract as `absorbed_readout`: o_BxTxHqxDh and, with `return_lse`,
  lse_BxTxHq. `kernel_options` go to `sink_readout_kernel` (implementation,
  block_sizes, interpret, backward).
  """
  attention = functools.partial(pallas_attention, **kernel_options)
  return absorbed_readout(q_BxTxHqxDh, mem_hat_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh,
                          sink_logit=sink_logit, return_lse=return_lse, attention=attention)
