"""Qwen3VLProcessor == transformers' Qwen3VLProcessor (PIL image processor) on the same inputs.

The checkpoint directory is the tiny one of experiments/hf/qwen3vl/synthetic_processor.py
(Qwen's tokenizer layout and special tokens, Qwen3-VL's chat template and
preprocessor fields, a CPU-sized pixel budget). transformers builds its
processor from the same files; its video processor needs torchvision, which
the test does not need, so it is left out (no video input is used).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from PIL import Image

from experiments.hf.qwen3vl import chat
from experiments.hf.qwen3vl.processor import Qwen3VLProcessor
from experiments.hf.qwen3vl.synthetic_processor import (
  QWEN3_VL_CHAT_TEMPLATE,
  SMOKE_MAX_PIXELS,
  SMOKE_MIN_PIXELS,
  write_synthetic_processor_dir,
)
from experiments.vlm.qwen3vl.image import ImageConfig, smart_resize

PLACEHOLDER = chat.IMAGE_PLACEHOLDER
# Qwen2-VL-Instruct's chat template (tokenizer_config.json): a default system turn.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  return write_synthetic_processor_dir(tmp_path_factory.mktemp("qwen3vl_processor"))


@pytest.fixture(scope="module")
def processors(tiny_dir):
  """(ours, transformers') for the tiny directory."""
  transformers = pytest.importorskip("transformers")
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
      Qwen2VLImageProcessorPil,
  )
  from transformers.models.qwen3_vl import Qwen3VLProcessor as HFProcessor

  class WithoutVideo(HFProcessor):
    def check_argument_for_proper_class(self, name, arg):
      if name == "video_processor" and arg is None:
        return None
      return super().check_argument_for_proper_class(name, arg)

  hf = WithoutVideo(image_processor=Qwen2VLImageProcessorPil.from_pretrained(tiny_dir),
                    tokenizer=transformers.AutoTokenizer.from_pretrained(tiny_dir),
                    video_processor=None,
                    chat_template=(tiny_dir / "chat_template.jinja").read_text())
  return Qwen3VLProcessor.from_dir(tiny_dir), hf


@pytest.fixture(scope="module")
def images():
  """Past the pixel budget (resized down), tiny RGBA (up to min_pixels), plain, wide array."""
  rng = np.random.default_rng(0)
  big = Image.fromarray(rng.integers(0, 256, (900, 700, 3), np.uint8))
  tiny = Image.fromarray(rng.integers(0, 256, (20, 30, 4), np.uint8), "RGBA")
  plain = Image.fromarray(rng.integers(0, 256, (200, 330, 3), np.uint8))
  wide = rng.integers(0, 256, (40, 600, 4), np.uint8)     # an RGBA array, not a PIL image
  return big, tiny, plain, wide


def test_the_template_is_the_checkpoints_file():
  # Qwen3-VL-8B-Instruct's chat template, 5292 bytes.
  digest = hashlib.sha256(QWEN3_VL_CHAT_TEMPLATE.encode()).hexdigest()
  assert digest == "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"


def test_the_tiny_dir_is_the_same_every_time(tiny_dir, tmp_path):
  again = write_synthetic_processor_dir(tmp_path / "again")
  names = sorted(p.name for p in tiny_dir.iterdir())
  assert names == ["chat_template.jinja", "preprocessor_config.json", "tokenizer.json",
                   "tokenizer_config.json"]
  assert all((again / n).read_bytes() == (tiny_dir / n).read_bytes() for n in names)


def test_smart_resize_keeps_the_budget(images):
  config = ImageConfig(patch_size=16, min_pixels=SMOKE_MIN_PIXELS, max_pixels=SMOKE_MAX_PIXELS)
  sizes = [smart_resize(*np.asarray(im).shape[:2], config.factor, config.min_pixels,
                        config.max_pixels) for im in images]
  for h, w in sizes:
    assert h % 32 == 0 and w % 32 == 0
    assert SMOKE_MIN_PIXELS <= h * w <= SMOKE_MAX_PIXELS
  assert 900 * 700 > SMOKE_MAX_PIXELS and sizes[0] == (576, 448)     # scaled down, floored
  assert 20 * 30 < SMOKE_MIN_PIXELS and sizes[1] == (128, 160)       # scaled up, ceiled
  assert sizes[2] == (192, 320)                                     # rounded only


