"""Emoji-scene batches for the VLM: byte tokens, loss masks, length groups.

Text is UTF-8 bytes (vocabulary 256); byte 0 never occurs in the texts and
serves as end-of-sequence and padding. A row is [prompt | target | EOS | pad];
the loss covers the target and its EOS. Images come from
`experiments.vlm.emoji.load_split`, rendered once and cached in a directory
(`<run_dir>/data` unless the config's vlm.data_dir says otherwise).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.vlm.emoji import SceneConfig, example, load_split
from experiments.vlm.emoji.emoji_classes import CLASS_NAMES
from experiments.vlm.emoji.emoji_scenes import caption_items
from experiments.vlm.tiny.cell_loss import cell_labels

EOS = 0
# Output-length groups by the number of objects k (the caption/reasoning
# grows linearly with k), named as in the paper.
LENGTH_GROUPS = ("very_short", "short", "medium", "long")


def encode(text: str) -> list[int]:
  return list(text.encode("utf-8"))


def decode(tokens) -> str:
  """Bytes up to the first EOS."""
  out = []
  for t in np.asarray(tokens).tolist():
    if t == EOS:
      break
    out.append(int(t))
  return bytes(out).decode("utf-8", errors="replace")


def length_group(k: int, k_max: int) -> str:
  """Quartile of k in [1, k_max]: very_short / short / medium / long."""
  q = min(3, int(4 * (k - 1) / max(1, k_max)))
  return LENGTH_GROUPS[q]


class SceneData:
  """One split of scenes with images and tokenised examples of one task."""

  def __init__(self, cache_dir, scene_config: SceneConfig, split: str, n: int, *,
               seed: int = 0, task: str = "caption", filler_per_item: int = 0):
    self.scene_config = scene_config
    self.scenes, self.images = load_split(Path(cache_dir), scene_config, split, n, seed=seed)
    if task not in ("caption", "count", "mix"):
      raise ValueError(f"SceneData: task={task!r} is not 'caption', 'count' or 'mix'.")
    self.task = task
    # "mix": even scenes are captioned, odd ones get the counting question.
    tasks = [task if task != "mix" else ("caption", "count")[i % 2]
             for i in range(len(self.scenes))]
    self.examples = [example(s, t, filler_per_item=filler_per_item)
                     for s, t in zip(self.scenes, tasks, strict=True)]
    self.prompts = [encode(e["prompt"]) for e in self.examples]
    self.targets = [encode(e["target"]) + [EOS] for e in self.examples]
    self.max_prompt = max(len(p) for p in self.prompts)
    self.max_text = max(len(p) + len(t) for p, t in zip(self.prompts, self.targets, strict=True))

  def __len__(self):
    return len(self.scenes)

  def batch(self, idx, text_len: int | None = None) -> dict:
    """Training rows: images, tokens [B, T], valid [B, T], loss_mask [B, T], cell_labels.

    loss_mask[b, j] marks tokens j that are predicted (target bytes and EOS);
    cell_labels [B, rows·cols] is each grid cell's class (len(CLASS_NAMES) = empty).
    """
    T = self.max_text if text_len is None else text_len
    idx = np.asarray(idx)
    tokens = np.zeros((len(idx), T), np.int32)
    valid = np.zeros((len(idx), T), bool)
    loss_mask = np.zeros((len(idx), T), bool)
    for r, i in enumerate(idx):
      p, t = self.prompts[i], self.targets[i]
      row = (p + t)[:T]
      tokens[r, :len(row)] = row
      valid[r, :len(row)] = True
      loss_mask[r, len(p):len(row)] = True
    return {"images": self.images[idx], "tokens": tokens, "valid": valid,
            "loss_mask": loss_mask,
            "cell_labels": cell_labels([self.scenes[i] for i in idx], len(CLASS_NAMES))}

  def prompt_batch(self, idx) -> dict:
    """Right-padded prompts for generation: tokens [B, Tp], lengths [B]."""
    idx = np.asarray(idx)
    Tp = self.max_prompt
    tokens = np.zeros((len(idx), Tp), np.int32)
    lengths = np.zeros((len(idx),), np.int32)
    for r, i in enumerate(idx):
      p = self.prompts[i]
      tokens[r, :len(p)] = p
      lengths[r] = len(p)
    return {"images": self.images[idx], "tokens": tokens, "lengths": lengths}


def item_correct(text: str, scene) -> list[bool]:
  """Per object in reading order: does the generated text hold its exact item?

  An item is "position: name." (e.g. "top-left: dog."); order is not checked,
  only that the exact phrase appears at a word start (so "center: x." is not
  found inside "top-center: x.").
  """
  padded = " " + text
  return [(" " + item) in padded for item in caption_items(scene)]


class SceneSampler:
  """Endless training batches of scenes, exactly resumable (the loop's batch source).

  The draws are those of the stages before the one loop: a numpy
  `default_rng(seed)`, and per step `rng.choice(len(data), batch_size,
  replace=len(data) < batch_size)` (mode "rows": `SceneData.batch`), or
  `np.repeat(rng.choice(len(data), prompts, replace=False), group_size)`
  (mode "prompts", GRPO: `SceneData.prompt_batch` + the row indices `idx`).
  A curriculum gives one scene set per phase (`datasets[i]`, loaded on first
  use) and `phase_steps[i]` draws from it; each phase restarts the generator
  at `seed`, as the per-phase optimiser runs did. The state is the number of
  draws and the generator's `bit_generator.state` (JSON).
  """

  def __init__(self, datasets, phase_steps, *, batch_size: int, seed: int,
               mode: str = "rows", group_size: int = 1):
    if mode not in ("rows", "prompts"):
      raise ValueError(f"SceneSampler: mode={mode!r} is not 'rows' or 'prompts'.")
    if len(datasets) != len(phase_steps):
      raise ValueError(f"SceneSampler: {len(datasets)} scene sets for "
                       f"{len(phase_steps)} phases.")
    self._loaders = list(datasets)
    self._loaded = {}
    self.ends = np.cumsum(phase_steps).tolist()
    self.batch_size, self.seed, self.mode, self.group_size = batch_size, seed, mode, group_size
    self.draws = 0
    self.rng = np.random.default_rng(seed)

  def data(self, phase: int) -> SceneData:
    if phase not in self._loaded:
      loader = self._loaders[phase]
      self._loaded = {phase: loader() if callable(loader) else loader}
    return self._loaded[phase]

  def phase(self, draws: int) -> int:
    """The phase of draw number `draws` (0-based); the last phase runs on."""
    return min(int(np.searchsorted(self.ends, draws, side="right")), len(self.ends) - 1)

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    phase = self.phase(self.draws)
    if phase > 0 and self.draws == self.ends[phase - 1]:
      self.rng = np.random.default_rng(self.seed)   # each phase restarts the draw
    data = self.data(phase)
    self.draws += 1
    n = len(data)
    if self.mode == "rows":
      return data.batch(self.rng.choice(n, self.batch_size, replace=n < self.batch_size))
    idx = np.repeat(self.rng.choice(n, self.batch_size, replace=False), self.group_size)
    return {**data.prompt_batch(idx), "idx": idx.astype(np.int32)}

  def get_state(self) -> dict:
    return {"draws": self.draws, "rng": self.rng.bit_generator.state,
            "seed": self.seed, "batch_size": self.batch_size, "mode": self.mode,
            "group_size": self.group_size, "ends": self.ends}

  def set_state(self, state: dict) -> None:
    mine = {k: v for k, v in self.get_state().items() if k not in ("draws", "rng")}
    saved = {k: state.get(k) for k in mine}
    if saved != mine:
      raise ValueError(f"the checkpoint's scene sampler was made for other settings: saved "
                       f"{saved}, now {mine}; resuming would not continue the same draws.")
    self.draws = int(state["draws"])
    self.rng = np.random.default_rng(self.seed)
    self.rng.bit_generator.state = state["rng"]
