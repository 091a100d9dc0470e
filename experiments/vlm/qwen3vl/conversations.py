"""Image-text conversations in LLaVA-style JSON lines -> Qwen3-VL training examples.

    data = ConversationData("train.jsonl", Qwen3VLProcessor.from_dir(hf_dir), fixed_size=(256, 256))
    batch = collate([data[i] for i in range(8)], seq_len=512, pad_id=data.pad_id)

One JSON object a line:
    {"id": "7", "image": "a.png" | "images": ["a.png", "b.png"],
     "conversations": [{"from": "human", "value": "<image>\\nWhat is this?"},
                       {"from": "gpt", "value": "A cat."}],
     "answer": 3}                                   # optional, kept for rewards
`from` is human / user, gpt / assistant, or system (first turn only); each
"<image>" in a value is the next image of the row, where it stands (the text
around it is kept as it is); the counts of "<image>" and of images must
agree. Image paths are relative to the JSONL file's folder unless absolute.

A turn list renders with the checkpoint's chat template (experiments/hf/qwen3vl/
chat.py), each image expanded to its placeholder tokens. The loss covers the
assistant turns: the tokens whose first character lies in an assistant's
content or its closing <|im_end|> (the turn header and the newline after
<|im_end|> are not trained). loss_mask[t] marks token t as a target.

Rows are checked when the file is read (JSON, roles, <image> counts, image
files present, an "answer" that is an integer, and with `require_answers` on
every row); images are read and preprocessed when an example is built.
Every refusal is one ValueError line naming the file and line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.vlm.qwen3vl.image import image_tokens, load_image, preprocess_images

IMAGE_TOKEN = "<image>"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system"}


def read_jsonl(path) -> list[dict]:
  """The rows of a JSONL file (blank lines skipped), each a JSON object."""
  path = Path(path)
  if not path.is_file():
    raise ValueError(f"{path}: no such file.")
  rows = []
  for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{n}: not JSON ({e.msg}).") from None
    if not isinstance(row, dict):
      raise ValueError(f"{path}:{n}: not a JSON object.")
    rows.append(row)
  if not rows:
    raise ValueError(f"{path}: no rows.")
  return rows


def row_images(row: dict) -> list[str]:
  images = row.get("images", [row["image"]] if "image" in row else [])
  if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
    raise ValueError(f"images={images!r} is not a list of paths.")
  return images


def row_messages(row: dict, root: Path) -> list[dict]:
  """The chat messages of a row; image items carry the resolved image paths."""
  turns = row.get("conversations")
  if not isinstance(turns, list) or not turns:
    raise ValueError("no 'conversations' list.")
  paths = [Path(p) if Path(p).is_absolute() else root / p for p in row_images(row)]
  n_tokens = sum(t.get("value", "").count(IMAGE_TOKEN) for t in turns
                 if isinstance(t, dict) and isinstance(t.get("value"), str))
  if n_tokens != len(paths):
    raise ValueError(f"{n_tokens} {IMAGE_TOKEN} tokens but {len(paths)} images.")
  messages, k = [], 0
  for j, turn in enumerate(turns):
    if not isinstance(turn, dict) or turn.get("from") not in ROLES:
      who = turn.get("from") if isinstance(turn, dict) else turn
      raise ValueError(f"turn {j}: 'from'={who!r} is not one of {sorted(ROLES)}.")
    value = turn.get("value")
    if not isinstance(value, str):
      raise ValueError(f"turn {j}: 'value' is not a string.")
    items = []
    for i, piece in enumerate(value.split(IMAGE_TOKEN)):
      if i:
        items.append({"type": "image", "image": paths[k]})
        k += 1
      if piece:
        items.append({"type": "text", "text": piece})
    messages.append({"role": ROLES[turn["from"]], "content": items})
  return messages


def prompt_messages(messages: list[dict]) -> list[dict]:
  """The turns before a final assistant turn (what generation is asked to continue)."""
  return messages[:-1] if messages[-1]["role"] == "assistant" else messages


def build_example(messages: list[dict], processor, *, fixed_size=None) -> dict:
  """input_ids [T] int32, loss_mask [T] bool, prompt_ids [Tp] int32, pixel_values [n, P],
  image_grid_thw [I, 3] of one conversation."""
  paths = [item["image"] for m in messages if isinstance(m["content"], list)
           for item in m["content"] if item.get("type") == "image"]
  images = [load_image(p) if isinstance(p, (str, Path)) else p for p in paths]
  pixel_values, grids = preprocess_images(images, processor.image_config, fixed_size)
  counts = [image_tokens(g, processor.image_config.merge_size) for g in grids]
  rendered = processor.render(messages, image_token_counts=counts)
  ids, offsets = processor.encode(rendered.text)
  starts = np.asarray([s for s, _ in offsets], np.int64)
  loss_mask = np.zeros(len(ids), bool)
  for lo, hi in rendered.assistant_spans:
    loss_mask |= (starts >= lo) & (starts < hi)
  head = prompt_messages(messages)
  n_head = len(processor.render(head).images)
  prompt = processor.render(head, add_generation_prompt=True,
                            image_token_counts=counts[:n_head])
  return {"input_ids": np.asarray(ids, np.int32), "loss_mask": loss_mask,
          "prompt_ids": np.asarray(processor.encode(prompt.text)[0], np.int32),
          "pixel_values": pixel_values, "image_grid_thw": grids}


def check_answer(row: dict, *, required: bool) -> None:
  """A row's "answer": absent (unless `required`) or an integer (a bool, a float such as
  2.7 or a string such as "two" is refused: the reward compares integers)."""
  if "answer" not in row or row["answer"] is None:
    if required:
      raise ValueError("no 'answer': Stage II needs an integer answer on every row "
                       "(verifiable rewards).")
    return
  answer = row["answer"]
  if isinstance(answer, bool) or not isinstance(answer, int):
    raise ValueError(f"answer={answer!r} is not an integer.")


class ConversationData:
  """The rows of a JSONL file as examples, built on access (images read then)."""

  def __init__(self, path, processor, *, fixed_size: tuple[int, int] | None = None,
               require_answers: bool = False):
    """`require_answers`: every row must hold an integer "answer" (Stage II's verifiable
    reward); an answer that is there is an integer either way."""
    self.path = Path(path)
    self.processor = processor
    self.fixed_size = None if fixed_size is None else tuple(fixed_size)
    self.rows = read_jsonl(self.path)
    self.messages = []
    for n, row in enumerate(self.rows):
      try:
        check_answer(row, required=require_answers)
        messages = row_messages(row, self.path.parent)
        processor.render(messages)                  # roles, items, image turns
        for m in messages:
          for item in m["content"]:
            if item.get("type") == "image" and not Path(item["image"]).is_file():
              raise ValueError(f"image {item['image']}: no such file.")
      except ValueError as e:
        raise ValueError(f"{self.path} row {row.get('id', n)!r}: {e}") from None
      self.messages.append(messages)

  @property
  def pad_id(self) -> int:
    return self.processor.pad_token_id or 0

  def __len__(self) -> int:
    return len(self.rows)

  def __getitem__(self, i: int) -> dict:
    row = self.rows[i]
    try:
      example = build_example(self.messages[i], self.processor, fixed_size=self.fixed_size)
    except ValueError as e:
      raise ValueError(f"{self.path} row {row.get('id', i)!r}: {e}") from None
    return {**example, "id": row.get("id", i), "answer": row.get("answer")}


def _images(examples) -> dict:
  pixels = [e["pixel_values"] for e in examples]
  grids = [e["image_grid_thw"] for e in examples]
  return {"pixel_values": np.concatenate(pixels, axis=0),
          "image_grid_thw": np.concatenate(grids, axis=0),
          "n_images_B": np.asarray([len(g) for g in grids], np.int32)}


def collate(examples, seq_len: int, pad_id: int) -> dict:
  """Right-padded training rows: input_ids, attention_mask, loss_mask [B, seq_len] and the
  images of all rows in order (static shapes with a fixed image size and count per row)."""
  B = len(examples)
  ids = np.full((B, seq_len), pad_id, np.int32)
  mask = np.zeros((B, seq_len), bool)
  loss = np.zeros((B, seq_len), bool)
  for b, e in enumerate(examples):
    n = len(e["input_ids"])
    if n > seq_len:
      raise ValueError(f"row {e.get('id', b)!r}: {n} tokens exceed seq_len={seq_len}.")
    ids[b, :n] = e["input_ids"]
    mask[b, :n] = True
    loss[b, :n] = e["loss_mask"]
  return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss, **_images(examples)}


def collate_prompts(examples, pad_id: int, prompt_len: int | None = None) -> dict:
  """Left-padded generation prompts [B, Tp] (the last token of every row is at Tp - 1),
  their images, and the rows' answers."""
  Tp = max(len(e["prompt_ids"]) for e in examples) if prompt_len is None else prompt_len
  ids = np.full((len(examples), Tp), pad_id, np.int32)
  mask = np.zeros((len(examples), Tp), bool)
  for b, e in enumerate(examples):
    n = len(e["prompt_ids"])
    if n > Tp:
      raise ValueError(f"row {e.get('id', b)!r}: a prompt of {n} tokens exceeds "
                       f"prompt_len={Tp}.")
    ids[b, Tp - n:] = e["prompt_ids"]
    mask[b, Tp - n:] = True
  return {"input_ids": ids, "attention_mask": mask, **_images(examples),
          "answers": [e.get("answer") for e in examples]}
