"""A checkpoint's chat template, rendered with jinja2 as transformers renders it.

    template = chat_template_from_source(source, name="chat_template.jinja",
                                         special_tokens={"eos_token": "<|im_end|>"})
    rendered = render(messages, template, add_generation_prompt=True)
    rendered.text              # "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>..."
    rendered.assistant_spans   # ((start, end), ...): the assistant turns in rendered.text
    rendered.images            # the conversation's images, in order

A checkpoint ships its chat template as Jinja (chat_template.jinja,
chat_template.json or tokenizer_config.json's "chat_template"); it is executed,
whatever it is, in the environment transformers' `apply_chat_template` builds
(transformers/utils/chat_template_utils.py): jinja2's immutable sandbox with
trim_blocks and lstrip_blocks, the loopcontrols extension and the
`{% generation %}` tag (its body rendered as it is), `raise_exception`,
`strftime_now`, a `tojson` filter that keeps non-ASCII text and HTML characters,
and transformers' `dict` and `namespace`. The template sees `messages` (copied
into plain data: keys whose value is None dropped, images as placeholder strings
such as "<Image>", reasoning under its aliases), `tools` and `documents` None,
`add_generation_prompt`, `add_vision_id`, the named special tokens of
tokenizer_config.json (bos_token, eos_token, ...) and any further template
variables given. tests/experiments/vlm/qwen3vl/ checks the text equals
transformers' `apply_chat_template(..., tokenize=False)`.

A message is {"role": str, "content": str | items | None, ...}: other keys, such
as tool_calls, are the template's to read; a system message comes first only
(Qwen3-VL's and most templates drop a later one silently). An item is {"type":
"text", "text": str} or {"type": "image", "image": x} (x: a PIL image, a uint8
array or a path; "path" is read when "image" is absent). Each image must come
out as one <|vision_start|><|image_pad|><|vision_end|>, in order (Qwen-VL
templates write them so): a template that drops an image (Qwen3-VL's in a system
or assistant turn) or writes images some other way is refused, as are videos.
A template that fails (its `raise_exception`, a Jinja error) is one ValueError
line naming the template's file.

An assistant turn's span is found by rendering the conversation's prefixes: it
starts where the text of the turns before it with the generation prompt ends
and ends where the text up to and including it ends, trailing whitespace left
out (with Qwen's templates: the content and its <|im_end|>, not the newline).
Templates that render a turn differently once later turns follow (reasoning
templates that drop earlier <think> blocks) have no such span: asking for
`assistant_spans` then is refused; the text is not.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from datetime import datetime

import numpy as np

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END
# The named special tokens transformers passes to a template (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
# Names a message's reasoning goes under; transformers fills each from the first present.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
JINJA_MIN = (3, 1, 6)   # transformers' floor: older jinja2 has known sandbox escapes


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A checkpoint's chat template: its Jinja text, the file it came from (named in errors)
  and the special tokens the template sees (bos_token, eos_token, ...)."""

  source: str
  name: str = "chat template"
  special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Rendered:
  """A rendered conversation: its text, the images in order and the assistant spans.

  assistant_spans[i] = (start, end) character offsets in `text` of the i-th
  assistant turn (with Qwen's templates its content and closing <|im_end|>: what
  a loss trains on); computed on first access.
  """

  text: str
  images: tuple
  _spans: object = dataclasses.field(repr=False, compare=False, default=None)

  @functools.cached_property
  def assistant_spans(self) -> tuple[tuple[int, int], ...]:
    return self._spans()


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split())


