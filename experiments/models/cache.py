"""Decode state of the whole LM: per-layer KV caches and branch decode states.

Rows decode independently: row b writes its next token at cache slot
`index_B[b]` with RoPE position `position_B[b]`, and attends to the slots
marked in `key_ok_BxS` (real tokens of the segment being continued). Prompts
are right-padded; padding slots stay unmarked and are overwritten by the
generated tokens in order, so rows of different prompt lengths share one
cache. Writes past the last slot are dropped by XLA: callers size the cache
(prompt + new tokens <= slots); `generate` checks this.

The branch states are whatever each slot's branch keeps (`branches.py`): the
Lngram code/conv history, PVM's visual keys and values, None for the MLP.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import struct


@struct.dataclass
class LayerCache:
  """k, v: [B, S, Hkv, Dh]; the memory and beside-FFN branch states (or None)."""

  k_BxSxHkvxDh: jnp.ndarray
  v_BxSxHkvxDh: jnp.ndarray
  memory_state: Any = None
  ffn_branch_state: Any = None


@struct.dataclass
class DecodeCache:
  """layers: one LayerCache per block; index_B: next slot; position_B: next
  RoPE position; key_ok_BxS: slots the next query may attend to."""

  layers: tuple[LayerCache, ...]
  index_B: jnp.ndarray
  position_B: jnp.ndarray
  key_ok_BxS: jnp.ndarray

  @property
  def max_len(self) -> int:
    return self.key_ok_BxS.shape[1]
