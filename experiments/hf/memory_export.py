"""Lngram v2 branches under the authors' PyTorch parameter names, beside an HF export.

    lngram_v2_export(config, flat)   ({name: array}, the JSON config) for the
                                     Lngram v2 layers of a run, or None
    lngram_v2_table(config)          {our path: Row}: the name table below, per layer
                                     (rows as in experiments/hf/names.py)

The names and shapes are those of `RouteNgramMemoryV2`'s `state_dict()` in the
paper authors' reference implementation (`Lngram_v2.py` of the GitHub
repository zyaaa-ux/Lngram; DESIGN.md §11.5), one module per memory layer,
prefixed `model.layers.<i>.lngram.`:

  ours (LngramV2)          theirs (RouteNgramMemoryV2)            transform
  tables[j] [R·C^n, Dm]    tables.ngram_<n>.weight [R·C^n, Dm]    none (same row order:
                                                                  route-major, oldest
                                                                  code the lowest digit)
  q_norm [D]               readout_query_norm.weight [D]          none
  w_q [D, Hq·Dh]           readout_q_proj.weight [Hq·Dh, D]       transpose
  mem_norm [Dr]            readout_memory_norm.weight [Dr]        none
  w_kv [Dr, 2·Hkv·Dh]      readout_kv_proj.weight [2·Hkv·Dh, Dr]  transpose (K rows first)
  w_o [Hq·Dh, D]           readout_o_proj.weight [D, Hq·Dh]       transpose
  conv_norm [D]            short_conv.norm.weight [D]             none
  conv_kernel [W, D]       short_conv.conv.weight [D, 1, W]       transpose (taps oldest
                                                                  first in both)

The router is not a parameter of their module (its forward takes the route
logits): `router_w [D, R·M]` is written as `model.layers.<i>.lngram_router.weight`
`[R·M, D]`, an `nn.Linear` weight whose output column r·M + j is bit j of route
r, as in both implementations. The JSON holds each layer's constructor
arguments of `RouteNgramMemoryV2`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.hf.tables import SAME, TRANSPOSE, Row, Rule, table_to_hf
from lngram_jax.config import LngramConfig

FILE = "lngram_v2.safetensors"
CONFIG_FILE = "lngram_v2_config.json"
SOURCE = "RouteNgramMemoryV2 (Lngram_v2.py, github.com/zyaaa-ux/Lngram)"
# Our surrogate names -> their q_surrogate_mode (and whether it is on). They have no
# straight-through estimator: "ste" maps to their default and the JSON keeps our name
# (the surrogate shapes training gradients only, not the forward of the loaded tables).
SURROGATE_MODES = {"onebit": ("approximate", True), "exact": ("exact", True),
                   "ste": ("approximate", True), "none": ("approximate", False)}


# [W, D] <-> [D, 1, W] (a depthwise Conv1d weight; taps oldest first in both)
_CONV = Rule(lambda w: w[:, 0, :].T, lambda a, shape: (a.T[:, None, :],))


def module_table(c: LngramConfig) -> dict[str, Row]:
  """One LngramV2 layer's name table: {our name (in the layer): Row (their name in the
  RouteNgramMemoryV2 module)}; experiments/hf/names.py reads it both ways."""
  D, route_dim = c.d_model, len(c.orders) * c.mem_dim
  q, kv = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
  t = {f"tables/{j}": Row(f"tables.ngram_{n}.weight", (c.routes * (1 << c.bits) ** n, c.mem_dim),
                          SAME) for j, n in enumerate(c.orders)}
  return t | {"q_norm": Row("readout_query_norm.weight", (D,), SAME),
              "w_q": Row("readout_q_proj.weight", (q, D), TRANSPOSE),
              "mem_norm": Row("readout_memory_norm.weight", (route_dim,), SAME),
              "w_kv": Row("readout_kv_proj.weight", (2 * kv, route_dim), TRANSPOSE),
              "w_o": Row("readout_o_proj.weight", (D, q), TRANSPOSE),
              "conv_norm": Row("short_conv.norm.weight", (D,), SAME),
              "conv_kernel": Row("short_conv.conv.weight", (D, 1, c.conv_kernel), _CONV)}


def lngram_v2_table(lm_config) -> dict[str, Row]:
  """The name table of every Lngram v2 layer of `lm_config` ({our path: Row}; {} without
  any): each layer's module under `model.layers.<i>.lngram.`, and its router."""
  memory = lm_config.memory
  if not isinstance(memory, LngramConfig):
    return {}
  out = {}
  for layer in lm_config.memory_layers:
    ours, theirs = f"blocks/{layer}/memory/", f"model.layers.{layer}."
    for name, row in module_table(memory).items():
      out[ours + name] = dataclasses.replace(row, theirs=(theirs + "lngram." + row.theirs[0],))
    out[ours + "router_w"] = Row(theirs + "lngram_router.weight",
                                 (memory.routes * memory.bits, memory.d_model), TRANSPOSE)
  return out


def module_tensors(c: LngramConfig, params: dict) -> dict[str, np.ndarray]:
  """One LngramV2 layer's parameters ({ours: array}) under RouteNgramMemoryV2's names."""
  return table_to_hf(module_table(c), params)


def module_kwargs(c: LngramConfig) -> dict:
  """RouteNgramMemoryV2's constructor arguments for `c`."""
  mode, enabled = SURROGATE_MODES[c.surrogate]
  return dict(hidden_size=c.d_model, bits_per_route=c.bits, num_routes=c.routes,
              memory_dim=c.mem_dim, ngrams=list(c.orders), readout_num_heads=c.q_heads,
              readout_num_kv_heads=c.kv_heads, readout_head_dim=c.head_dim,
              rmsnorm_eps=c.eps, normalization="RMSNorm", conv_kernel_size=c.conv_kernel,
              conv_dilation=c.dilation, conv_bias=False,
              sink_initial_active_mass=c.sink_mass, q_surrogate_enable=enabled,
              q_surrogate_mode=mode, q_surrogate_temperature=c.surrogate_tau,
              q_surrogate_scale=c.surrogate_scale)


def lngram_v2_export(lm_config, flat: dict[str, np.ndarray]):
  """({name: array}, JSON config) of the run's Lngram v2 layers, or None without any.

  `flat`: the model's parameters by path ('blocks/1/memory/w_q'). A run without
  the zero-value sink (`sink=False`) has no RouteNgramMemoryV2 counterpart
  (their sink is always on) and is noted in the JSON.
  """
  memory = lm_config.memory
  if not isinstance(memory, LngramConfig) or not lm_config.memory_layers:
    return None
  tensors = table_to_hf(lngram_v2_table(lm_config), flat)
  config = {"module": SOURCE, "layers": list(lm_config.memory_layers),
            "prefix": "model.layers.<i>.lngram.", "router": "model.layers.<i>.lngram_router.weight",
            "kwargs": module_kwargs(memory),
            "sink": bool(memory.sink), "surrogate": memory.surrogate,
            # Their module requires readout_num_heads·readout_head_dim == hidden_size.
            "loads_in_reference": bool(memory.sink
                                       and memory.q_heads * memory.head_dim == memory.d_model)}
  return tensors, config
