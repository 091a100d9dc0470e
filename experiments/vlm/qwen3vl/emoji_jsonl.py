"""The emoji scenes as LLaVA-style JSON lines: the embedded default data of Qwen3-VL runs.

    path = emoji_jsonl(cache_dir, "train", 256, task="count")   # written once, then reused
    data = ConversationData(path, processor)                      # experiments/vlm/qwen3vl/conversations.py

The scenes, captions, questions and splits are experiments.vlm.emoji's (DESIGN.md §4.2),
drawn from the same seeds, so a row here shows the image and asks what the
tiny VLM's stages ask of scene i. Each image is a PNG (nearest-neighbour
upscaled by `scale`) beside the JSONL; a row is

    {"id": "train-000003", "image": "<key>/train-000003.png", "task": "count",
     "conversations": [{"from": "human", "value": "<image>\\nHow many ...?"},
                       {"from": "gpt", "value": "top-left: dog. ... <answer>2</answer>"}],
     "answer": 2}

(caption rows have "answer": null). The file name holds every argument that
changes its content; PNGs and JSONL are written under temporary names and
renamed, the JSONL last, so a JSONL that exists is complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from experiments.vlm.emoji import SceneConfig, example, load_split, save_png

TASKS = ("caption", "count", "mix")


def jsonl_key(split: str, n: int, *, seed: int, task: str, scene_config: SceneConfig,
              filler_per_item: int, reasoning: bool, scale: int) -> str:
  c = scene_config
  return (f"emoji-{split}-{task}-n{n}-seed{seed}-{c.rows}x{c.cols}-k{c.min_objects}-{c.k_max}-"
          f"g{c.glyph_size}-f{filler_per_item}-r{int(reasoning)}-s{scale}")


def write_emoji_jsonl(out_dir, split: str, n: int, *, seed: int = 0, task: str = "count",
                      scene_config: SceneConfig | None = None, filler_per_item: int = 0,
                      reasoning: bool = True, scale: int = 1) -> Path:
  """Render `n` scenes of `split` into `out_dir` (PNGs + one JSONL); returns the JSONL."""
  scene_config = scene_config or SceneConfig()
  if task not in TASKS:
    raise ValueError(f"task={task!r} is not one of {TASKS}.")
  if not isinstance(scale, int) or scale < 1:
    raise ValueError(f"scale={scale!r} must be an int >= 1.")
  out = Path(out_dir)
  key = jsonl_key(split, n, seed=seed, task=task, scene_config=scene_config,
                  filler_per_item=filler_per_item, reasoning=reasoning, scale=scale)
  (out / key).mkdir(parents=True, exist_ok=True)
  scenes, images = load_split(out / "cache", scene_config, split, n, seed=seed)
  lines = []
  for i, (scene, image) in enumerate(zip(scenes, images, strict=True)):
    kind = task if task != "mix" else ("caption", "count")[i % 2]   # as the VLM's "mix"
    ex = example(scene, kind, filler_per_item=filler_per_item, reasoning=reasoning)
    name = f"{key}/{split}-{i:06d}.png"
    tmp = out / f"{name}.tmp.png"
    save_png(image, tmp, scale)
    tmp.replace(out / name)
    lines.append(json.dumps({
        "id": f"{split}-{i:06d}", "image": name, "task": kind,
        "conversations": [{"from": "human", "value": "<image>\n" + ex["prompt"]},
                          {"from": "gpt", "value": ex["target"]}],
        "answer": ex["answer"]}))
  path = out / f"{key}.jsonl"
  tmp = path.with_name(path.name + f".tmp{os.getpid()}")
  tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
  tmp.replace(path)
  return path


def emoji_jsonl(cache_dir, split: str, n: int, **kw) -> Path:
  """The JSONL of `write_emoji_jsonl(cache_dir, split, n, **kw)`, written only if absent."""
  key = jsonl_key(split, n, seed=kw.get("seed", 0), task=kw.get("task", "count"),
                  scene_config=kw.get("scene_config") or SceneConfig(),
                  filler_per_item=kw.get("filler_per_item", 0),
                  reasoning=kw.get("reasoning", True), scale=kw.get("scale", 1))
  path = Path(cache_dir) / f"{key}.jsonl"
  if path.is_file():
    return path
  return write_emoji_jsonl(cache_dir, split, n, **kw)
