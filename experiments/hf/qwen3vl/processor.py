"""The Qwen3-VL processor: text / conversations + images -> the model's numpy inputs.

    processor = Qwen3VLProcessor.from_dir(hf_dir)
    inputs = processor(conversations=[messages], add_generation_prompt=True)
    inputs = processor(text=["<|vision_start|><|image_pad|><|vision_end|>Hi"], images=[[img]])
    # input_ids [B, T], attention_mask [B, T], mm_token_type_ids [B, T] (0 text, 1 image),
    # pixel_values [N, C·Tp·p·p] float32, image_grid_thw [I, 3] (only with images)

Equal to transformers' Qwen3VLProcessor (its PIL image processor) on the same
inputs; no torch, no transformers. From the checkpoint directory it reads
tokenizer.json (the `tokenizers` package), tokenizer_config.json (pad token,
padding side, the special tokens a chat template sees), preprocessor_config.json
(experiments/vlm/qwen3vl/image.py) and the chat template, where transformers
looks for it (chat_template.jinja, chat_template.json, tokenizer_config.json),
rendered with jinja2 as transformers renders it (experiments/hf/qwen3vl/chat.py).
Every <|image_pad|> of a text is one image, expanded to t·h·w / merge² copies
(one per merged patch window); the counts of placeholders and images must agree
(DESIGN.md §11.7).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.hf.config import read_json_object
from experiments.hf.qwen3vl import chat
from experiments.vlm.qwen3vl.image import ImageConfig, image_tokens, load_image, preprocess_images

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
VIDEO_PAD = "<|video_pad|>"
MM_TYPE_IMAGE, MM_TYPE_VIDEO = 1, 2     # transformers' mm_token_type_ids values


def _token_text(value) -> str | None:
  """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


def template_source(hf_dir: Path, tokenizer_config: dict) -> tuple[str, str] | None:
  """(the chat template's Jinja text, where it was read) where transformers looks for it,
  or None."""
  if (hf_dir / "chat_template.jinja").is_file():
    return (hf_dir / "chat_template.jinja").read_text(encoding="utf-8"), str(
        hf_dir / "chat_template.jinja")
  if (hf_dir / "chat_template.json").is_file():
    value = read_json_object(hf_dir / "chat_template.json").get("chat_template")
    if isinstance(value, str):
      return value, str(hf_dir / "chat_template.json")
  value = tokenizer_config.get("chat_template")
  if isinstance(value, list):   # named templates: [{"name": "default", "template": ...}]
    value = next((t.get("template") for t in value
                  if isinstance(t, dict) and t.get("name") == "default"), None)
  return (value, f"{hf_dir / TOKENIZER_CONFIG} (chat_template)") if isinstance(value, str) \
      else None


def special_tokens(hf_dir: Path, tokenizer_config: dict) -> dict[str, str]:
  """The named special tokens a chat template sees (bos_token, eos_token, ...): those of
  tokenizer_config.json, then of special_tokens_map.json for the ones it leaves out."""
  found = {name: _token_text(tokenizer_config.get(name)) for name in chat.SPECIAL_TOKEN_NAMES}
  if (hf_dir / SPECIAL_TOKENS_MAP).is_file():
    legacy = read_json_object(hf_dir / SPECIAL_TOKENS_MAP)
    found = {name: found[name] or _token_text(legacy.get(name)) for name in found}
  return {name: value for name, value in found.items() if value is not None}


def flat_images(images, n_texts: int) -> tuple[list, list[int] | None]:
  """(flat list, images per text or None) of a flat or a per-text nested image list."""
  if images is None:
    return [], None
  if not isinstance(images, (list, tuple)):
    images = [images]
  if images and all(isinstance(x, (list, tuple)) for x in images):
    if len(images) != n_texts:
      raise ValueError(f"images: {len(images)} lists of images for {n_texts} texts.")
    return [x for row in images for x in row], [len(row) for row in images]
  return list(images), None


