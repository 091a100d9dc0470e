"""Injection-layer strategies: the paper's layer lists and hand-made statistics."""

from __future__ import annotations

import numpy as np
import pytest

from pvm_jax import (
    explicit_layers,
    layer_decay,
    max_decay_layers,
    peak_attention_layers,
    select_layers,
    strided_layers,
)


def test_strided_reproduces_the_paper():
  assert strided_layers(36, 8, stride=8, count=3) == (8, 16, 24)     # 8B
  assert strided_layers(36, 5, stride=6, count=3) == (5, 11, 17)     # 4B
  assert strided_layers(10, 2, stride=3) == (2, 5, 8)
  assert strided_layers(36, 8, count=3) == (8, 17, 26)
  with pytest.raises(ValueError, match="only 2 layers fit"):
    strided_layers(10, 4, stride=4, count=3)
  with pytest.raises(ValueError, match="start=12 must be in"):
    strided_layers(10, 12, stride=1)
  with pytest.raises(ValueError, match="give stride=, count= or both"):
    strided_layers(10, 0)


def test_explicit():
  assert explicit_layers(36, [24, 8, 16]) == (8, 16, 24)
  with pytest.raises(ValueError, match="duplicates"):
    explicit_layers(36, [8, 8])
  with pytest.raises(ValueError, match=r"layers \[36\] are outside"):
    explicit_layers(36, [8, 36])


def test_peak_attention_picks_the_largest_mass():
  mass_L = np.array([0.1, 0.5, 0.2, 0.5, 0.9, 0.0])
  assert peak_attention_layers(mass_L, 2) == (1, 4)      # tie 1 vs 3: the lower index
  assert peak_attention_layers(mass_L, 3) == (1, 3, 4)
  # A [L, T] curve is averaged over T first.
  curve_LxT = np.stack([mass_L, mass_L + np.array([0, 0, 1, 0, 0, 0])], axis=1)
  assert peak_attention_layers(curve_LxT, 1) == (4,)
  assert peak_attention_layers(curve_LxT, 2) == (2, 4)
  with pytest.raises(ValueError, match="count=7 must be an int in"):
    peak_attention_layers(mass_L, 7)


def test_max_decay_picks_the_steepest_fall():
  t = np.arange(1, 9, dtype=np.float64)
  curve_LxT = np.stack([
      np.full(8, 0.3),              # flat: no decay
      0.8 / t,                      # 1/t from 0.8: falls by ~0.55 (w = 2)
      0.2 / t,                      # same shape, small: falls by ~0.14
      np.linspace(0.1, 0.4, 8),     # rises: negative decay
  ])
  decay = layer_decay(curve_LxT)
  np.testing.assert_allclose(decay[0], 0.0)
  np.testing.assert_allclose(decay[1], 0.8 * (1 + 1 / 2) / 2 - 0.8 * (1 / 7 + 1 / 8) / 2)
  assert decay[3] < 0
  assert max_decay_layers(curve_LxT, 1) == (1,)
  assert max_decay_layers(curve_LxT, 2) == (1, 2)
  # Relative decay ranks the two 1/t curves equal (tie: lower index first).
  rel = layer_decay(curve_LxT, relative=True)
  np.testing.assert_allclose(rel[1], rel[2])
  assert max_decay_layers(curve_LxT, 1, relative=True) == (1,)
  with pytest.raises(ValueError, match="window=5 must be in"):
    layer_decay(curve_LxT, window=5)


def test_select_layers_dispatch():
  mass = np.linspace(0, 1, 12)[:, None] * np.ones((12, 4))
  assert select_layers("strided", 12, start=2, stride=4) == (2, 6, 10)
  assert select_layers("explicit", 12, layers=[3, 1]) == (1, 3)
  assert select_layers("peak", 12, visual_mass=mass, count=2) == (10, 11)
  with pytest.raises(ValueError, match="strategy='middle' is not one of"):
    select_layers("middle", 12)
  with pytest.raises(ValueError, match="needs visual_mass= and count="):
    select_layers("max_decay", 12, count=2)
  with pytest.raises(ValueError, match="visual_mass has 12 layers; n_layers=10"):
    select_layers("peak", 10, visual_mass=mass, count=2)
