"""RMSNorm as a function: statistics in float32 (or wider), output in x's dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x_xD, scale_D=None, *, eps: float = 1e-6):
  """x / sqrt(mean(x²) + eps) · scale over the last axis; scale None = affine-free."""
  acc = jnp.promote_types(x_xD.dtype, jnp.float32)
  x = x_xD.astype(acc)
  y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  if scale_D is not None:
    y = y * scale_D.astype(acc)
  return y.astype(x_xD.dtype)