class Qwen3VLProcessor:
  """Tokenizer + image preprocessing + chat template of one Qwen3-VL checkpoint."""

  def __init__(self, tokenizer, image_config: ImageConfig, *,
               template: chat.ChatTemplate | None = None, pad_token: str | None = None,
               padding_side: str = "right"):
    self.tokenizer = tokenizer
    self.image_config = image_config
    self.template = template
    if padding_side not in ("left", "right"):
      raise ValueError(f"padding_side={padding_side!r} is not 'left' or 'right'.")
    self.padding_side = padding_side
    self.image_token_id = self._id(chat.IMAGE_PAD)
    self.vision_start_token_id = self._id(chat.VISION_START)
    self.vision_end_token_id = self._id(chat.VISION_END)
    self.video_token_id = tokenizer.token_to_id(VIDEO_PAD)
    self.pad_token_id = None if pad_token is None else self._id(pad_token)

  def _id(self, token: str) -> int:
    token_id = self.tokenizer.token_to_id(token)
    if token_id is None:
      raise ValueError(f"{TOKENIZER} has no {token} token: not a Qwen3-VL tokenizer.")
    return token_id

  @classmethod
  def from_dir(cls, hf_dir) -> Qwen3VLProcessor:
    """The processor of a checkpoint directory (its tokenizer, preprocessor and template)."""
    from tokenizers import Tokenizer
    hf_dir = Path(hf_dir)
    for name in (TOKENIZER, PREPROCESSOR_CONFIG):
      if not (hf_dir / name).is_file():
        raise ValueError(f"{hf_dir}: no {name}; a Qwen3-VL checkpoint directory has one.")
    try:
      tokenizer = Tokenizer.from_file(str(hf_dir / TOKENIZER))
    except Exception as e:   # the Rust library raises its own Exception type
      raise ValueError(f"{hf_dir / TOKENIZER}: not readable ({' '.join(str(e).split())})."
                       ) from None
    config = {}
    if (hf_dir / TOKENIZER_CONFIG).is_file():
      config = read_json_object(hf_dir / TOKENIZER_CONFIG)
    found = template_source(hf_dir, config)
    template = None
    if found is not None:
      template = chat.chat_template_from_source(
          found[0], name=found[1], special_tokens=special_tokens(hf_dir, config))
    image_config = ImageConfig.from_preprocessor_config(
        read_json_object(hf_dir / PREPROCESSOR_CONFIG))
    processor = cls(tokenizer, image_config,
                    template=template,
                    pad_token=_token_text(config.get("pad_token")),
                    padding_side=config.get("padding_side", "right"))
    if (hf_dir / "config.json").is_file():
      wanted = read_json_object(hf_dir / "config.json").get("image_token_id")
      if wanted is not None and wanted != processor.image_token_id:
        raise ValueError(f"{hf_dir}: config.json image_token_id={wanted} but {TOKENIZER} "
                         f"has {chat.IMAGE_PAD} = {processor.image_token_id}.")
    return processor

  # -- text ---------------------------------------------------------------------------

  def render(self, conversation, *, add_generation_prompt: bool = False,
             add_vision_id: bool = False, image_token_counts=None,
             **variables) -> chat.Rendered:
    """One conversation rendered with this checkpoint's chat template (chat.render);
    `variables`: further template variables."""
    if self.template is None:
      raise ValueError("this checkpoint has no chat template (chat_template.jinja, "
                       "chat_template.json or tokenizer_config.json); pass text= instead.")
    return chat.render(conversation, self.template, add_generation_prompt=add_generation_prompt,
                       add_vision_id=add_vision_id, image_token_counts=image_token_counts,
                       **variables)

  def expand_image_tokens(self, texts: list[str], grids_Ix3, per_text=None) -> list[str]:
    """Each <|image_pad|> -> t·h·w / merge² copies, images taken in order over the texts."""
    counts = [sample.count(chat.IMAGE_PAD) for sample in texts]
    if sum(counts) != len(grids_Ix3):
      raise ValueError(f"the texts hold {sum(counts)} {chat.IMAGE_PAD} placeholders but "
                       f"{len(grids_Ix3)} images were given.")
    if per_text is not None and counts != per_text:
      raise ValueError(f"{chat.IMAGE_PAD} placeholders per text {counts} differ from the "
                       f"images per text {per_text}.")
    out, k = [], 0
    for sample, n in zip(texts, counts, strict=True):
      pieces = sample.split(chat.IMAGE_PAD)
      text = pieces[0]
      for j in range(n):
        text += chat.IMAGE_PAD * image_tokens(grids_Ix3[k + j], self.image_config.merge_size)
        text += pieces[j + 1]
      out.append(text)
      k += n
    return out

  def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, character offsets) of one text, special tokens matched as the tokenizer does."""
    encoding = self.tokenizer.encode(text)
    return list(encoding.ids), list(encoding.offsets)

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def pad(self, rows: list[list[int]], padding_side: str | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids [B, T] int64, attention_mask [B, T] int64), padded to the longest row."""
    side = padding_side or self.padding_side
    T = max(len(r) for r in rows)
    if any(len(r) != T for r in rows) and self.pad_token_id is None:
      raise ValueError(f"rows of different lengths need a pad token; {TOKENIZER_CONFIG} "
                       "names none.")
    ids = np.full((len(rows), T), self.pad_token_id or 0, np.int64)
    mask = np.zeros((len(rows), T), np.int64)
    for b, row in enumerate(rows):
      at = slice(0, len(row)) if side == "right" else slice(T - len(row), T)
      ids[b, at] = row
      mask[b, at] = 1
    return ids, mask

  def mm_token_type_ids(self, ids_BxT: np.ndarray) -> np.ndarray:
    types = np.zeros_like(ids_BxT)
    types[ids_BxT == self.image_token_id] = MM_TYPE_IMAGE
    if self.video_token_id is not None:
      types[ids_BxT == self.video_token_id] = MM_TYPE_VIDEO
    return types

  # -- the call -----------------------------------------------------------------------

  def __call__(self, text=None, images=None, *, conversations=None,
               add_generation_prompt: bool = False, add_vision_id: bool = False,
               padding_side: str | None = None, fixed_size: tuple[int, int] | None = None
               ) -> dict:
    """The inputs of a batch, as transformers' processor returns them (return_tensors="np",
    padding=True).

    text: a string or a list (one per row), each image a <|image_pad|>; images:
    a flat list (in order over the rows) or one list per row. conversations:
    one conversation or a list of them (rendered with the checkpoint's
    template); their images come from the image items, or from `images` in
    their order when given. fixed_size (h, w): every image resized to exactly
    that (not transformers' behaviour: static shapes for training).
    """
    if (text is None) == (conversations is None):
      raise ValueError("pass exactly one of text= and conversations=.")
    if conversations is not None:
      if conversations and isinstance(conversations[0], dict):
        conversations = [conversations]
      rendered = [self.render(c, add_generation_prompt=add_generation_prompt,
                              add_vision_id=add_vision_id) for c in conversations]
      texts = [r.text for r in rendered]
      if images is None:
        images = [list(r.images) for r in rendered]
    else:
      texts = [text] if isinstance(text, str) else list(text)
      if not all(isinstance(t, str) for t in texts) or not texts:
        raise ValueError("text must be a string or a non-empty list of strings.")
    flat, per_text = flat_images(images, len(texts))
    flat = [load_image(x) if isinstance(x, (str, Path)) else x for x in flat]
    out = {}
    if flat:
      pixel_values, grids = preprocess_images(flat, self.image_config, fixed_size)
      texts = self.expand_image_tokens(texts, grids, per_text)
      out = {"pixel_values": pixel_values, "image_grid_thw": grids}
    else:
      self.expand_image_tokens(texts, np.zeros((0, 3), np.int64))   # no placeholder left over
    ids, mask = self.pad([self.encode(t)[0] for t in texts], padding_side)
    return {"input_ids": ids, "attention_mask": mask,
            "mm_token_type_ids": self.mm_token_type_ids(ids), **out}
