"""Hugging Face Qwen3-VL tensor names -> `Qwen3VL` parameter paths, with the transform of each.

The text decoder is the Qwen3 table of experiments/hf/names.py moved under
`model.language_model.` (ours under `lm/`); `lm_head.weight` keeps its name.
The vision tower (`model.visual.` -> `visual/`; HF linears [out, in], ours
[in, out]):

  patch_embed.proj.weight [E, C, T, p, p]   patch_embed/w [C·T·p·p, E]   flatten, transpose
  patch_embed.proj.bias, pos_embed.weight   patch_embed/b, pos_embed     none
  blocks.i.norm{1,2}.{weight,bias}          blocks/i/norm{1,2}/{scale,bias}
  blocks.i.attn.qkv.{weight,bias}           blocks/i/qkv/{w,b}           transpose (q, k, v; heads)
  blocks.i.attn.proj.{weight,bias}          blocks/i/proj/{w,b}          transpose
  blocks.i.mlp.linear_fc{1,2}.{weight,bias} blocks/i/fc{1,2}/{w,b}       transpose
  merger.{norm,linear_fc1,linear_fc2}.*     merger/{norm,fc1,fc2}/*      as above
  deepstack_merger_list.k.*                 deepstack/k/*                as above
"""

from __future__ import annotations

import numpy as np

from experiments.hf.names import Target, param_targets
from experiments.qwen3vl.config import Qwen3VLConfig

TEXT_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."


def _same(a):
  return a


def _t(w):
  return w.T


def _patch(w):
  return np.reshape(w, (w.shape[0], -1)).T


def _text_name(name: str) -> str:
  return name if name == "lm_head.weight" else TEXT_PREFIX + name[len("model."):]


def _linear(t: dict, ours: str, hf: str) -> None:
  t[ours + "/w"] = Target((hf + ".weight",), _t)
  t[ours + "/b"] = Target((hf + ".bias",), _same)


def _norm(t: dict, ours: str, hf: str) -> None:
  t[ours + "/scale"] = Target((hf + ".weight",), _same)
  t[ours + "/bias"] = Target((hf + ".bias",), _same)


def _merger(t: dict, ours: str, hf: str) -> None:
  _norm(t, ours + "/norm", hf + ".norm")
  _linear(t, ours + "/fc1", hf + ".linear_fc1")
  _linear(t, ours + "/fc2", hf + ".linear_fc2")


def vision_targets(config: Qwen3VLConfig) -> dict[str, Target]:
  v, hf = config.vision, VISION_PREFIX
  t = {"visual/patch_embed/w": Target((hf + "patch_embed.proj.weight",), _patch),
       "visual/patch_embed/b": Target((hf + "patch_embed.proj.bias",), _same),
       "visual/pos_embed": Target((hf + "pos_embed.weight",), _same)}
  for i in range(v.depth):
    ours, theirs = f"visual/blocks/{i}/", f"{hf}blocks.{i}."
    _norm(t, ours + "norm1", theirs + "norm1")
    _norm(t, ours + "norm2", theirs + "norm2")
    _linear(t, ours + "qkv", theirs + "attn.qkv")
    _linear(t, ours + "proj", theirs + "attn.proj")
    _linear(t, ours + "fc1", theirs + "mlp.linear_fc1")
    _linear(t, ours + "fc2", theirs + "mlp.linear_fc2")
  _merger(t, "visual/merger", hf + "merger")
  for k in range(len(v.deepstack_visual_indexes)):
    _merger(t, f"visual/deepstack/{k}", f"{hf}deepstack_merger_list.{k}")
  return t


def qwen3vl_targets(config: Qwen3VLConfig) -> dict[str, Target]:
  """{our parameter path: Target} for every backbone parameter of the model."""
  t = {f"lm/{path}": Target(tuple(_text_name(s) for s in target.sources), target.build)
       for path, target in param_targets(config.text).items()}
  return t | vision_targets(config)


def qwen3vl_shapes(config: Qwen3VLConfig) -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape} that a checkpoint of `config` holds (backbone only)."""
  from experiments.hf.names import hf_shapes
  s = {_text_name(name): shape for name, shape in hf_shapes(config.text).items()}
  v, hf = config.vision, VISION_PREFIX
  E, F, G = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
  s |= {hf + "patch_embed.proj.weight": (E, v.in_channels, v.temporal_patch_size,
                                         v.patch_size, v.patch_size),
        hf + "patch_embed.proj.bias": (E,), hf + "pos_embed.weight": (v.num_position_embeddings,
                                                                      E)}
  for i in range(v.depth):
    b = f"{hf}blocks.{i}."
    s |= {b + "norm1.weight": (E,), b + "norm1.bias": (E,), b + "norm2.weight": (E,),
          b + "norm2.bias": (E,), b + "attn.qkv.weight": (3 * E, E), b + "attn.qkv.bias": (3 * E,),
          b + "attn.proj.weight": (E, E), b + "attn.proj.bias": (E,),
          b + "mlp.linear_fc1.weight": (F, E), b + "mlp.linear_fc1.bias": (F,),
          b + "mlp.linear_fc2.weight": (E, F), b + "mlp.linear_fc2.bias": (E,)}
  mergers = [(hf + "merger", E)] + [(f"{hf}deepstack_merger_list.{k}", G)
                                   for k in range(len(v.deepstack_visual_indexes))]
  for name, norm in mergers:
    s |= {name + ".norm.weight": (norm,), name + ".norm.bias": (norm,),
          name + ".linear_fc1.weight": (G, G), name + ".linear_fc1.bias": (G,),
          name + ".linear_fc2.weight": (v.out_hidden_size, G),
          name + ".linear_fc2.bias": (v.out_hidden_size,)}
  return s
