"""LLaVA-style JSONL -> Qwen3-VL examples: loss masks, the emoji default, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from experiments.hf.qwen3vl.processor import Qwen3VLProcessor
from experiments.hf.qwen3vl.synthetic_processor import write_synthetic_processor_dir
from experiments.vlm.emoji import SceneConfig, make_split
from experiments.vlm.emoji.emoji_scenes import count
from experiments.vlm.qwen3vl.conversations import ConversationData, collate, collate_prompts
from experiments.vlm.qwen3vl.emoji_jsonl import emoji_jsonl
from experiments.vlm.qwen3vl.image import ImageConfig


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
  return Qwen3VLProcessor.from_dir(write_synthetic_processor_dir(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """Two PNGs of different sizes and a broken one."""
  root = tmp_path_factory.mktemp("rows")
  rng = np.random.default_rng(1)
  Image.fromarray(rng.integers(0, 256, (64, 96, 3), np.uint8)).save(root / "a.png")
  Image.fromarray(rng.integers(0, 256, (150, 40, 3), np.uint8)).save(root / "b.png")
  (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
  return root


def write_rows(root, name, rows):
  path = root / name
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return path


TWO_TURNS = {"id": "r0", "images": ["a.png", "b.png"], "conversations": [
    {"from": "system", "value": "Answer briefly."},
    {"from": "human", "value": "<image>\nWhat is this?"},
    {"from": "gpt", "value": "A square of noise."},
    {"from": "human", "value": "And <image> here?"},
    {"from": "gpt", "value": "Noise again, taller.\nDone."}]}


def test_the_loss_covers_the_assistant_turns_only(processor, folder):
  data = ConversationData(write_rows(folder, "two.jsonl", [TWO_TURNS]), processor)
  ex = data[0]
  ids, mask = ex["input_ids"], ex["loss_mask"]
  decode = lambda x: processor.decode(x, skip_special_tokens=False)   # noqa: E731
  assert decode(ids[mask]) == "A square of noise.<|im_end|>Noise again, taller.\nDone.<|im_end|>"
  # Masked runs are exactly the two answers, each right after "<|im_start|>assistant\n".
  runs = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
  starts, ends = runs[::2], runs[1::2]
  assert len(starts) == 2
  for s in starts:
    assert decode(ids[:s]).endswith("<|im_start|>assistant\n")
  assert ends[-1] == len(ids) - 1 and decode(ids[-1:]) == "\n"
  # The images are in the row's order; their placeholders count t·h·w / 4.
  grids = ex["image_grid_thw"]
  assert (ids == processor.image_token_id).sum() == grids.prod(1).sum() // 4
  assert len(ex["pixel_values"]) == grids.prod(1).sum()
  # The prompt is everything before the last answer, then the generation header.
  assert decode(ex["prompt_ids"]) == decode(ids[:starts[-1]])


def test_emoji_rows_render_and_read_back(processor, tmp_path):
  path = emoji_jsonl(tmp_path, "train", 4, task="mix", scale=2)
  assert emoji_jsonl(tmp_path, "train", 4, task="mix", scale=2) == path   # reused
  data = ConversationData(path, processor, fixed_size=(128, 128))
  scenes = make_split(SceneConfig(), "train", 4, seed=0)
  examples = [data[i] for i in range(len(data))]
  for i, (ex, scene) in enumerate(zip(examples, scenes, strict=True)):
    row = data.rows[i]
    assert row["task"] == ("caption", "count")[i % 2]
    assert ex["answer"] == (None if i % 2 == 0 else count(scene))
    target = row["conversations"][1]["value"]
    masked = processor.decode(ex["input_ids"][ex["loss_mask"]], skip_special_tokens=False)
    assert masked == target + "<|im_end|>"
    assert ex["image_grid_thw"].tolist() == [[1, 8, 8]]     # fixed 128x128: 16 tokens
  png = Image.open(tmp_path / row["image"])
  assert png.size == (2 * 48, 2 * 48)
  batch = collate(examples, seq_len=256, pad_id=data.pad_id)
  assert batch["input_ids"].shape == (4, 256) and batch["pixel_values"].shape == (256, 1536)
  assert batch["loss_mask"].sum() == sum(e["loss_mask"].sum() for e in examples)
  prompts = collate_prompts(examples, data.pad_id)
  assert prompts["attention_mask"][:, -1].all() and prompts["answers"][1] == count(scenes[1])


def _error(fn) -> str:
  with pytest.raises(ValueError) as info:
    fn()
  message = str(info.value)
  assert "\n" not in message
  return message


def test_bad_rows_are_one_line_each(processor, folder):
  one = {"id": "x", "image": "a.png",
         "conversations": [{"from": "human", "value": "<image>\nHi"},
                           {"from": "gpt", "value": "Yes."}]}

  def data(name, **change):
    return lambda: ConversationData(write_rows(folder, name, [dict(one, **change)]), processor)

  assert "missing.png: no such file" in _error(data("m.jsonl", image="missing.png"))
  broken = ConversationData(write_rows(folder, "b.jsonl", [dict(one, image="broken.png")]),
                            processor)
  assert "broken.png: not a readable image" in _error(lambda: broken[0])
  two_tokens = [{"from": "human", "value": "<image><image> Hi"}, {"from": "gpt", "value": "."}]
  assert "2 <image> tokens but 1 images" in _error(data("t.jsonl", conversations=two_tokens))
  no_token = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "."}]
  assert "0 <image> tokens but 1 images" in _error(data("f.jsonl", conversations=no_token))
  bad_role = [{"from": "robot", "value": "<image>"}]
  assert "'from'='robot'" in _error(data("r.jsonl", conversations=bad_role))


def test_bad_processor_inputs_are_one_line_each(processor, folder):
  image = Image.open(folder / "a.png")
  placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
  assert "2 <|image_pad|> placeholders but 1 images" in _error(
      lambda: processor(text=[placeholder * 2], images=[image]))
  assert "0 <|image_pad|> placeholders but 1 images" in _error(
      lambda: processor(text=["no image"], images=[image]))
  assert "1 <|image_pad|> placeholders but 0 images" in _error(
      lambda: processor(text=[placeholder]))
  # Resizing off: an image over the budget is refused, not resized.
  fixed = Qwen3VLProcessor(processor.tokenizer, ImageConfig(
      patch_size=16, min_pixels=32 * 32, max_pixels=64 * 64, do_resize=False),
      template=processor.template, pad_token="<|endoftext|>")
  assert "beyond the pixel budget max_pixels=4096" in _error(
      lambda: fixed(text=[placeholder], images=[image]))
  assert "missing.png: no such file" in _error(
      lambda: processor(text=[placeholder], images=[folder / "missing.png"]))


def test_the_cli_refuses_a_bad_row_with_exit_2(folder, tmp_path):
  """One CLI run (the checks above share its path: ValueError -> "error: ..." line, exit 2)."""
  from cli_runner import run_cli  # tests/experiments/cli_runner.py, beside conftest.py
  rows = write_rows(folder, "cli.jsonl", [
      {"id": "ok", "image": "a.png", "conversations": [{"from": "human", "value": "<image>"},
                                                       {"from": "gpt", "value": "Yes."}]},
      {"id": "gone", "image": "gone.png", "conversations": [{"from": "human", "value": "<image>"},
                                                            {"from": "gpt", "value": "No."}]}])
  run = run_cli("train", "--config=experiments/configs/qwen3vl_pvm_sft.py:smoke",
                           f"--config.qwen3vl.data.train={rows}", f"--workdir={tmp_path / 'run'}")
  assert run.returncode == 2, run.stderr[-2000:]
  lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
  assert lines[-1] == f"error: {rows} row 'gone': image {folder / 'gone.png'}: no such file."
  assert not any("Traceback" in line for line in lines), lines
  assert not (tmp_path / "run").exists()
