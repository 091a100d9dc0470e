"""Frozen config dataclasses <-> JSON, and the field validators configs share.

Checkpoints store a model's config as JSON and rebuild the model from it
alone, so each config class needs the same two conversions:

  to_json(config)         fields -> JSON: tuples as lists, dtypes by name,
                          nested configs through their own `to_dict`;
  from_json(cls, d)       the inverse: unknown fields are an error (never
                          dropped), dtype names -> dtypes, lists -> tuples,
                          then the class's own validation runs.

The validators below give every config the same messages,
"<Owner>: <field>=<value> must be ...", naming the field and its value. This
module lives in the lowest model package so that `lngram_jax`, `pvm_jax` and
`experiments` all use one copy (DESIGN.md §6.2).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax.numpy as jnp

DTYPE_FIELDS = ("dtype", "param_dtype")
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


# --- JSON ---------------------------------------------------------------------------


def _jsonable(value):
  if isinstance(value, (tuple, list)):
    return [_jsonable(v) for v in value]
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return value.to_dict() if hasattr(value, "to_dict") else to_json(value)
  return value


def to_json(config, **overrides) -> dict:
  """Every field of a config dataclass as JSON-ready values (a flat dict).

  overrides: field -> JSON value, for fields a class writes its own way (a
  branch config with its "kind"); they replace the generic form.
  """
  d = {}
  for f in dataclasses.fields(config):
    if f.name in overrides:
      d[f.name] = overrides[f.name]
      continue
    value = getattr(config, f.name)
    d[f.name] = jnp.dtype(value).name if f.name in DTYPE_FIELDS else _jsonable(value)
  return d


def _tuples(value):
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  return value


def from_json(cls, d: dict, *, owner: str | None = None, **overrides):
  """`cls(**d)` from its JSON form; `owner` prefixes the unknown-fields error.

  overrides: field -> already converted value (nested configs a class
  rebuilds itself); every other list becomes a tuple and dtype names dtypes.
  """
  d = dict(d)
  unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
  if unknown:
    raise ValueError(f"{owner or cls.__name__}: unknown fields {unknown}.")
  for key, value in d.items():
    if key in overrides:
      d[key] = overrides[key]
    elif key in DTYPE_FIELDS:
      d[key] = as_dtype(cls.__name__, key, value)
    else:
      d[key] = _tuples(value)
  return cls(**d)


# --- field validators ---------------------------------------------------------------


def is_int(value) -> bool:
  """An integer (numpy integers too), never a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive_int(owner: str, name: str, value) -> None:
  """A python int >= 1 (a numpy integer would not survive `json.dumps`)."""
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{owner}: {name}={value!r} must be a positive int.")


def check_int_at_least(owner: str, name: str, value, minimum: int, note: str = "") -> None:
  """A python int >= minimum; `note` (e.g. "(0 = d_model)") ends the message."""
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{owner}: {name}={value!r} must be an int >= {minimum}"
                     f"{' ' + note if note else ''}.")


def check_finite(owner: str, name: str, value, *, above=None, at_least=None) -> None:
  """A finite real number (no bool), optionally > `above` or >= `at_least`."""
  ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
        and math.isfinite(value)
        and (above is None or value > above) and (at_least is None or value >= at_least))
  if not ok:
    bound = (f" > {above}" if above is not None else "") + (
        f" >= {at_least}" if at_least is not None else "")
    raise ValueError(f"{owner}: {name}={value!r} must be a finite number{bound}.")


def check_bool(owner: str, name: str, value) -> None:
  if not isinstance(value, bool):
    raise ValueError(f"{owner}: {name}={value!r} must be a bool.")


def as_dtype(owner: str, name: str, value) -> Any:
  """The dtype a name or dtype stands for, or a ValueError naming the field."""
  if value is None or isinstance(value, (bool, int, float)):
    raise ValueError(f"{owner}: {name}={value!r} is not a dtype.")
  try:
    return jnp.dtype(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{owner}: {name}={value!r} is not a dtype.") from e


def as_float_dtype(owner: str, name: str, value) -> Any:
  """`as_dtype`, limited to the floating dtypes an activation or parameter may have."""
  dtype = as_dtype(owner, name, value)
  if dtype.name not in FLOAT_DTYPES:
    raise ValueError(f"{owner}: {name}={dtype.name!r} is not one of {FLOAT_DTYPES}.")
  return dtype
