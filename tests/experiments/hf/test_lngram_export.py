"""Lngram v2 branches exported under the authors' `RouteNgramMemoryV2` parameter names.

The expected name -> shape table is written from the constructor of
`_RouteNgramMemoryBase` / `RouteNgramMemoryV2` in `Lngram_v2.py` of the GitHub
repository zyaaa-ux/Lngram (DESIGN.md §11.5): per order n an `nn.Embedding`
`tables.ngram_<n>` of R·2^(M·n) rows and memory_dim columns; RMSNorms
`readout_query_norm` [hidden] and `readout_memory_norm` [len(orders)·memory_dim];
bias-free `nn.Linear`s `readout_q_proj` [Hq·Dh, hidden], `readout_kv_proj`
[2·Hkv·Dh, len(orders)·memory_dim], `readout_o_proj` [hidden, Hq·Dh]; and
`short_conv` (a `DepthwiseCausalConv`: RMSNorm `norm` [hidden], depthwise
`nn.Conv1d` `conv` of weight [hidden, 1, kernel], no bias by default).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from experiments.configs import load_config
from experiments.hf.memory_export import lngram_v2_export
from experiments.models import DecoderLM
from experiments.models.config import lm_config
from experiments.trainer.optimizer import path_str


def reference_state_dict_shapes(hidden, bits, routes, memory_dim, ngrams, q_heads,
                                kv_heads, head_dim, kernel):
  """RouteNgramMemoryV2(...).state_dict() names and shapes, from its source."""
  route_dim = len(ngrams) * memory_dim
  shapes = {f"tables.ngram_{n}.weight": (routes * (1 << bits) ** n, memory_dim)
            for n in ngrams}
  shapes |= {"readout_query_norm.weight": (hidden,),
             "readout_memory_norm.weight": (route_dim,),
             "readout_q_proj.weight": (q_heads * head_dim, hidden),
             "readout_kv_proj.weight": (2 * kv_heads * head_dim, route_dim),
             "readout_o_proj.weight": (hidden, q_heads * head_dim),
             "short_conv.norm.weight": (hidden,),
             "short_conv.conv.weight": (hidden, 1, kernel)}
  return shapes


def _model(arg):
  lm = lm_config(load_config(f"lm_lngram.py:{arg}"))
  model = DecoderLM(lm, rngs=nnx.Rngs(0))
  flat = {path_str(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(
      nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]}
  return lm, flat


def test_names_and_shapes_are_route_ngram_memory_v2_s():
  lm, flat = _model("smoke,kv1,mem16")   # Hq·Dh = 2·16 = d: their module's width rule
  m = lm.memory
  tensors, config = lngram_v2_export(lm, flat)
  want = reference_state_dict_shapes(m.d_model, m.bits, m.routes, m.mem_dim, m.orders,
                                     m.q_heads, m.kv_heads, m.head_dim, m.conv_kernel)
  for layer in lm.memory_layers:
    prefix = f"model.layers.{layer}.lngram."
    got = {k[len(prefix):]: v.shape for k, v in tensors.items() if k.startswith(prefix)}
    assert got == want
    assert tensors[f"model.layers.{layer}.lngram_router.weight"].shape == (
        m.routes * m.bits, m.d_model)
  assert len(tensors) == len(lm.memory_layers) * (len(want) + 1)
  k = config["kwargs"]
  assert (k["hidden_size"], k["num_routes"], k["bits_per_route"], k["memory_dim"]) == (
      m.d_model, m.routes, m.bits, m.mem_dim)
  assert (k["ngrams"], k["conv_dilation"], k["sink_initial_active_mass"]) == (
      list(m.orders), m.dilation, m.sink_mass)
  assert k["q_surrogate_mode"] == "approximate" and config["loads_in_reference"]
  assert config["layers"] == list(lm.memory_layers)


def test_values_are_ours_in_their_layout():
  lm, flat = _model("smoke")
  tensors, _ = lngram_v2_export(lm, flat)
  layer = lm.memory_layers[0]
  ours = lambda name: flat[f"blocks/{layer}/memory/{name}"]  # noqa: E731
  theirs = lambda name: tensors[f"model.layers.{layer}.lngram.{name}"]  # noqa: E731
  np.testing.assert_array_equal(theirs("tables.ngram_2.weight"), ours("tables/0"))
  np.testing.assert_array_equal(theirs("tables.ngram_3.weight"), ours("tables/1"))
  np.testing.assert_array_equal(theirs("readout_q_proj.weight"), ours("w_q").T)
  # K rows first: their kv.split(Hkv·Dh) takes the key first, as our w_kv columns.
  np.testing.assert_array_equal(theirs("readout_kv_proj.weight"), ours("w_kv").T)
  np.testing.assert_array_equal(theirs("readout_o_proj.weight"), ours("w_o").T)
  # Conv1d taps run oldest -> newest, as ours (tap W-1 is the current step).
  np.testing.assert_array_equal(theirs("short_conv.conv.weight")[:, 0, :],
                                ours("conv_kernel").T)
  np.testing.assert_array_equal(tensors[f"model.layers.{layer}.lngram_router.weight"],
                                ours("router_w").T)
  # Their sink is always on: a run without it is marked as having no counterpart.
  assert not lngram_v2_export(lm_config(load_config("lm_lngram.py:nosink,smoke")),
                              _model("nosink,smoke")[1])[1]["loads_in_reference"]


def test_no_lngram_no_file():
  lm = lm_config(load_config("lm_pkm.py:smoke"))
  assert lngram_v2_export(lm, {}) is None
