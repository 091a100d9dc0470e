"""Which decoder layers get a PVM branch (paper §5 ablation "injection layer").

Strategies of the paper, for a 36-layer 8B backbone:
  strided  from the layer where visual processing starts, a fixed stride:
           8/16/24 (4B: 5/11/17); the paper's best;
  peak     the layers with the highest visual attention mass: 13/17/18;
  max decay  the layers whose visual attention mass falls fastest as the
           answer grows: 14/19/22;
plus an explicit list. `peak` and `max decay` take measured per-layer
statistics as input (the analyses produce them); they are pure functions, so
a notebook can try them on any array. Every helper returns a sorted tuple of
distinct 0-based layer indices.
"""

from __future__ import annotations

import numpy as np

STRATEGIES = ("strided", "explicit", "peak", "max_decay")


def strided_layers(n_layers: int, start: int, *, stride: int | None = None,
                   count: int | None = None) -> tuple[int, ...]:
  """start, start + stride, ... below n_layers, at most `count` of them.

  Give `stride`, `count` or both. With `count` alone the stride is
  (n_layers - start) // count, which spreads the layers over the rest of
  the depth (36 layers, start 8, count 3 -> stride 9: 8/17/26; the paper's
  8/16/24 is stride=8, count=3).
  """
  _check_n_layers(n_layers)
  if not 0 <= start < n_layers:
    raise ValueError(f"strided_layers: start={start} must be in [0, n_layers={n_layers}).")
  if stride is None and count is None:
    raise ValueError("strided_layers: give stride=, count= or both.")
  if count is not None and count < 1:
    raise ValueError(f"strided_layers: count={count} must be >= 1.")
  if stride is None:
    stride = max(1, (n_layers - start) // count)
  if stride < 1:
    raise ValueError(f"strided_layers: stride={stride} must be >= 1.")
  layers = tuple(range(start, n_layers, stride))
  if count is not None:
    if len(layers) < count:
      raise ValueError(
          f"strided_layers: only {len(layers)} layers fit from start={start} with "
          f"stride={stride} below n_layers={n_layers}; count={count} asked.")
    layers = layers[:count]
  return layers


def explicit_layers(n_layers: int, layers) -> tuple[int, ...]:
  """A validated, sorted copy of a hand-written list."""
  _check_n_layers(n_layers)
  layers = [int(i) for i in layers]
  if not layers:
    raise ValueError("explicit_layers: layers=[] names no layer.")
  if len(set(layers)) != len(layers):
    raise ValueError(f"explicit_layers: layers={layers} has duplicates.")
  bad = [i for i in layers if not 0 <= i < n_layers]
  if bad:
    raise ValueError(f"explicit_layers: layers {bad} are outside [0, n_layers={n_layers}).")
  return tuple(sorted(layers))


def peak_attention_layers(visual_mass_layers, count: int) -> tuple[int, ...]:
  """The `count` layers with the largest visual attention mass (ties: lower index).

  visual_mass_layers: [n_layers] per-layer visual attention mass (e.g. averaged over
  heads, samples and generated positions); a [n_layers, T] curve is averaged over T.
  """
  mass_layers = _per_layer("visual_mass", visual_mass_layers)
  return _top(mass_layers, count, "peak_attention_layers")


def layer_decay(visual_mass_layersxT, *, window: int | None = None, relative: bool = False):
  """How much each layer's visual mass falls from the start to the end of the answer.

  decay_layers = mean(mass[:, :w]) - mean(mass[:, -w:]), w = window or max(1, T // 4);
  with `relative`, divided by mean(mass[:, :w]) (0 where that is 0).
  """
  mass_layersxT = np.asarray(visual_mass_layersxT, np.float64)
  if mass_layersxT.ndim != 2 or mass_layersxT.shape[1] < 2:
    raise ValueError(
        f"visual_mass must be [n_layers, T] with T >= 2 generated positions; got "
        f"{mass_layersxT.shape}.")
  if not np.all(np.isfinite(mass_layersxT)):
    raise ValueError("visual_mass holds non-finite values.")
  T = mass_layersxT.shape[1]
  w = max(1, T // 4) if window is None else window
  if not 1 <= w <= T // 2:
    raise ValueError(f"layer_decay: window={w} must be in [1, T//2={T // 2}].")
  early_layers = mass_layersxT[:, :w].mean(axis=1)
  decay_layers = early_layers - mass_layersxT[:, -w:].mean(axis=1)
  if relative:
    safe_layers = np.where(early_layers > 0, early_layers, 1.0)
    decay_layers = np.where(early_layers > 0, decay_layers / safe_layers, 0.0)
  return decay_layers


def max_decay_layers(visual_mass_layersxT, count: int, *, window: int | None = None,
                     relative: bool = False) -> tuple[int, ...]:
  """The `count` layers whose visual mass decays most over the answer (see layer_decay)."""
  decay_layers = layer_decay(visual_mass_layersxT, window=window, relative=relative)
  return _top(decay_layers, count, "max_decay_layers")


def select_layers(strategy: str, n_layers: int, *, start: int | None = None,
                  stride: int | None = None, count: int | None = None, layers=None,
                  visual_mass=None) -> tuple[int, ...]:
  """One entry point for experiment configs: dispatch on `strategy`."""
  if strategy not in STRATEGIES:
    raise ValueError(f"select_layers: strategy={strategy!r} is not one of {STRATEGIES}.")
  if strategy == "explicit":
    if layers is None:
      raise ValueError("select_layers: strategy='explicit' needs layers=.")
    return explicit_layers(n_layers, layers)
  if strategy == "strided":
    if start is None:
      raise ValueError("select_layers: strategy='strided' needs start=.")
    return strided_layers(n_layers, start, stride=stride, count=count)
  if visual_mass is None or count is None:
    raise ValueError(f"select_layers: strategy={strategy!r} needs visual_mass= and count=.")
  mass = np.asarray(visual_mass)
  if mass.shape[0] != n_layers:
    raise ValueError(f"visual_mass has {mass.shape[0]} layers; n_layers={n_layers}.")
  if strategy == "peak":
    return peak_attention_layers(mass, count)
  return max_decay_layers(mass, count)


def _check_n_layers(n_layers):
  if not isinstance(n_layers, int) or n_layers < 1:
    raise ValueError(f"n_layers={n_layers!r} must be a positive int.")


def _per_layer(name, values):
  arr = np.asarray(values, np.float64)
  if arr.ndim == 2:
    arr = arr.mean(axis=1)
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(f"{name} must be [n_layers] or [n_layers, T]; got shape "
                     f"{np.shape(values)}.")
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} holds non-finite values.")
  return arr


def _top(score_layers, count, who):
  n_layers = score_layers.shape[0]
  if not isinstance(count, int) or not 1 <= count <= n_layers:
    raise ValueError(f"{who}: count={count!r} must be an int in [1, n_layers={n_layers}].")
  # A stable sort of -score keeps the lower index first among ties.
  order = np.argsort(-score_layers, kind="stable")
  return tuple(sorted(int(i) for i in order[:count]))
