"""Layout-independent digests of checkpointed arrays, and their verification.

orbax detects a truncated array file but not a flipped byte inside one, so a
run checkpoint's `meta` records a digest of every array leaf at save time and
restoring recomputes it (`verify`).

Digest ("shardsum"): for every element, a 128-bit mix of its GLOBAL flat index
and its bits, summed modulo 2^64 per lane. A sum needs no order, so each
addressable shard is hashed on its own (one shard at a time on the host, never
the whole table) and the result does not depend on the layout: a table saved
from 8 devices verifies when restored onto 4 or 1. Replicas are counted once
(replica_id 0). Arrays that are not fully addressable (multi-host) are not
digested: their leaf is recorded as "unverified" and verification skips it
(orbax still checks those files' structure). Checkpoints written before the
shardsum digests (meta without "digest_kind") are verified with the older
whole-array sha256 (`tree_digest`).
"""

from __future__ import annotations

import hashlib

import jax
import numpy as np

DIGEST_KIND = "shardsum-v1"
UNVERIFIED = "unverified"
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


class DigestMismatch(ValueError):
  """Restored arrays differ from what was saved (the message says which)."""


def _splitmix64(z):
  # Vectorised SplitMix64 finaliser (uint64 arithmetic wraps, as intended).
  with np.errstate(over="ignore"):
    z = (z + np.uint64(0x9E3779B97F4A7C15)) & _M64
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
    return z ^ (z >> np.uint64(31))


def _element_bits(a: np.ndarray) -> np.ndarray:
  """Each element's bits as uint64 (floats of any width, ints, bools)."""
  a = np.ascontiguousarray(a)
  unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
  return a.view(unsigned).astype(np.uint64)


def _global_flat_index(index: tuple, shape: tuple) -> np.ndarray:
  """Global C-order flat index of every element of the block `index` of `shape`."""
  flat = np.zeros((), np.uint64)
  stride = 1
  ranges = [np.arange(*s.indices(n), dtype=np.uint64) for s, n in zip(index, shape, strict=True)]
  for dim in reversed(range(len(shape))):
    view = [1] * len(shape)
    view[dim] = -1
    flat = flat + ranges[dim].reshape(view) * np.uint64(stride)
    stride *= shape[dim]
  return flat


def _block_sums(block: np.ndarray, index: tuple, shape: tuple) -> tuple[int, int]:
  if block.size == 0:
    return 0, 0
  flat = np.broadcast_to(_global_flat_index(index, shape), block.shape).reshape(-1)
  bits = _element_bits(block).reshape(-1)
  lane1 = _splitmix64(flat ^ _splitmix64(bits))
  lane2 = _splitmix64(lane1 ^ np.uint64(0x5851F42D4C957F2D) ^ bits)
  return int(lane1.sum(dtype=np.uint64)), int(lane2.sum(dtype=np.uint64))


def leaf_digest(x) -> str:
  """The layout-independent digest of one array (see the module doc)."""
  if isinstance(x, jax.Array):
    if not x.is_fully_addressable:
      return UNVERIFIED
    shape, dtype = tuple(x.shape), np.dtype(x.dtype)
    blocks = [(np.asarray(s.data), s.index) for s in x.addressable_shards if s.replica_id == 0]
  else:
    a = np.asarray(x)
    shape, dtype = a.shape, a.dtype
    blocks = [(a, tuple(slice(None) for _ in shape))]
  s1 = s2 = 0
  for block, index in blocks:
    b1, b2 = _block_sums(block, index, shape)
    s1, s2 = (s1 + b1) % 2**64, (s2 + b2) % 2**64
  return f"{dtype.name}|{shape}|{s1:016x}{s2:016x}"


def tree_digests(tree) -> dict[str, str]:
  """{leaf path: leaf_digest} of a pytree."""
  return {jax.tree_util.keystr(path): leaf_digest(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tree_digest(tree) -> str:
  """The older whole-tree sha256 (host arrays), kept to verify older checkpoints."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def verify(name: str, meta: dict, tree) -> None:
  """Raises DigestMismatch if item `name` (`tree`) is not what `meta` recorded."""
  recorded = meta.get("digests", {}).get(name)
  if meta.get("digest_kind") != DIGEST_KIND:   # written before shardsum digests
    if recorded != tree_digest(jax.device_get(tree)):
      raise DigestMismatch(
          f"item {name!r} does not match the digest recorded at save time "
          "(the files were modified or damaged after saving).")
    return
  got = tree_digests(tree)
  if set(got) != set(recorded or {}):
    raise DigestMismatch(f"item {name!r} holds other arrays than were saved.")
  for path, want in recorded.items():
    if UNVERIFIED in (want, got[path]):
      continue
    if got[path] != want:
      raise DigestMismatch(
          f"item {name!r} array {path} does not match the digest recorded at save "
          "time (the files were modified or damaged after saving).")
