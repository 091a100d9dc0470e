"""Hugging Face Qwen3-VL tensor names <-> `Qwen3VL` parameter paths: one table, read both ways.

The text decoder is the table of experiments/hf/names.py (`lm_table`) moved
under `model.language_model.` (ours under `lm/`); `lm_head.weight` keeps its
name. The vision tower (`model.visual.` -> `visual/`; HF linears [out, in],
ours [in, out]):

  patch_embed.proj.weight [E, C, T, p, p]   patch_embed/w [C·T·p·p, E]   flatten, transpose
  patch_embed.proj.bias, pos_embed.weight   patch_embed/b, pos_embed     none
  blocks.i.norm{1,2}.{weight,bias}          blocks/i/norm{1,2}/{scale,bias}
  blocks.i.attn.qkv.{weight,bias}           blocks/i/qkv/{w,b}           transpose (q, k, v; heads)
  blocks.i.attn.proj.{weight,bias}          blocks/i/proj/{w,b}          transpose
  blocks.i.mlp.linear_fc{1,2}.{weight,bias} blocks/i/fc{1,2}/{w,b}       transpose
  merger.{norm,linear_fc1,linear_fc2}.*     merger/{norm,fc1,fc2}/*      as above
  deepstack_merger_list.k.*                 deepstack/k/*                as above

Qwen3-VL-MoE's sparse layers hold their router and fused experts instead of
the mlp.* rows (experiments/hf/qwen3_moe.py `layer_table`, the layout named by
`experts`). `qwen3vl_table` is the whole backbone's table; the import targets, the
shapes a checkpoint must hold and the export (experiments/hf/qwen3vl/
export.py) are all read from it (`table_*` of experiments/hf/names.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from experiments.hf.names import lm_table
from experiments.hf.tables import SAME, TRANSPOSE, Row, Rule, Target, table_shapes, table_targets
from experiments.vlm.qwen3vl.config import Qwen3VLConfig

TEXT_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."

# [E, C, T, p, p] <-> [C·T·p·p, E]
PATCH = Rule(lambda w: np.reshape(w, (w.shape[0], -1)).T,
             lambda a, shape: (a.T.reshape(shape),))


def text_name(name: str) -> str:
  """A decoder tensor's name in a Qwen3-VL checkpoint (from its Qwen3 name)."""
  return name if name == "lm_head.weight" else TEXT_PREFIX + name[len("model."):]


def _linear(t: dict, ours: str, hf: str, n_out: int, n_in: int) -> None:
  t[ours + "/w"] = Row(hf + ".weight", (n_out, n_in), TRANSPOSE)
  t[ours + "/b"] = Row(hf + ".bias", (n_out,), SAME)


def _norm(t: dict, ours: str, hf: str, width: int) -> None:
  t[ours + "/scale"] = Row(hf + ".weight", (width,), SAME)
  t[ours + "/bias"] = Row(hf + ".bias", (width,), SAME)


def vision_table(config: Qwen3VLConfig) -> dict[str, Row]:
  """The vision tower's name table: {our path: Row}."""
  v, hf = config.vision, VISION_PREFIX
  E, F, G = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
  t = {"visual/patch_embed/w": Row(hf + "patch_embed.proj.weight",
                                   (E, v.in_channels, v.temporal_patch_size, v.patch_size,
                                    v.patch_size), PATCH),
       "visual/patch_embed/b": Row(hf + "patch_embed.proj.bias", (E,), SAME),
       "visual/pos_embed": Row(hf + "pos_embed.weight", (v.num_position_embeddings, E), SAME)}
  for i in range(v.depth):
    ours, theirs = f"visual/blocks/{i}/", f"{hf}blocks.{i}."
    _norm(t, ours + "norm1", theirs + "norm1", E)
    _norm(t, ours + "norm2", theirs + "norm2", E)
    _linear(t, ours + "qkv", theirs + "attn.qkv", 3 * E, E)
    _linear(t, ours + "proj", theirs + "attn.proj", E, E)
    _linear(t, ours + "fc1", theirs + "mlp.linear_fc1", F, E)
    _linear(t, ours + "fc2", theirs + "mlp.linear_fc2", E, F)
  mergers = [("visual/merger", hf + "merger", E)] + [
      (f"visual/deepstack/{k}", f"{hf}deepstack_merger_list.{k}", G)
      for k in range(len(v.deepstack_visual_indexes))]
  for ours, theirs, norm in mergers:
    _norm(t, ours + "/norm", theirs + ".norm", norm)
    _linear(t, ours + "/fc1", theirs + ".linear_fc1", G, G)
    _linear(t, ours + "/fc2", theirs + ".linear_fc2", v.out_hidden_size, G)
  return t


def qwen3vl_table(config: Qwen3VLConfig, experts: str = "fused") -> dict[str, Row]:
  """The name table of every backbone parameter of the model: {our path: Row}; `experts`:
  the layout of a Qwen3-VL-MoE decoder's expert tensors (experiments/hf/qwen3vl/moe.py)."""
  t = {f"lm/{path}": dataclasses.replace(row, theirs=tuple(map(text_name, row.theirs)))
       for path, row in lm_table(config.text, experts).items()}
  return t | vision_table(config)


def vision_targets(config: Qwen3VLConfig) -> dict[str, Target]:
  """{our parameter path: Target} of the vision tower."""
  return table_targets(vision_table(config))


def qwen3vl_targets(config: Qwen3VLConfig) -> dict[str, Target]:
  """{our parameter path: Target} for every backbone parameter of the model."""
  return table_targets(qwen3vl_table(config))


def qwen3vl_shapes(config: Qwen3VLConfig) -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape} that a checkpoint of `config` holds (backbone only)."""
  return table_shapes(qwen3vl_table(config))
