"""Resumable batches of Qwen3-VL conversations for the training loop (Stage I and Stage II).

    ConversationSampler(data, config, batch_size=, seq_len=, seed=)          Stage I rows
    ConversationSampler(..., mode="prompts", group_size=G)                  Stage II prompts

`data` is an `experiments.vlm.qwen3vl.conversations.ConversationData` (LLaVA-style
JSON lines, images at a fixed size so every batch has one shape). Rows are
drawn without replacement in epochs, epoch e in the order of
`default_rng([seed, e]).permutation`; the state is the number of batches
served, so `set_state` resumes exactly (the trainer saves it with each
checkpoint). Batches are host numpy:

  sft      input_ids, attention_mask, loss_mask [B, T]; position_ids [B, 3, T]
           (the multimodal ids of transformers' get_rope_index, computed here on
           the host, batch-major for the trainer's batch sharding); pixel_values
           [N, P]; idx [B]
  prompts  each of batch_size prompts G times (the group), right-packed:
           input_ids, attention_mask [B·G, Tp], lengths [B·G], pixel_values, idx

`image_grid_thw` is the same for every batch (fixed size and image count per
row): `grid_thw` holds it for the loss, which needs it as a static array.
"""

from __future__ import annotations

import numpy as np

from experiments.vlm.qwen3vl.conversations import collate
from experiments.vlm.qwen3vl.positions import rope_index

MODES = ("sft", "prompts")


class ConversationSampler:
  """See the module docstring."""

  def __init__(self, data, config, *, batch_size: int, seq_len: int, seed: int,
               mode: str = "sft", group_size: int = 1):
    if mode not in MODES:
      raise ValueError(f"ConversationSampler: mode={mode!r} is not one of {MODES}.")
    if batch_size < 1 or group_size < 1:
      raise ValueError(f"ConversationSampler: batch_size={batch_size} and "
                       f"group_size={group_size} must be >= 1.")
    if batch_size > len(data):
      raise ValueError(f"ConversationSampler: batch_size={batch_size} exceeds the "
                       f"{len(data)} rows of {data.path}.")
    self.data, self.config, self.mode = data, config, mode
    self.batch_size, self.seq_len, self.seed, self.group = batch_size, seq_len, seed, group_size
    self.served = 0
    first = self.data[0]
    self.images_per_row = len(first["image_grid_thw"])
    rows = batch_size * (group_size if mode == "prompts" else 1)
    self.grid_thw = np.tile(np.asarray(first["image_grid_thw"], np.int64), (rows, 1))

  def get_state(self) -> dict:
    return {"served": self.served}

  def set_state(self, state: dict) -> None:
    self.served = int(state["served"])

  def _indices(self, k: int) -> np.ndarray:
    """Rows of batch k: epoch-wise permutations, batches never straddle an epoch."""
    per_epoch = len(self.data) // self.batch_size
    epoch, j = divmod(k, per_epoch)
    order = np.random.default_rng([self.seed, epoch]).permutation(len(self.data))
    return order[j * self.batch_size:(j + 1) * self.batch_size]

  def _examples(self, idx):
    out = []
    for i in idx:
      e = self.data[int(i)]
      grid = np.asarray(e["image_grid_thw"])
      if len(grid) != self.images_per_row or (grid != self.grid_thw[:len(grid)]).any():
        raise ValueError(f"{self.data.path} row {e['id']!r}: image grid {grid.tolist()} differs "
                         f"from the first row's {self.grid_thw[:self.images_per_row].tolist()}; "
                         "training batches need one fixed image size and count per row.")
      out.append(e)
    return out

  def __next__(self) -> dict:
    idx = self._indices(self.served)
    self.served += 1
    examples = self._examples(idx)
    if self.mode == "sft":
      batch = collate(examples, self.seq_len, self.data.pad_id)
      position_3xBxT, _ = rope_index(batch["input_ids"], self.grid_thw, batch["attention_mask"],
                                     self.config)
      return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
              "loss_mask": batch["loss_mask"], "pixel_values": batch["pixel_values"],
              "position_ids": np.ascontiguousarray(position_3xBxT.transpose(1, 0, 2)),
              "idx": np.asarray(idx, np.int32)}
    return self._prompts(examples, idx)

  def _prompts(self, examples, idx) -> dict:
    G = self.group
    rows = [e for e in examples for _ in range(G)]
    Tp = max(len(e["prompt_ids"]) for e in rows)
    ids = np.full((len(rows), Tp), self.data.pad_id, np.int32)
    mask = np.zeros((len(rows), Tp), bool)
    for b, e in enumerate(rows):   # right-packed: the decoder's prefill wants it
      ids[b, :len(e["prompt_ids"])] = e["prompt_ids"]
      mask[b, :len(e["prompt_ids"])] = True
    return {"input_ids": ids, "attention_mask": mask,
            "lengths": mask.sum(1).astype(np.int32),
            "pixel_values": np.concatenate([e["pixel_values"] for e in rows], axis=0),
            "idx": np.repeat(np.asarray(idx, np.int32), G)}
