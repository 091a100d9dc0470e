"""A synthetic Qwen3-VL processor directory for smoke runs and tests (no download).

    hf_dir = write_synthetic_processor_dir(tmp / "tiny")    # then Qwen3VLProcessor.from_dir(hf_dir)

It holds what a real checkpoint's processor reads: tokenizer.json (a
byte-level BPE in Qwen's layout: NFC, Qwen2's split regex, byte-level,
trained here on the emoji-scene texts, ~500 ids, followed by Qwen3-VL's
special tokens in Qwen's order), tokenizer_config.json (pad <|endoftext|>,
EOS <|im_end|>), the Qwen3-VL Instruct chat template (the checkpoint's own
file, qwen3_vl_chat_template.jinja beside this module) and preprocessor_config.json (Qwen3-VL's patch 16, merge 2,
temporal 2, mean = std = 0.5, with a pixel budget small enough for a CPU).
The same inputs give the same files, byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

BPE_VOCAB = 500
# Qwen3-VL's special tokens, in the order its tokenizer.json numbers them.
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
# Qwen2's pre-tokenizer split (tokenizer.json of every Qwen2 / Qwen3 checkpoint).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3-VL-8B-Instruct's chat template (chat_template.json of the checkpoint), verbatim, in
# the .jinja file beside this module (the wheel carries it): tests render it with
# transformers and compare with experiments/hf/qwen3vl/chat.py.
QWEN3_VL_CHAT_TEMPLATE = (Path(__file__).parent / "qwen3_vl_chat_template.jinja").read_text(
    encoding="utf-8")
# Small enough for CPU smoke runs: 4·4 to 16·16 merged windows of 32 px.
SMOKE_MIN_PIXELS = 128 * 128
SMOKE_MAX_PIXELS = 512 * 512


def _corpus() -> list[str]:
  """The texts the tiny BPE is trained on: the emoji scenes' words and chat markup."""
  from experiments.vlm.emoji import CAPTION_PROMPT, CLASS_NAMES, SceneConfig, make_split, question
  from experiments.vlm.emoji.emoji_scenes import FILLERS, caption, question_target
  scenes = make_split(SceneConfig(), "train", 64, seed=0)
  texts = [CAPTION_PROMPT, " ".join(CLASS_NAMES), *FILLERS, "user assistant system\n"]
  texts += [question(s) + " " + question_target(s) + " " + caption(s, 1) for s in scenes]
  return texts


def scene_tokenizer():
  """A `tokenizers.Tokenizer` in Qwen's layout with Qwen3-VL's special tokens."""
  from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
  )
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_corpus(), trainer)
  tok.add_special_tokens(list(SPECIAL_TOKENS))
  return tok


def write_synthetic_processor_dir(out_dir, *, min_pixels: int = SMOKE_MIN_PIXELS,
                             max_pixels: int = SMOKE_MAX_PIXELS) -> Path:
  """Write the four processor files into `out_dir` (created); returns it."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  scene_tokenizer().save(str(out / "tokenizer.json"))
  (out / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>",
      "pad_token": "<|endoftext|>", "model_max_length": 262144, "errors": "replace",
      "split_special_tokens": False, "add_prefix_space": False,
      "clean_up_tokenization_spaces": False, "processor_class": "Qwen3VLProcessor"},
      indent=2) + "\n")
  (out / "chat_template.jinja").write_text(QWEN3_VL_CHAT_TEMPLATE)
  (out / "preprocessor_config.json").write_text(json.dumps({
      "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
      "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
      "processor_class": "Qwen3VLProcessor",
      "image_processor_type": "Qwen2VLImageProcessorFast"}, indent=2) + "\n")
  return out
