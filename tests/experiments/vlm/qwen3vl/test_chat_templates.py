"""Chat templates other than Qwen3-VL's own, rendered with jinja2 == transformers' text.

Each template here was refused or misread by the former recognise-by-regex path:
a Llama-3-style template (no chat-ML), a Qwen3-VL template with a default system
turn set in a variable. Both run from a checkpoint directory (the tiny one of
experiments/hf/qwen3vl/synthetic_processor.py with the template swapped in) and are
compared with transformers' `apply_chat_template(..., tokenize=False)` on the
tokenizer transformers loads from the same directory.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from experiments.hf.qwen3vl import chat
from experiments.hf.qwen3vl.processor import Qwen3VLProcessor
from experiments.hf.qwen3vl.synthetic_processor import (
  QWEN3_VL_CHAT_TEMPLATE,
  write_synthetic_processor_dir,
)

# Llama-3.1-Instruct's layout: BOS, a system turn (a default one when the conversation has
# none) dated by `date_string` or strftime_now, roles that must alternate, content trimmed.
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "You are a helpful assistant." %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{{- 'Today Date: ' + date_string + '\\n\\n' + system_message + '<|eot_id|>' }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...\\n'
                            + '(message ' + loop.index0 | string + ' is ' + message['role'] + ')') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
    {%- else %}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
# Qwen3-VL's own template with a default system turn kept in a variable (Qwen2-VL writes
# its default inline; the regex path read only that spelling and rendered none here).
_QWEN3_SYSTEM_END = """        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count"""
QWEN3_DEFAULT_SYSTEM_TEMPLATE = (
    '{%- set default_system = "You count objects. Answer with a number." %}\n'
    + QWEN3_VL_CHAT_TEMPLATE.replace(_QWEN3_SYSTEM_END, """        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count""", 1))
BOS = "<|begin_of_text|>"

TEXT_CONVERSATIONS = [
    [{"role": "system", "content": "  Be brief. "},
     {"role": "user", "content": "How many cats?"},
     {"role": "assistant", "content": "Three. "},
     {"role": "user", "content": "And dogs?"}],
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello, how can I help?"}],
]


def _checkpoint(root, template: str, *, where: str = "chat_template.jinja", **config):
  """A copy of the tiny processor directory with `template` as its chat template."""
  tiny = root / "tiny"
  if not tiny.is_dir():
    write_synthetic_processor_dir(tiny)
  out = root / f"ckpt{len(list(root.iterdir()))}"
  shutil.copytree(tiny, out)
  (out / "chat_template.jinja").unlink()
  tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
  tokenizer_config.update(config)
  if where == "chat_template.jinja":
    (out / where).write_text(template)
  else:
    tokenizer_config["chat_template"] = template
  (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
  return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return tmp_path_factory.mktemp("templates")


def _hf_tokenizer(path):
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def llama(root):
  """(ours, transformers' tokenizer) of a checkpoint with the Llama-3-style template."""
  path = _checkpoint(root, LLAMA3_TEMPLATE, bos_token=BOS)
  return Qwen3VLProcessor.from_dir(path), _hf_tokenizer(path), path


def test_the_regex_path_refused_these_templates():
  assert chat.IM_START not in LLAMA3_TEMPLATE and chat.IMAGE_PLACEHOLDER not in LLAMA3_TEMPLATE
  assert QWEN3_DEFAULT_SYSTEM_TEMPLATE.count("default_system") == 2   # the edit took


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_llama3_style_template_equals_transformers(llama, add_generation_prompt):
  ours, hf, _ = llama
  for conversation in TEXT_CONVERSATIONS:
    want = hf.apply_chat_template(conversation, tokenize=False, date_string="26 Jul 2024",
                                  add_generation_prompt=add_generation_prompt)
    got = ours.render(conversation, date_string="26 Jul 2024",
                      add_generation_prompt=add_generation_prompt)
    assert got.text == want
    assert want.startswith(BOS + "<|start_header_id|>system<|end_header_id|>\n\nToday Date: 26")
    assert want.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n") == (
        add_generation_prompt)
    # The assistant spans: the trimmed content and its <|eot_id|>.
    answers = [m["content"].strip() + "<|eot_id|>" for m in conversation
               if m["role"] == "assistant"]
    assert [got.text[a:b] for a, b in got.assistant_spans] == answers


def test_strftime_now_dates_the_default(llama):
  ours, hf, _ = llama
  conversation = TEXT_CONVERSATIONS[1]
  before = ours.render(conversation).text
  want = hf.apply_chat_template(conversation, tokenize=False)
  after = ours.render(conversation).text
  assert want in (before, after)          # one of them, should the date turn in between
  assert "Today Date: " in want and "date_string" not in want


@pytest.mark.parametrize("flags", [dict(), dict(add_generation_prompt=True),
                                   dict(add_generation_prompt=True, add_vision_id=True)])
