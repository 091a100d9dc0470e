"""Qwen's chat-ML for image + text conversations, without a template engine.

    template = chat_template_from_source(source)     # the checkpoint's own template text
    rendered = render(messages, template, add_generation_prompt=True)
    rendered.text      # "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n..."

A checkpoint ships its chat template as Jinja (chat_template.jinja,
chat_template.json or tokenizer_config.json). Jinja is not a run-time
dependency, so the template is recognised instead of executed: it must be
Qwen's chat-ML with `<|vision_start|><|image_pad|><|vision_end|>` image
placeholders (Qwen2-VL, Qwen2.5-VL, Qwen3-VL Instruct), and the one thing
they differ in on the conversations rendered here is read from it: the
default system turn Qwen2-VL inserts when the first message is not a system
message (Qwen3-VL has none). tests/experiments/qwen3vl/ checks the text
equals transformers' `apply_chat_template` with the checkpoint template.

A message is {"role": "system" | "user" | "assistant", "content": str | items};
an item is {"type": "text", "text": str} or {"type": "image", "image": x}
(x: a PIL image, a uint8 array or a path). Refused with one line each, where
the templates would silently drop or disagree: tool turns and tool calls,
a system message that is not the first, images outside user turns, videos,
reasoning (`<think>`) templates.
"""

from __future__ import annotations

import dataclasses
import re

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
ROLES = ("system", "user", "assistant")
# Qwen2-VL: {% if loop.first and message['role'] != 'system' %}<|im_start|>system\nX<|im_end|>
# (Qwen2.5-VL writes the same inside {{ '...' }}, with the newline escaped).
_DEFAULT_SYSTEM = re.compile(
    r"!=\s*'system'\s*%\}\s*(?:\{\{-?\s*')?<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>",
    re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """What the recognised template renders beyond plain chat-ML."""

  default_system: str | None = None   # inserted when messages[0] is not a system message


@dataclasses.dataclass(frozen=True)
class Rendered:
  """A rendered conversation: its text, the assistant spans and the images in order.

  assistant_spans[i] = (start, end) character offsets of the i-th assistant
  turn's content and its closing <|im_end|> (what a loss trains on).
  """

  text: str
  assistant_spans: tuple[tuple[int, int], ...]
  images: tuple


def chat_template_from_source(source: str) -> ChatTemplate:
  """The ChatTemplate a checkpoint's Jinja source renders; anything else is refused."""
  if not isinstance(source, str) or IM_START not in source or IMAGE_PLACEHOLDER not in source:
    raise ValueError("chat template: not Qwen's chat-ML with "
                     f"{IMAGE_PLACEHOLDER} image placeholders; it cannot be rendered here.")
  if "<think>" in source:
    raise ValueError("chat template: a reasoning (<think>) template is not rendered here; "
                     "use an Instruct checkpoint's template.")
  match = _DEFAULT_SYSTEM.search(source)
  return ChatTemplate(default_system=match.group(1) if match else None)


def _is_image(item: dict) -> bool:
  return item.get("type") == "image" or "image" in item


def _items(message: dict, index: int) -> list[dict]:
  content = message.get("content")
  if isinstance(content, str):
    return [{"type": "text", "text": content}]
  if not isinstance(content, (list, tuple)):
    raise ValueError(f"message {index}: content must be a string or a list of items, "
                     f"got {type(content).__name__}.")
  for item in content:
    if not isinstance(item, dict):
      raise ValueError(f"message {index}: content item {item!r} is not a dict.")
    if item.get("type") == "video" or "video" in item:
      raise ValueError(f"message {index}: videos are not supported (images only).")
    if not _is_image(item) and not isinstance(item.get("text"), str):
      raise ValueError(f"message {index}: content item with keys {sorted(item)} is neither "
                       "an image nor a text.")
  return list(content)


def _check(messages) -> None:
  if not isinstance(messages, (list, tuple)) or not messages:
    raise ValueError("conversation: expected a non-empty list of messages.")
  for i, message in enumerate(messages):
    if not isinstance(message, dict) or message.get("role") not in ROLES:
      role = message.get("role") if isinstance(message, dict) else message
      raise ValueError(f"message {i}: role {role!r} is not one of {ROLES}.")
    if message.get("tool_calls"):
      raise ValueError(f"message {i}: tool calls are not supported.")
    if message["role"] == "system" and i:
      raise ValueError(f"message {i}: a system message must be the first message.")


def render(messages, template: ChatTemplate = ChatTemplate(), *,
           add_generation_prompt: bool = False, add_vision_id: bool = False,
           image_token_counts=None) -> Rendered:
  """Chat-ML text of `messages`.

  Each image becomes <|vision_start|> <|image_pad|>·n <|vision_end|>, with
  n = image_token_counts[i] (1 when None: the text a processor then expands,
  as transformers' apply_chat_template leaves it); add_vision_id prefixes
  "Picture k: " as the templates do.
  """
  _check(messages)
  parts: list[str] = []
  spans: list[tuple[int, int]] = []
  images: list = []
  at = 0

  def put(text: str) -> None:
    nonlocal at
    parts.append(text)
    at += len(text)

  def text_of(items, index: int, allow_images: bool) -> None:
    for item in items:
      if _is_image(item):
        if not allow_images:
          raise ValueError(f"message {index}: images are only supported in user turns.")
        if image_token_counts is not None and len(images) >= len(image_token_counts):
          raise ValueError(f"conversation has more images than the {len(image_token_counts)} "
                           "image token counts given.")
        n = 1 if image_token_counts is None else int(image_token_counts[len(images)])
        images.append(item.get("image"))
        if add_vision_id:
          put(f"Picture {len(images)}: ")
        put(VISION_START + IMAGE_PAD * n + VISION_END)
      else:
        put(item["text"])

  first = 0
  if messages[0]["role"] == "system":
    put(f"{IM_START}system\n")
    text_of(_items(messages[0], 0), 0, allow_images=False)
    put(f"{IM_END}\n")
    first = 1
  elif template.default_system is not None:
    put(f"{IM_START}system\n{template.default_system}{IM_END}\n")
  for i in range(first, len(messages)):
    role = messages[i]["role"]
    put(f"{IM_START}{role}\n")
    start = at
    text_of(_items(messages[i], i), i, allow_images=role == "user")
    put(IM_END)
    if role == "assistant":
      spans.append((start, at))
    put("\n")
  if add_generation_prompt:
    put(f"{IM_START}assistant\n")
  if image_token_counts is not None and len(image_token_counts) != len(images):
    raise ValueError(f"conversation has {len(images)} images but {len(image_token_counts)} "
                     "image token counts were given.")
  return Rendered("".join(parts), tuple(spans), tuple(images))
