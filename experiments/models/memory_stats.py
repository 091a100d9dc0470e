"""Statistics of discrete memory codes, shared by the branches' evaluation metrics.

Lngram v2 (experiments/models/branches.py) and Lngram v1 (arms/lngram_v1.py)
report how their routers use the codes and the tables through the metrics
protocol (experiments/jobs/metrics.py); these are the pieces they compute
with. `code_histogram` and `rows_touched` run inside jit (histograms as
sums); `effective_codes` runs on the summed host arrays.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lngram_jax.addressing import ngram_rows


def lngram_layers(aux: dict) -> list[int]:
  """Layers whose memory slot reported Lngram codes in a model's aux dict, ascending."""
  return sorted({int(k.split("/")[1]) for k in aux
                 if k.startswith("memory/") and k.endswith("/codes")})


def code_histogram(codes_BxTxR, valid_BxT, codes_per_route: int):
  """Counts [R, C] of each route's codes over valid tokens."""
  R, C = codes_BxTxR.shape[-1], codes_per_route
  flat_BxTxR = codes_BxTxR.astype(jnp.int32) + jnp.arange(R, dtype=jnp.int32) * C
  weights_BxTxR = jnp.broadcast_to(valid_BxT[:, :, None], codes_BxTxR.shape)
  counts = jnp.zeros((R * C,), jnp.float32).at[flat_BxTxR.reshape(-1)].add(
      weights_BxTxR.reshape(-1).astype(jnp.float32))
  return counts.reshape(R, C)


def rows_touched(codes_BxTxR, segment_ids_BxT, valid_BxT, *, order: int, bits: int):
  """Indicator [R·C^n] of table rows read by a valid window of order n."""
  R = codes_BxTxR.shape[-1]
  rows_BxTxR, ok_BxT = ngram_rows(codes_BxTxR, order=order, bits=bits,
                                  segment_ids=segment_ids_BxT, valid=valid_BxT)
  hit_BxTxR = jnp.broadcast_to(ok_BxT[:, :, None], rows_BxTxR.shape).astype(jnp.float32)
  touched = jnp.zeros((R * 2 ** (bits * order),), jnp.float32)
  return touched.at[rows_BxTxR.reshape(-1)].max(hit_BxTxR.reshape(-1))


def effective_codes(counts_RxC: np.ndarray) -> np.ndarray:
  """exp(entropy) of each route's code distribution: [R]."""
  counts_RxC = np.asarray(counts_RxC, np.float64)
  p_RxC = counts_RxC / np.maximum(counts_RxC.sum(-1, keepdims=True), 1.0)
  logp = np.log(np.where(p_RxC > 0, p_RxC, 1.0))
  return np.exp(-(p_RxC * logp).sum(-1))