@functools.cache
def _environment():
  """transformers' chat-template environment (`_compile_jinja_template`)."""
  try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError:
    raise ValueError("chat templates are rendered with jinja2, which is not installed "
                     "(pip install 'jinja2>=3.1.6').") from None
  version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
  if version < JINJA_MIN:
    raise ValueError(f"jinja2 {jinja2.__version__} is installed; chat templates need "
                     ">= 3.1.6 (older versions have known sandbox escapes).")

  class Generation(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body (transformers marks it
    for assistant masks; the spans here come from prefix renders instead)."""

    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def strftime_now(format):
    return datetime.now().strftime(format)

  class TemplateDict:
    """`dict(...)` without the type itself (no attribute access to break out with)."""

    def __call__(self, *args, **kwargs):
      return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
      return dict.fromkeys(*args, **kwargs)

  class TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing underscore-prefixed attributes."""

    def __init__(*args, **kwargs):
      self, args = args[0], args[1:]
      attrs = dict(*args, **kwargs)
      for name in attrs:
        TemplateNamespace._check_name(name)
      jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
      TemplateNamespace._check_name(name)
      jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
      if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot store underscore-prefixed attributes ({name!r}) on a "
            "namespace.")

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  env.globals["dict"] = TemplateDict()
  env.globals["namespace"] = TemplateNamespace
  return env


@functools.lru_cache(maxsize=16)
def _compile(source: str):
  return _environment().from_string(source)


def _compiled(template: ChatTemplate):
  _environment()   # jinja2 there, and new enough (one line otherwise)
  import jinja2
  try:
    return _compile(template.source)
  except jinja2.TemplateSyntaxError as e:
    raise ValueError(f"{template.name}: not a valid Jinja template (line {e.lineno}: "
                     f"{_one_line(e.message or e)}).") from None


def chat_template_from_source(source: str, *, name: str = "chat template",
                              special_tokens: Mapping[str, str] | None = None) -> ChatTemplate:
  """The ChatTemplate of a checkpoint's Jinja text (compiled now: a syntax error is one
  ValueError line naming `name`, the file it came from)."""
  if not isinstance(source, str) or not source.strip():
    raise ValueError(f"{name}: the chat template is not a non-empty string.")
  template = ChatTemplate(source, name, dict(special_tokens or {}))
  _compiled(template)
  return template


# -- the messages the template sees -----------------------------------------------------


def _plain(value):
  """Plain JSON-like data (transformers' `_plain_template_data`): anything else, such as
  an image, becomes a placeholder string naming its type ("<Image>", "<ndarray>")."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  if isinstance(value, str):
    return str.__str__(value)
  if isinstance(value, int):
    return int.__int__(value)
  if isinstance(value, float):
    return float.__float__(value)
  if isinstance(value, Mapping):
    return {_plain(k): _plain(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_plain(v) for v in value]
  if isinstance(value, tuple):
    return tuple(_plain(v) for v in value)
  if isinstance(value, np.generic):
    return _plain(value.item())
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
  if callable(getattr(value, "model_dump", None)):
    return _plain(value.model_dump())
  return f"<{type(value).__name__}>"


def _template_messages(messages) -> list[dict]:
  """What transformers hands the template: None-valued keys dropped, plain data, the
  reasoning under each of its names."""
  out = []
  for message in messages:
    message = _plain({k: v for k, v in message.items() if v is not None})
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                     None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    out.append(message)
  return out


def _is_image(item: dict) -> bool:
  return item.get("type") == "image" or "image" in item


def _items(message: dict, index: int) -> list[dict]:
  content = message.get("content")
  if content is None:
    return []
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


def _images(messages) -> list:
  """The image items' images in conversation order (after checking every message: a system
  message past the first is refused, as Qwen3-VL's and most templates drop it silently)."""
  if not isinstance(messages, (list, tuple)) or not messages:
    raise ValueError("conversation: expected a non-empty list of messages.")
  images = []
  for i, message in enumerate(messages):
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
      role = message.get("role") if isinstance(message, dict) else message
      raise ValueError(f"message {i}: role {role!r} is not a string.")
    if message["role"] == "system" and i:   # templates drop it or render it apart
      raise ValueError(f"message {i}: a system message must be the first message.")
    images += [item.get("image", item.get("path")) for item in _items(message, i)
               if _is_image(item)]
  return images


# -- rendering ------------------------------------------------------------------------------


