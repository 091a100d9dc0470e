"""What the records read from the model: each memory layer's input, router logits and codes
at the sampled positions (experiments/analysis/records.py).

A file runs through the model one window at a time ([k·seq_len, (k+1)·seq_len), never
packed with another file), and only the windows that hold a sampled position run.
"""

from __future__ import annotations

import inspect
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.branches import BranchContext


def memory_bits(model, layer: int) -> int:
  """M, the bits per route of the layer's Lngram router."""
  return int(model.blocks[layer].memory.config.bits)


def router_logits(block, h_BxTxD):
  """[B, T, R, M] router logits of the block's memory branch.

  Lngram v1's router also takes the block's pre-attention norm weight.
  """
  memory = block.memory
  if "norm_scale_D" in inspect.signature(memory.router_logits).parameters:
    return memory.router_logits(h_BxTxD, block.attn_norm.scale[...])
  return memory.router_logits(h_BxTxD)


@nnx.jit
def layer_reads(model, tokens_BxT, valid_BxT):
  """layer -> (h [B, T, D], z [B, T, R·M], codes [B, T, R]) for every memory layer."""
  _, aux = model(tokens_BxT, valid=valid_BxT, return_aux=True,
                 context=BranchContext(probe=True))
  B, T = tokens_BxT.shape
  out = {}
  for i in model.config.memory_layers:
    # Layer i's input is block i-1's output (the embedding for layer 0).
    h_BxTxD = model.embed(tokens_BxT) if i == 0 else aux[f"block/{i - 1}/hidden"]
    z_BxTxRxM = router_logits(model.blocks[i], h_BxTxD)
    codes = aux.get(f"memory/{i}/codes", aux.get(f"memory/{i}/router_codes"))
    out[i] = (h_BxTxD.astype(jnp.float32), z_BxTxRxM.reshape(B, T, -1).astype(jnp.float32),
              codes.astype(jnp.int32))
  return out


def read_windows(model, docs, file_ids, offsets, *, seq_len, batch_size, progress, label):
  """h, z, codes dicts (layer -> [P, ...]) read from the windows holding the positions."""
  P = file_ids.size
  window = offsets.astype(np.int64) // seq_len
  # Unique (file, window) pairs in order; `slot` maps each position to its pair.
  keys = file_ids.astype(np.int64) * (1 << 32) + window
  pairs, slot = np.unique(keys, return_inverse=True)
  slot = slot.reshape(-1)
  h, z, codes = {}, {}, {}
  n_batches = -(-pairs.size // batch_size)
  bar = Progress(n_batches, label=f"records[{label}]", enabled=progress)
  for b in range(n_batches):
    chunk = pairs[b * batch_size:(b + 1) * batch_size]
    tokens = np.zeros((batch_size, seq_len), np.int32)
    valid = np.ones((batch_size, seq_len), bool)  # padding rows: harmless zeros
    for row, key in enumerate(chunk):
      doc = docs[int(key >> 32)]
      piece = doc[int(key & 0xFFFFFFFF) * seq_len:][:seq_len]
      tokens[row, :piece.size] = piece
      valid[row, piece.size:] = False
    reads = jax.device_get(layer_reads(model, jnp.asarray(tokens), jnp.asarray(valid)))
    in_batch = np.flatnonzero((slot >= b * batch_size) & (slot < b * batch_size + chunk.size))
    rows = slot[in_batch] - b * batch_size
    cols = offsets[in_batch] % seq_len
    for layer, (h_l, z_l, c_l) in reads.items():
      if layer not in h:
        h[layer] = np.zeros((P, h_l.shape[-1]), np.float32)
        z[layer] = np.zeros((P, z_l.shape[-1]), np.float32)
        codes[layer] = np.zeros((P, c_l.shape[-1]), np.int32)
      h[layer][in_batch] = h_l[rows, cols]
      z[layer][in_batch] = z_l[rows, cols]
      codes[layer][in_batch] = c_l[rows, cols]
    bar.update(b + 1)
  if n_batches == 0:
    # No positions: empty arrays of the right widths.
    for layer in model.config.memory_layers:
      memory = model.blocks[layer].memory
      h[layer] = np.zeros((0, model.config.d_model), np.float32)
      z[layer] = np.zeros((0, memory.config.routes * memory.config.bits), np.float32)
      codes[layer] = np.zeros((0, memory.config.routes), np.int32)
  return h, z, codes


class Progress:
  """Progress lines on stderr: redrawn in place on a terminal, every 5% otherwise."""

  def __init__(self, total: int, *, label: str, enabled: bool, stream=None):
    self.total, self.label, self.enabled = total, label, enabled and total > 0
    self.stream = stream or sys.stderr
    self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
    self.every = max(1, total // 20)
    self.t0 = time.perf_counter()

  def update(self, done: int) -> None:
    if not self.enabled or not (self.tty or done % self.every == 0 or done == self.total):
      return
    elapsed = time.perf_counter() - self.t0
    eta = elapsed / done * (self.total - done)
    filled = int(24 * done / self.total)
    line = (f"{self.label}: {done}/{self.total} batches "
            f"[{'#' * filled}{'.' * (24 - filled)}] {elapsed:.0f}s, ETA {eta:.0f}s")
    end = "\n" if not self.tty or done == self.total else ""
    self.stream.write(("\r" if self.tty else "") + line + end)
    self.stream.flush()