def test_qwen_template_with_a_default_system_and_images_equals_transformers(root, flags):
  path = _checkpoint(root, QWEN3_DEFAULT_SYSTEM_TEMPLATE)
  ours, hf = Qwen3VLProcessor.from_dir(path), _hf_tokenizer(path)
  rng = np.random.default_rng(0)
  image = Image.fromarray(rng.integers(0, 256, (64, 48, 3), np.uint8))
  array = rng.integers(0, 256, (40, 40, 3), np.uint8)
  conversations = [
      [{"role": "user", "content": [{"type": "image", "image": image},
                                    {"type": "text", "text": "How many? ünïcode"}]},
       {"role": "assistant", "content": [{"type": "text", "text": "2"}]},
       {"role": "user", "content": [{"type": "text", "text": "And here "},
                                    {"type": "image", "image": array}]}],
      [{"role": "system", "content": "Own system."},
       {"role": "user", "content": [{"type": "image", "image": image}]}],
  ]
  for conversation in conversations:
    want = hf.apply_chat_template(conversation, tokenize=False, **flags)
    got = ours.render(conversation, **flags)
    assert got.text == want
    n_images = sum(isinstance(m["content"], list) and item["type"] == "image"
                   for m in conversation for item in m["content"])
    assert want.count(chat.IMAGE_PLACEHOLDER) == len(got.images) == n_images
  assert "You count objects." in ours.render(conversations[0]).text
  assert "You count objects." not in ours.render(conversations[1]).text
  # Expanded images: the text around them and the assistant spans move with them.
  rendered = ours.render(conversations[0], image_token_counts=[3, 2])
  assert rendered.text.count(chat.IMAGE_PAD) == 5
  assert [rendered.text[a:b] for a, b in rendered.assistant_spans] == ["2<|im_end|>"]
  # And the model inputs of a conversation (the tensors are test_processor.py's).
  inputs = ours(conversations=conversations[0], add_generation_prompt=True)
  assert inputs["image_grid_thw"].shape == (2, 3)


def _error(fn) -> str:
  with pytest.raises(ValueError) as info:
    fn()
  message = str(info.value)
  assert "\n" not in message, message
  return message


def test_raise_exception_is_one_line_naming_the_file(llama):
  ours, hf, path = llama
  repeated = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
  message = _error(lambda: ours.render(repeated))
  assert message == (f"{path / 'chat_template.jinja'}: the chat template refuses the "
                     "conversation: Conversation roles must alternate user/assistant/user/"
                     "assistant/... (message 1 is user)")
  import jinja2
  with pytest.raises(jinja2.TemplateError, match="Conversation roles must alternate"):
    hf.apply_chat_template(repeated, tokenize=False)
  # The same through the processor's call, and with the template in tokenizer_config.json.
  assert "refuses the conversation" in _error(lambda: ours(conversations=repeated))
  in_config = _checkpoint(path.parent, LLAMA3_TEMPLATE, where="tokenizer_config.json",
                          bos_token=BOS)
  message = _error(lambda: Qwen3VLProcessor.from_dir(in_config).render(repeated))
  assert message.startswith(f"{in_config / 'tokenizer_config.json'} (chat_template): ")


def test_broken_and_missing_templates_are_one_line(root):
  unclosed = _checkpoint(root, "{% for message in messages %}\n{{ message.content }}\n")
  message = _error(lambda: Qwen3VLProcessor.from_dir(unclosed))
  assert message.startswith(f"{unclosed / 'chat_template.jinja'}: not a valid Jinja template "
                            "(line 2: Unexpected end of template.")
  failing = _checkpoint(root, "{{ messages[0].content + 1 }}")
  message = _error(lambda: Qwen3VLProcessor.from_dir(failing).render(TEXT_CONVERSATIONS[1]))
  assert message == (f"{failing / 'chat_template.jinja'}: the chat template fails (TypeError: "
                     'can only concatenate str (not "int") to str).')
  missing = _checkpoint(root, "unused")
  (missing / "chat_template.jinja").unlink()
  processor = Qwen3VLProcessor.from_dir(missing)
  assert processor.template is None
  assert "no chat template" in _error(lambda: processor.render(TEXT_CONVERSATIONS[1]))


def test_images_the_template_drops_are_refused(root):
  ours = Qwen3VLProcessor.from_dir(_checkpoint(root, QWEN3_VL_CHAT_TEMPLATE))
  image = np.zeros((32, 32, 3), np.uint8)
  in_reply = [{"role": "user", "content": "Draw."},
              {"role": "assistant", "content": [{"type": "image", "image": image}]}]
  assert "1 images render as 0 <|image_pad|>" in _error(lambda: ours.render(in_reply))
  video = [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}]
  assert "videos are not supported" in _error(lambda: ours.render(video))
  late_system = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
  assert "must be the first message" in _error(lambda: ours.render(late_system))


def test_tools_render_through_tojson_as_transformers(root):
  """Qwen3-VL's tools branch: `tojson` keeps non-ASCII and HTML characters as they are."""
  path = _checkpoint(root, QWEN3_VL_CHAT_TEMPLATE)
  ours, hf = Qwen3VLProcessor.from_dir(path), _hf_tokenizer(path)
  tools = [{"type": "function", "function": {
      "name": "count", "description": "Zählt <Objekte> & \"Dinge\"",
      "parameters": {"type": "object", "properties": {"kind": {"type": "string"}}}}}]
  conversation = [{"role": "system", "content": "Sys."}, {"role": "user", "content": "Count."},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"function": {"name": "count", "arguments": {"kind": "Käfer"}}}]},
                  {"role": "tool", "content": "3"}]
  want = hf.apply_chat_template(conversation, tools=tools, tokenize=False,
                                add_generation_prompt=True)
  assert ours.render(conversation, tools=tools, add_generation_prompt=True).text == want
  assert 'Zählt <Objekte> & \\"Dinge\\"' in want and '"Käfer"' in want