def _render_text(template: ChatTemplate, messages: list[dict], add_generation_prompt: bool,
                 variables: dict) -> str:
  """The template's text for plain `messages` (transformers' `render_jinja_template`)."""
  compiled = _compiled(template)
  import jinja2
  context = {"tools": None, "documents": None,
             **_plain({**template.special_tokens, **variables})}
  try:
    return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                           **context)
  except jinja2.TemplateError as e:
    if type(e) is jinja2.TemplateError:   # the template's raise_exception
      raise ValueError(f"{template.name}: the chat template refuses the conversation: "
                       f"{_one_line(e)}") from None
    raise ValueError(f"{template.name}: the chat template fails ({type(e).__name__}: "
                     f"{_one_line(e)}).") from None
  except Exception as e:   # Python errors inside the template (a str + int, a bad index)
    raise ValueError(f"{template.name}: the chat template fails ({type(e).__name__}: "
                     f"{_one_line(e)}).") from None


def _expanded(text: str, counts) -> tuple[str, object]:
  """(text with the k-th <|image_pad|> repeated counts[k] times, the offset map old -> new)."""
  pieces = text.split(IMAGE_PAD)
  ends, gained = [], [0]          # where each pad ends in `text`, characters added up to it
  out, at = [pieces[0]], len(pieces[0])
  for k, piece in enumerate(pieces[1:]):
    out += [IMAGE_PAD * counts[k], piece]
    at += len(IMAGE_PAD)
    ends.append(at)
    gained.append(gained[-1] + (counts[k] - 1) * len(IMAGE_PAD))
    at += len(piece)

  def shift(offset: int) -> int:
    n = int(np.searchsorted(ends, offset, side="right"))   # pads ending at or before offset
    return offset + gained[n]

  return "".join(out), shift


def _spans(template: ChatTemplate, plain: list[dict], text: str, variables: dict, shift):
  """The assistant turns' spans in `text` (the rendered conversation before any image
  expansion; `shift` maps its offsets to the expanded text), from its prefixes' texts."""
  spans = []
  for i, message in enumerate(plain):
    if message["role"] != "assistant":
      continue
    try:
      head = _render_text(template, plain[:i], True, variables)
    except ValueError as e:
      raise ValueError(f"assistant message {i}: the turns before it do not render on their "
                       f"own ({e})") from None
    upto = _render_text(template, plain[:i + 1], False, variables)
    if not (text.startswith(head) and text.startswith(upto) and len(upto) > len(head)):
      raise ValueError(f"{template.name}: assistant message {i} renders differently once "
                       "later turns follow, so its span in the text is not found.")
    spans.append((shift(len(head)), shift(max(len(head), len(upto.rstrip())))))
  return tuple(spans)


def render(messages, template: ChatTemplate, *, add_generation_prompt: bool = False,
           add_vision_id: bool = False, image_token_counts=None, **variables) -> Rendered:
  """`messages` rendered with the checkpoint's template, as transformers renders them.

  Each image comes out as <|vision_start|> <|image_pad|>·n <|vision_end|>, with
  n = image_token_counts[i] (1 when None: the text a processor then expands,
  as transformers' apply_chat_template leaves it). `variables`: further
  template variables, as apply_chat_template's keyword arguments (tools=[JSON
  schema, ...] and documents=[...] included; both None when not given).
  """
  if not isinstance(template, ChatTemplate):
    raise ValueError("render: no chat template given.")
  images = _images(messages)
  if image_token_counts is not None and len(image_token_counts) != len(images):
    raise ValueError(f"conversation has {len(images)} images but {len(image_token_counts)} "
                     "image token counts were given.")
  variables = {"add_vision_id": add_vision_id, **variables}
  plain = _template_messages(messages)
  text = _render_text(template, plain, add_generation_prompt, variables)
  n_pads, n_placeholders = text.count(IMAGE_PAD), text.count(IMAGE_PLACEHOLDER)
  if not n_pads == n_placeholders == len(images):
    raise ValueError(f"{template.name}: the conversation's {len(images)} images render as "
                     f"{n_pads} {IMAGE_PAD} in {n_placeholders} {IMAGE_PLACEHOLDER}; each "
                     "image must be one, where the template renders images (Qwen3-VL's: "
                     "user and tool turns).")
  raw, shift = text, (lambda offset: offset)
  if image_token_counts is not None:
    text, shift = _expanded(raw, [int(n) for n in image_token_counts])
  return Rendered(text, tuple(images), functools.partial(_spans, template, plain, raw,
                                                         variables, shift))
