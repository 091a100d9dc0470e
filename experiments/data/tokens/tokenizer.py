"""Tokenizers of token data: "bytes", a `tokenizer.json`, and training a byte-level BPE.

A tokenizer is named by a spec: "bytes" (ids are the UTF-8 bytes, vocabulary
256, no EOS: the byte-level stack's own tokens), a `tokenizer.json` file, or a
directory holding one (a model checkpoint). Its digest is the sha256 of its
JSON with sorted keys, so a re-serialised file keeps its digest.

EOS/BOS convention of token data: each document is its tokens without the
tokenizer's own special tokens (`add_special_tokens=False`), followed by the
EOS token when the tokenizer has one (the first of `EOS_NAMES` in its
vocabulary); no BOS. Segment ids, not EOS, keep documents apart in a row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from experiments.data.tokens.format import TokenDataError

BYTES = "bytes"
FILE = "tokenizer.json"
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
VOCAB_SIZES = (4096, 8192)


@dataclasses.dataclass(frozen=True)
class TokenizerInfo:
  """What token data records about its tokenizer."""

  kind: str            # "bytes" or "tokenizers"
  path: str            # the tokenizer.json, "" for bytes
  sha256: str
  vocab_size: int
  eos_id: int | None
  eos_token: str | None

  def to_json(self) -> dict:
    return {"kind": self.kind, "sha256": self.sha256, "vocab_size": self.vocab_size,
            "eos": None if self.eos_id is None else {"id": self.eos_id,
                                                      "token": self.eos_token},
            "bos": None}


def tokenizer_file(spec: str) -> Path:
  """The tokenizer.json a spec names (a file, or a directory holding one)."""
  path = Path(spec).expanduser()
  if path.is_dir():
    path = path / FILE
  if not path.is_file():
    raise TokenDataError(f"--tokenizer={spec!r}: no {FILE} there; pass a {FILE}, a "
                         f"directory holding one, or {BYTES!r}.")
  return path


def _load(path: Path):
  from tokenizers import Tokenizer

  try:
    return Tokenizer.from_file(str(path))
  except Exception as e:  # tokenizers raises a bare Exception on a bad file
    raise TokenDataError(f"{path}: not a tokenizers JSON file ({str(e).splitlines()[0]}).") \
        from None


def describe(spec: str) -> TokenizerInfo:
  """The digest, vocabulary size and EOS of the tokenizer `spec` names."""
  if spec == BYTES:
    return TokenizerInfo(BYTES, "", BYTES, 256, None, None)
  path = tokenizer_file(spec)
  try:
    canonical = json.dumps(json.loads(path.read_text()), sort_keys=True, separators=(",", ":"))
  except ValueError as e:
    raise TokenDataError(f"{path}: not valid JSON ({e}).") from None
  tok = _load(path)
  vocab = tok.get_vocab(with_added_tokens=True)
  vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
  eos = next((name for name in EOS_NAMES if name in vocab), None)
  return TokenizerInfo("tokenizers", str(path.resolve()),
                       hashlib.sha256(canonical.encode()).hexdigest(), vocab_size,
                       None if eos is None else vocab[eos], eos)


class Encoder:
  """Documents (UTF-8 bytes) -> token id arrays, EOS appended per the convention."""

  def __init__(self, info: TokenizerInfo):
    self.info = info
    self._tok = None if info.kind == BYTES else _load(Path(info.path))

  def encode(self, docs: list[bytes]) -> list[np.ndarray]:
    if self._tok is None:
      return [np.frombuffer(d, np.uint8).astype(np.uint32) for d in docs]
    texts = [d.decode("utf-8") for d in docs]
    tail = [] if self.info.eos_id is None else [self.info.eos_id]
    # encode_batch_fast: the same ids without character offsets, which we never read.
    encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
    return [np.asarray(e.ids + tail, np.uint32)
            for e in encode(texts, add_special_tokens=False)]


def train_tokenizer(texts: Iterable[str], out: str, *, vocab_size: int = 4096) -> Path:
  """Trains a byte-level BPE of `vocab_size` ids (EOS "<|endoftext|>" is id 0) on
  `texts` and saves it as `out` (a `.json` file, else `out/tokenizer.json`).

  Deterministic: the same texts in the same order give the same file.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  if not 256 + 1 < vocab_size <= 2**20:
    raise TokenDataError(f"--vocab_size={vocab_size} must be in (257, 1048576]: 256 byte "
                         "ids and the EOS come first.")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_NAMES[0]],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  seen = _Counting(texts)
  tok.train_from_iterator(seen, trainer=trainer)
  if not seen.count:
    raise TokenDataError("train-tokenizer: the input holds no text.")
  path = Path(out).expanduser()
  if path.suffix != ".json":
    path = path / FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tok.save(str(tmp))
  os.replace(tmp, path)
  return path


class _Counting:
  """An iterable that counts the non-empty texts it hands out."""

  def __init__(self, texts: Iterable[str]):
    self.texts, self.count = texts, 0

  def __iter__(self) -> Iterator[str]:
    for text in self.texts:
      if text:
        self.count += 1
        yield text


class Codec:
  """Text <-> token ids with a run's tokenizer.json, for sampling a token-data run."""

  unit = "tokens"

  def __init__(self, spec: str):
    self._tok = _load(tokenizer_file(spec))

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

  def decode(self, ids) -> str:
    return self._tok.decode([int(i) for i in np.asarray(ids).tolist()],
                            skip_special_tokens=False)
