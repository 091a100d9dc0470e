"""Short depthwise causal convolution (paper §2.4: kernel 4, dilation 3).

y[t, c] = Σ_i w[i, c]·x[t - (W-1-i)·dilation, c]: tap W-1 is the current step,
left zero padding (W-1)·dilation, and a tap that reaches into an earlier packed
segment reads zero.
"""

from __future__ import annotations

import jax.numpy as jnp

from lngram_jax import checks
from lngram_jax.addressing import shift_right


def short_conv(x_BxTxD, kernel_WxD, *, dilation: int, segment_ids=None):
  """Depthwise causal conv with per-segment zero padding."""
  checks.check_rank("x", x_BxTxD, 3, "[B, T, D]")
  checks.check_rank("kernel", kernel_WxD, 2, "[W, D]")
  if kernel_WxD.shape[1] != x_BxTxD.shape[2]:
    raise ValueError(
        f"kernel {tuple(kernel_WxD.shape)} must have D={x_BxTxD.shape[2]} channels.")
  if dilation < 1:
    raise ValueError(f"short_conv: dilation={dilation} must be >= 1.")
  B, T, _ = x_BxTxD.shape
  checks.check_mask("segment_ids", segment_ids, (B, T))
  W = kernel_WxD.shape[0]
  acc = jnp.promote_types(x_BxTxD.dtype, jnp.float32)
  y_BxTxD = jnp.zeros(x_BxTxD.shape, acc)
  for tap in range(W):
    back = (W - 1 - tap) * dilation
    x_back = shift_right(x_BxTxD, back)
    if segment_ids is not None and back:
      same_BxT = shift_right(segment_ids, back, fill=-1) == segment_ids
      x_back = jnp.where(same_BxT[:, :, None], x_back, 0).astype(x_back.dtype)  # select
    y_BxTxD += x_back.astype(acc) * kernel_WxD[tap].astype(acc)
  return y_BxTxD.astype(x_BxTxD.dtype)
