"""Does the VLM read the grid cell a caption names? A teacher-forced grounding probe.

For every caption item "position: name." of a reference caption, fed as the
target after the caption prompt (teacher forcing, one parallel forward):

  first_byte_acc   argmax at the position that emits the name's first byte is right;
  name_acc         every byte of the name is right (each predicted from the true prefix);
  cell_attn[l]     backbone attention (mean over heads) from that position onto the
                   visual token of the named cell, at layer l;
  visual_attn[l]   its attention onto all visual tokens (so cell_attn / visual_attn
                   near 1/Nv means the model does not single the cell out);
  pvm_cell_attn[l] the same for PVM's cross-attention (only layers with PVM).

A model that perceives the objects but cannot look up the named cell shows
chance name accuracy with cell_attn ≈ visual_attn / Nv; this is the probe
behind RESULTS.md's stage-0 diagnosis.
"""

from __future__ import annotations

import numpy as np

from experiments.analysis.vlm import _jit_forward_aux
from experiments.vlm.emoji import CAPTION_PROMPT
from experiments.vlm.emoji.emoji_classes import CLASS_NAMES
from experiments.vlm.emoji.emoji_scenes import caption, position_name
from experiments.vlm.tiny.data import encode


def _rows(scenes):
  """Token rows [prompt | caption] and, per item, (row, emit position, name bytes, cell)."""
  seqs, items = [], []
  for r, s in enumerate(scenes):
    prompt = encode(CAPTION_PROMPT)
    text = prompt[:]
    for j, (cell, cls) in enumerate(zip(s.cells, s.classes, strict=True)):
      head = encode(("" if j == 0 else " ") + f"{position_name(cell, s.rows, s.cols)}: ")
      name = encode(CLASS_NAMES[cls])
      text += head
      # Text token i is predicted at sequence position Nv + i - 1.
      items.append((r, len(text) - 1, name, cell))
      text += name + encode(".")
    if text[len(prompt):] != encode(caption(s)):
      raise AssertionError("grounding probe: caption layout changed; update _rows.")
    seqs.append(text)
  T = max(len(t) for t in seqs)
  tokens = np.zeros((len(seqs), T), np.int32)
  valid = np.zeros((len(seqs), T), bool)
  for r, t in enumerate(seqs):
    tokens[r, :len(t)] = t
    valid[r, :len(t)] = True
  return tokens, valid, items


def grounding_probe(model, data, *, n: int = 32, batch: int = 16) -> dict:
  """The probe above over the first n scenes of `data`; plain dict of means."""
  Nv = model.config.n_visual
  L = model.config.lm.n_layers
  first, whole = [], []
  cell_attn = [[] for _ in range(L)]
  vis_attn = [[] for _ in range(L)]
  pvm_cell = {}
  n = min(n, len(data.scenes))
  for lo in range(0, n, batch):
    idx = np.arange(lo, min(n, lo + batch))
    tokens, valid, items = _rows([data.scenes[i] for i in idx])
    logits, aux = _jit_forward_aux(model, data.images[idx], tokens, valid)
    pred = np.asarray(logits).argmax(-1)  # [B, Nv + T]
    probs = [np.asarray(p).mean(axis=1) for p in aux["attn_probs"]]  # [B, S, S] per layer
    pvm = {k: np.asarray(v).mean(axis=2) for k, v in aux["pvm_probs"].items()}  # [B, S, Nv]
    for r, emit, name, cell in items:
      q = Nv + emit  # the sequence position that predicts the name's first byte
      got = [int(pred[r, q + i]) for i in range(len(name))]
      first.append(got[0] == name[0])
      whole.append(got == name)
      for layer in range(L):
        cell_attn[layer].append(probs[layer][r, q, cell])
        vis_attn[layer].append(probs[layer][r, q, :Nv].sum())
      for layer, p in pvm.items():
        pvm_cell.setdefault(int(layer), []).append(p[r, q, cell])
  return {
      "n_items": len(first),
      "first_byte_acc": float(np.mean(first)),
      "name_acc": float(np.mean(whole)),
      "cell_attn": [float(np.mean(a)) for a in cell_attn],
      "visual_attn": [float(np.mean(a)) for a in vis_attn],
      "pvm_cell_attn": {str(k): float(np.mean(v)) for k, v in sorted(pvm_cell.items())},
      "chance_name_acc": 1.0 / len(CLASS_NAMES),
  }
