"""Names of pytree key paths: a leaf of a parameter tree as its path components.

One spelling for every tree the trainer names leaves in (parameters, their shardings,
the optimiser state): a dict key by its key, a list entry by its index, an attribute
(optax's named tuples) by its name.
"""

from __future__ import annotations


def path_names(path) -> tuple[str, ...]:
  """Path components of a pytree key path as strings (`('blocks', '1', 'memory', ...)`)."""
  return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def path_str(path) -> str:
  """A key path as 'blocks/1/memory/tables/0'."""
  return "/".join(path_names(path))
