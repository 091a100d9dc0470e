"""Lngram v2 branches under the authors' PyTorch parameter names, beside an HF export.

    lngram_v2_export(config, flat)   ({name: array}, the JSON config) for the
                                     Lngram v2 layers of a run, or None

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

import numpy as np

from lngram_jax.config import LngramConfig

FILE = "lngram_v2.safetensors"
CONFIG_FILE = "lngram_v2_config.json"
SOURCE = "RouteNgramMemoryV2 (Lngram_v2.py, github.com/zyaaa-ux/Lngram)"
# Our surrogate names -> their q_surrogate_mode (and whether it is on). They have no
# straight-through estimator: "ste" maps to their default and the JSON keeps our name
# (the surrogate shapes training gradients only, not the forward of the loaded tables).
SURROGATE_MODES = {"onebit": ("approximate", True), "exact": ("exact", True),
                   "ste": ("approximate", True), "none": ("approximate", False)}


def module_tensors(c: LngramConfig, params: dict) -> dict[str, np.ndarray]:
  """One LngramV2 layer's parameters ({ours: array}) under RouteNgramMemoryV2's names."""
  out = {f"tables.ngram_{n}.weight": np.asarray(params[f"tables/{j}"])
         for j, n in enumerate(c.orders)}
  out |= {"readout_query_norm.weight": params["q_norm"],
          "readout_q_proj.weight": params["w_q"].T,
          "readout_memory_norm.weight": params["mem_norm"],
          "readout_kv_proj.weight": params["w_kv"].T,
          "readout_o_proj.weight": params["w_o"].T,
          "short_conv.norm.weight": params["conv_norm"],
          "short_conv.conv.weight": params["conv_kernel"].T[:, None, :]}
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


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
  tensors, layers = {}, []
  for layer in lm_config.memory_layers:
    prefix = f"blocks/{layer}/memory/"
    params = {k[len(prefix):]: np.asarray(v) for k, v in flat.items() if k.startswith(prefix)}
    for name, value in module_tensors(memory, params).items():
      tensors[f"model.layers.{layer}.lngram.{name}"] = value
    tensors[f"model.layers.{layer}.lngram_router.weight"] = np.ascontiguousarray(
        params["router_w"].T)
    layers.append(layer)
  config = {"module": SOURCE, "layers": layers,
            "prefix": "model.layers.<i>.lngram.", "router": "model.layers.<i>.lngram_router.weight",
            "kwargs": module_kwargs(memory),
            "sink": bool(memory.sink), "surrogate": memory.surrogate,
            # Their module requires readout_num_heads·readout_head_dim == hidden_size.
            "loads_in_reference": bool(memory.sink
                                       and memory.q_heads * memory.head_dim == memory.d_model)}
  return tensors, config