def test_tensors_equal_transformers(processors, images):
  ours, hf = processors
  big, tiny, plain, wide = images
  texts = [f"{PLACEHOLDER}Describe {PLACEHOLDER} both.", f"How many? {PLACEHOLDER}",
           f"Wide:{PLACEHOLDER}"]
  want = hf(text=texts, images=[big, tiny, plain, wide], padding=True, return_tensors="np")
  got = ours(text=texts, images=[[big, tiny], [plain], [wide]])
  assert set(got) == set(want)
  for key in want:
    assert got[key].shape == want[key].shape, key
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  assert got["pixel_values"].dtype == np.float32
  grids = got["image_grid_thw"]
  n_pads = (got["input_ids"] == ours.image_token_id).sum(axis=1)
  assert n_pads.tolist() == [grids[:2].prod(1).sum() // 4, grids[2].prod() // 4,
                             grids[3].prod() // 4]
  # Left padding (generation batches) as the tokenizer pads.
  want = hf(text=texts, images=[big, tiny, plain, wide], padding=True, padding_side="left",
            return_tensors="np")
  got = ours(text=texts, images=[big, tiny, plain, wide], padding_side="left")
  for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  assert got["attention_mask"][:, -1].all() and got["attention_mask"][:, 0].min() == 0


CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "image", "image": 0},
                                  {"type": "text", "text": "What is it?"}]},
     {"role": "assistant", "content": "A cat."},
     {"role": "user", "content": [{"type": "text", "text": "And this\n"},
                                  {"type": "image", "image": 2},
                                  {"type": "image", "image": 1}]}],
    [{"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]}],
    [{"role": "system", "content": [{"type": "text", "text": "Sys "}]},
     {"role": "user", "content": [{"type": "image", "image": 3}]}],
]


def _with_images(images):
  return [[dict(m, content=[dict(i, image=images[i["image"]]) if i.get("type") == "image"
                            else i for i in m["content"]]) if isinstance(m["content"], list)
           else m for m in conv] for conv in CONVERSATIONS]


@pytest.mark.parametrize("flags", [dict(), dict(add_generation_prompt=True),
                                   dict(add_generation_prompt=True, add_vision_id=True)])
def test_chat_rendering_equals_transformers(processors, images, flags):
  ours, hf = processors
  conversations = _with_images(images)
  want = hf.apply_chat_template(conversations, tokenize=False, **flags)
  assert [ours.render(c, **flags).text for c in conversations] == want


def test_conversation_inputs_equal_transformers(processors, images):
  ours, hf = processors
  conversations = _with_images(images)
  want = hf.apply_chat_template(conversations, tokenize=True, return_dict=True,
                                add_generation_prompt=True,
                                processor_kwargs=dict(return_tensors="np", padding=True))
  got = ours(conversations=conversations, add_generation_prompt=True)
  assert set(got) == set(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_default_system_template_equals_transformers(processors):
  ours, hf = processors
  template = chat.chat_template_from_source(QWEN2_VL_CHAT_TEMPLATE)
  conversation = [{"role": "user", "content": [{"type": "image", "image": None},
                                               {"type": "text", "text": "Hi"}]},
                  {"role": "assistant", "content": "Yes."}]
  want = hf.tokenizer.apply_chat_template(conversation, chat_template=QWEN2_VL_CHAT_TEMPLATE,
                                          tokenize=False, add_generation_prompt=True)
  assert chat.render(conversation, template, add_generation_prompt=True).text == want
  assert want.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
  # With a system turn first, no default one.
  with_system = [{"role": "system", "content": "S."}, *conversation]
  want = hf.tokenizer.apply_chat_template(with_system, chat_template=QWEN2_VL_CHAT_TEMPLATE,
                                          tokenize=False)
  assert chat.render(with_system, template).text == want
