"""Name tables: {our parameter path: Row}, read both ways (DESIGN.md §11.2).

A Row holds the HF tensors a parameter is made of, their shape (HF layout; every tensor
of a row has the same one) and a Rule, the exact transform both ways (transposes,
reshapes, stacks: bit for bit). Everything else is derived from a table:

    table_targets(table)         {our path: Target}      the import (load.py)
    table_shapes(table)          {HF name: shape}        what a checkpoint must hold
    table_to_hf(table, params)   {HF name: array}        the export (fused tensors that
                                                         several parameters share joined
                                                         from their `part_of` pieces)

so the import, the shape checks and the export cannot drift apart. The families' tables:
experiments/hf/names.py (the dense decoders), qwen3_moe.py, qwen3vl/names.py,
pvm_format.py, memory_export.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Target:
  """One parameter: the HF tensors it is built from and how (arrays in HF layout)."""
  sources: tuple[str, ...]
  build: Callable[..., np.ndarray]


@dataclasses.dataclass(frozen=True)
class Rule:
  """An exact transform both ways. to_ours(*theirs) -> our array; to_theirs(ours, shape)
  -> their arrays (a tuple, in the row's order; `shape`: each one's). to_theirs None:
  a layout that is read, never written."""
  to_ours: Callable[..., np.ndarray]
  to_theirs: Callable[[np.ndarray, tuple[int, ...]], tuple[np.ndarray, ...]] | None


@dataclasses.dataclass(frozen=True)
class Row:
  """One parameter in both layouts: the HF tensor(s) it is made of, the shape of each
  (HF layout) and the rule between them. `theirs` may be given as one name."""
  theirs: tuple[str, ...]
  shape: tuple[int, ...]
  rule: Rule

  def __post_init__(self):
    if isinstance(self.theirs, str):
      object.__setattr__(self, "theirs", (self.theirs,))


def _unsplit(a, shape):
  """[in, *axes] or [*axes, out] -> [out, in] of `shape` (the inverse of both splits)."""
  return (np.reshape(a, shape[::-1]).T,)


SAME = Rule(lambda a: a, lambda a, shape: (a,))
TRANSPOSE = Rule(lambda w: w.T, lambda a, shape: (a.T,))    # [out, in] <-> [in, out]


def split_out(*axes) -> Rule:
  """[out, in] <-> [in, *axes] (the output axis split into `axes`: q/k/v)."""
  return Rule(lambda w: np.reshape(w.T, (w.shape[1], *axes)), _unsplit)


def split_in(*axes) -> Rule:
  """[out, in] <-> [*axes, out] (the input axis split into `axes`: o_proj)."""
  return Rule(lambda w: np.reshape(w.T, (*axes, w.shape[0])), _unsplit)


def reshaped(*axes) -> Rule:
  """Any shape <-> `axes` (same element order: biases, scalars)."""
  return Rule(lambda a: np.reshape(a, axes), lambda a, shape: (np.reshape(a, shape),))


def stacked(rule: Rule, axis: int) -> Rule:
  """n tensors <-> one, each through `rule`, stacked along our `axis` (k and v; experts)."""
  def to_theirs(a, shape):
    index = (slice(None),) * axis
    return tuple(rule.to_theirs(a[(*index, j)], shape)[0] for j in range(a.shape[axis]))
  return Rule(lambda *ws: np.stack([rule.to_ours(w) for w in ws], axis=axis), to_theirs)


@dataclasses.dataclass(frozen=True)
class Part:
  """What a `part_of` rule writes: piece `index` of `count` equal pieces along `axis` of one
  HF tensor that several parameters share (`table_to_hf` joins the pieces)."""
  array: np.ndarray
  index: int
  count: int
  axis: int


def part_of(rule: Rule, index: int, count: int, axis: int) -> Rule:
  """Piece `index` of `count` equal pieces along HF `axis` of a fused tensor, each through
  `rule` (Qwen3-MoE's gate_up_proj: the gate half, then the up half)."""
  def to_theirs(a, shape):
    piece = tuple(n // count if i == axis else n for i, n in enumerate(shape))
    return (Part(rule.to_theirs(a, piece)[0], index, count, axis),)
  return Rule(lambda w: rule.to_ours(np.split(np.asarray(w), count, axis=axis)[index]),
              to_theirs)


def table_targets(table: dict[str, Row]) -> dict[str, Target]:
  """{our path: Target} of a name table (the import)."""
  return {path: Target(row.theirs, row.rule.to_ours) for path, row in table.items()}


def table_shapes(table: dict[str, Row]) -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape} of a name table (what a checkpoint holds)."""
  return {name: row.shape for row in table.values() for name in row.theirs}


def table_to_hf(table: dict[str, Row], params: dict) -> dict[str, np.ndarray]:
  """Our parameters {path: array} as HF tensors {name: array} through a name table."""
  out = {}
  for path, row in table.items():
    if row.rule.to_theirs is None:
      raise ValueError(f"{path}: {', '.join(row.theirs)} is a layout that is read, never "
                       "written.")
    arrays = row.rule.to_theirs(np.asarray(params[path]), row.shape)
    for name, array in zip(row.theirs, arrays, strict=True):
      if isinstance(array, Part):   # a piece of a fused tensor: joined below
        out.setdefault(name, [None] * array.count)[array.index] = array
      else:
        out[name] = array
  for name, value in out.items():
    if isinstance(value, list):
      if any(piece is None for piece in value):
        raise ValueError(f"{name}: the table writes only some pieces of this fused tensor.")
      out[name] = np.concatenate([piece.array for piece in value], axis=value[0].axis)
  return {k: np.ascontiguousarray(v) for k, v in out.items()}
