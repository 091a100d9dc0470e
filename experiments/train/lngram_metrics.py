"""Diagnostics of Lngram layers: how the router uses its codes and the tables.

Accumulated over evaluation batches from the model's aux outputs of the
memory slots holding Lngram (`memory/<layer>/codes` [B, T, R] and
`memory/<layer>/route_mass` [B, T, Hq]); the summaries are named
`lngram/<layer>/...`:

  route_mass      mean probability mass on real routes (the rest is the sink).
  effective_codes exp(entropy) of each route's code histogram, averaged over
                  routes: C when every code is used equally, 1 when one is.
  dead_code_frac  share of (route, code) pairs never emitted.
  rows_touched/n  share of the order-n table's rows read by some valid window.

`accumulate_stats` runs inside jit (histograms as sums); `summarise` turns the
summed host arrays into flat slash-named scalars.
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


def accumulate_stats(aux: dict, lngram_config, segment_ids_BxT, valid_BxT) -> dict:
  """Per-batch sums for every Lngram layer in `aux` (jit-friendly)."""
  c = lngram_config
  w_BxT = valid_BxT.astype(jnp.float32)
  stats = {}
  for layer in lngram_layers(aux):
    codes_BxTxR = aux[f"memory/{layer}/codes"]
    mass_BxT = aux[f"memory/{layer}/route_mass"].astype(jnp.float32).mean(-1)
    stats[f"{layer}/mass_sum"] = (mass_BxT * w_BxT).sum()
    stats[f"{layer}/tokens"] = w_BxT.sum()
    stats[f"{layer}/codes"] = code_histogram(codes_BxTxR, valid_BxT, c.codes_per_route)
    for n in c.orders:
      stats[f"{layer}/rows/{n}"] = rows_touched(
          codes_BxTxR, segment_ids_BxT, valid_BxT, order=n, bits=c.bits)
  return stats


def merge_stats(total: dict | None, batch: dict) -> dict:
  """Host-side running merge: sums, except rows-touched indicators (max)."""
  batch = {k: np.asarray(v) for k, v in batch.items()}
  if total is None:
    return batch
  return {k: np.maximum(total[k], v) if "/rows/" in k else total[k] + v
          for k, v in batch.items()}


def effective_codes(counts_RxC: np.ndarray) -> np.ndarray:
  """exp(entropy) of each route's code distribution: [R]."""
  counts_RxC = np.asarray(counts_RxC, np.float64)
  p_RxC = counts_RxC / np.maximum(counts_RxC.sum(-1, keepdims=True), 1.0)
  logp = np.log(np.where(p_RxC > 0, p_RxC, 1.0))
  return np.exp(-(p_RxC * logp).sum(-1))


def summarise(stats: dict) -> dict[str, float]:
  """Flat `lngram/<layer>/...` scalars from merged stats."""
  out = {}
  layers = sorted({int(k.split("/")[0]) for k in stats})
  for layer in layers:
    tokens = max(float(stats[f"{layer}/tokens"]), 1.0)
    mass = float(stats[f"{layer}/mass_sum"]) / tokens
    counts_RxC = stats[f"{layer}/codes"]
    out[f"lngram/{layer}/route_mass"] = mass
    out[f"lngram/{layer}/sink_mass"] = 1.0 - mass
    out[f"lngram/{layer}/effective_codes"] = float(effective_codes(counts_RxC).mean())
    out[f"lngram/{layer}/dead_code_frac"] = float((counts_RxC == 0).mean())
    for key in sorted(k for k in stats if k.startswith(f"{layer}/rows/")):
      n = key.rsplit("/", 1)[1]
      out[f"lngram/{layer}/rows_touched/{n}"] = float(stats[key].mean())
  return out
