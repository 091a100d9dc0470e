"""Parameter counts of the memory branches, from their configs (nothing is built).

Each memory arm states its own accounting in its `param_count(config)` (total,
and active: what one token touches); `branch_param_count` picks the right one
for any registered memory config, `memory_params` sums it over an LM's memory
layers. The report and the parameter benchmark both read these numbers.
"""

from __future__ import annotations

from experiments.models.arms import engram, lngram_v1, pkm, sparse_ffn
from experiments.models.config import LMConfig
from lngram_jax.config import LngramConfig
from lngram_jax.layer import param_count as lngram_param_count

_COUNTS = {LngramConfig: lngram_param_count, pkm.CONFIG: pkm.param_count,
           engram.CONFIG: engram.param_count, lngram_v1.CONFIG: lngram_v1.param_count,
           sparse_ffn.CONFIG: sparse_ffn.param_count}


def branch_param_count(memory_config) -> dict[str, int]:
  """`param_count` of ONE layer of a memory branch: at least {"total", "active"}."""
  for cls, count in _COUNTS.items():
    if isinstance(memory_config, cls):
      return count(memory_config)
  raise ValueError(f"no parameter count for a {type(memory_config).__name__} (memory configs: "
                   f"{', '.join(sorted(c.__name__ for c in _COUNTS))}).")


def memory_params(model: LMConfig) -> tuple[int, int]:
  """(total, active per token) of all memory branches of an LM; (0, 0) without memory."""
  if model.memory is None:
    return 0, 0
  c = branch_param_count(model.memory)
  return len(model.memory_layers) * c["total"], len(model.memory_layers) * c["active"]
