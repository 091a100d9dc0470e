"""Tokenizers of token data: "bytes", a `tokenizer.json`, and training a byte-level BPE.

A tokenizer is named by a spec: "bytes" (ids are the UTF-8 bytes, vocabulary
256, no EOS: the byte-level stack's own tokens), a `tokenizer.json` file, a
directory holding one (a model checkpoint), or a Hugging Face hub id
(`Qwen/Qwen3-0.6B[@revision]`: its tokenizer files, fetched into the hub's
cache or found there). Its digest is the sha256 of its
JSON with sorted keys, so a re-serialised file keeps its digest.

EOS/BOS convention of token data: each document is its tokens without the
tokenizer's own special tokens (`add_special_tokens=False`), followed by the
EOS token when the tokenizer has one (the first of `EOS_NAMES` in its
vocabulary); no BOS. Segment ids, not EOS, keep documents apart in a row.

Long documents are encoded in pieces (`Encoder.encode`): one call on a 100 MB
document holds ~200 bytes per token inside the tokenizers package (20 GB), so a
document over `PIECE_CHARS` characters is cut about every `PIECE_CHARS`, each piece
encoded alone and the ids concatenated. A cut falls just after a newline between
two non-whitespace characters (a line boundary), or, in a line longer than a
piece, just before a single space between two non-whitespace characters. A regex
pre-tokenizer (byte-level BPE: GPT-2, Llama 3, Qwen, what `train_tokenizer`
writes) ends a word at both places and starts the next one there whatever
follows, so the ids equal one call's. Each kind of cut is used only if, on a
probe text, it keeps the tokenizer's words and ids (one that prepends "▁" to each
text is not cut at newlines); a tokenizer without a pre-tokenizer (BPE merges
across spaces) or that keeps neither encodes each document in one call. A stretch
of `FORCE_AFTER` pieces without whitespace is cut inside a word (prepare-data
warns: the ids there may differ from one call's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from experiments.data.tokens.format import TokenDataError, tmp_path
from experiments.trainer import durable

log = logging.getLogger("experiments")

BYTES = "bytes"
FILE = "tokenizer.json"
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
VOCAB_SIZES = (4096, 8192)
PIECE_CHARS = 1 << 20   # a longer document is encoded in pieces of about this many characters
FORCE_AFTER = 4   # pieces without whitespace before a cut inside a word (cut_points)
SEPS = ("\n", " ")   # cut after a newline, before a space: in this order of preference
# Lines, blank lines, indents, tabs, punctuation, digits and non-ASCII next to its cuts:
# a kind of cut that changes this text's words or ids is not used for the tokenizer.
_PROBE = ("The first line, alpha.\nbeta gamma 12 delta\nx = y + 1;\n  indented\tline\n\n"
          "Next paragraph: naïve δ-λ 日本.\n'quoted' it's 'n' 3.5 -- ok?!\nfoo\r\nbar "
          "\u00a0nbsp\u3000wide <|endoftext|>\nlast")


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
  """The tokenizer.json a spec names (a file, a directory holding one, or a Hugging Face
  hub id `org/name[@revision]`, whose tokenizer files alone are fetched into the hub's
  cache or found there: experiments/hf/hub.py)."""
  path = Path(spec).expanduser()
  if not path.exists() and not spec.endswith(".json") and _is_hub_id(spec):
    from experiments.hf.hub import resolve_checkpoint
    path = resolve_checkpoint(spec, what="tokenizer")
  if path.is_dir():
    path = path / FILE
  if not path.is_file():
    raise TokenDataError(f"--tokenizer={spec!r}: no {FILE} there; pass a {FILE}, a "
                         f"directory holding one, a Hugging Face hub id (org/name) or "
                         f"{BYTES!r}.")
  return path


def _is_hub_id(spec: str) -> bool:
  """Whether `spec` may be a hub id, org/name[@revision] (a loose check without importing
  experiments.hf, which loads jax; experiments/hf/hub.py checks the hub's rules)."""
  return re.fullmatch(r"[\w.\-]+/[\w.\-]+(@\S+)?", spec, re.ASCII) is not None


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


def _cuttable_at(text: str, i: int) -> bool:
  """Whether text[i] (a newline or a space) sits between two non-whitespace characters."""
  return 0 < i < len(text) - 1 and not text[i - 1].isspace() and not text[i + 1].isspace()


def _first_cut(text: str, lo: int, hi: int, seps: tuple[str, ...]) -> int | None:
  """The first cut in [lo, hi): after a newline, else before a space (module docstring)."""
  for sep in seps:
    i = text.find(sep, lo, hi)
    while i != -1 and not _cuttable_at(text, i):
      i = text.find(sep, i + 1, hi)
    if i != -1:
      return i + (sep == "\n")
  return None


def is_word_boundary(text: str, cut: int, seps: tuple[str, ...] = SEPS) -> bool:
  """Whether `cut` is one of the places the module docstring names (not a forced cut)."""
  return ("\n" in seps and text[cut - 1] == "\n" and _cuttable_at(text, cut - 1)) or (
      " " in seps and cut < len(text) and text[cut] == " " and _cuttable_at(text, cut))


def cut_points(text: str, every: int, seps: tuple[str, ...] = SEPS) -> list[int]:
  """Where a long text is cut into pieces of about `every` characters: a line boundary
  in the window [every, 2 * every) past the last cut when it holds one, else a space
  there, else the first of either up to `FORCE_AFTER` pieces past it. With none there
  (no whitespace in a stretch that long), a forced cut right at `every`, inside a word:
  memory stays bounded, but the ids there may differ from one call's."""
  cuts, start = [], 0
  while len(text) - start > every:
    lo = start + every
    cut = _first_cut(text, lo, min(lo + every, len(text)), seps)
    if cut is None:
      cut = _first_cut(text, lo, min(start + FORCE_AFTER * every, len(text)), seps)
    if cut is None:
      if len(text) - start <= FORCE_AFTER * every:
        break   # the rest is one piece of bounded size
      cut = lo
    cuts.append(cut)
    start = cut
  return cuts


def _every_cut(text: str, sep: str) -> list[int]:
  """All the places `cut_points` may cut `text` at `sep` (the probe cuts at each)."""
  return [i + (c == "\n") for i, c in enumerate(text) if c == sep and _cuttable_at(text, i)]


def pieces(text: str, cuts: list[int]) -> Iterator[str]:
  """The pieces of `text` between `cuts`, made one at a time."""
  bounds = [0, *cuts, len(text)]
  for a, b in zip(bounds[:-1], bounds[1:], strict=True):
    yield text[a:b]


class Encoder:
  """Documents (UTF-8 bytes) -> token id arrays, EOS appended per the convention;
  long documents in pieces (module docstring)."""

  def __init__(self, info: TokenizerInfo, *, piece_chars: int | None = None):
    self.info, self.piece_chars = info, piece_chars or PIECE_CHARS
    self._tok = None if info.kind == BYTES else _load(Path(info.path))
    # encode_batch_fast: the same ids without character offsets, which we never read.
    self._batch = None if self._tok is None else getattr(
        self._tok, "encode_batch_fast", self._tok.encode_batch)
    self.seps = self._safe_seps()
    self.forced_cuts = 0   # cuts inside a word so far (cut_points), for a warning

  def _safe_seps(self) -> tuple[str, ...]:
    """The kinds of cut that keep this tokenizer's ids (module docstring): on _PROBE cut
    at each place of that kind, its pre-tokenizer gives the same words and the pieces
    the same ids. No pre-tokenizer (BPE over the whole text, merges across spaces
    and newlines): none."""
    if self._tok is None or self._tok.pre_tokenizer is None:
      return ()
    whole_words, whole_ids = self._words(_PROBE), self._ids([_PROBE])[0]
    keep = []
    for sep in SEPS:
      cuts = _every_cut(_PROBE, sep)
      words = [w for piece in pieces(_PROBE, cuts) for w in self._words(piece)]
      if words == whole_words and np.array_equal(self._ids_of_pieces(_PROBE, cuts), whole_ids):
        keep.append(sep)
    return tuple(keep)

  def _words(self, text: str) -> list[str]:
    """The words BPE sees in `text` (normalized, pre-tokenized), each encoded alone."""
    if self._tok.normalizer is not None:
      text = self._tok.normalizer.normalize_str(text)
    return [word for word, _ in self._tok.pre_tokenizer.pre_tokenize_str(text)]

  @property
  def cuttable(self) -> bool:
    return bool(self.seps)

  def _ids(self, texts: list[str]) -> list[np.ndarray]:
    return [np.asarray(e.ids, np.uint32) for e in self._batch(texts, add_special_tokens=False)]

  def _ids_of_pieces(self, text: str, cuts: list[int]) -> np.ndarray:
    # One piece at a time: the tokenizer holds one piece's words, not the document's.
    return np.concatenate([self._ids([piece])[0] for piece in pieces(text, cuts)])

  def encode(self, docs: list[bytes]) -> list[np.ndarray]:
    if self._tok is None:
      return [np.frombuffer(d, np.uint8).astype(np.uint32) for d in docs]
    tail = np.asarray([] if self.info.eos_id is None else [self.info.eos_id], np.uint32)
    texts = [d.decode("utf-8") for d in docs]
    long = {i for i, t in enumerate(texts) if self.cuttable and len(t) > self.piece_chars}
    short = [i for i in range(len(texts)) if i not in long]
    ids = dict(zip(short, self._ids([texts[i] for i in short]), strict=True))
    for i in long:
      cuts = cut_points(texts[i], self.piece_chars, self.seps)
      self.forced_cuts += sum(not is_word_boundary(texts[i], c, self.seps) for c in cuts)
      ids[i] = self._ids_of_pieces(texts[i], cuts)
    return [np.concatenate([ids[i], tail]) for i in range(len(texts))]


def output_file(out: str) -> Path:
  """Where `train_tokenizer` saves: `out` if it is a `.json` file, else `out/tokenizer.json`."""
  path = Path(out).expanduser()
  return path if path.suffix == ".json" else path / FILE


def canonical_sha256(path: Path) -> str | None:
  """The digest of a JSON file with sorted keys (None: not JSON), as `describe` takes it."""
  try:
    value = json.loads(Path(path).read_text())
  except (OSError, ValueError):
    return None
  return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"))
                        .encode()).hexdigest()


def train_tokenizer(texts: Iterable[str], out: str, *, vocab_size: int = 4096) -> Path:
  """Trains a byte-level BPE of at most `vocab_size` ids (EOS "<|endoftext|>" is id 0)
  on `texts` and saves it as `out` (a `.json` file, else `out/tokenizer.json`).

  Deterministic: the same texts in the same order give the same file. An existing
  file there is replaced only by the same tokenizer (a rerun): a different one (a
  model checkpoint's own tokenizer.json, or the one data was prepared with) is never
  overwritten. A corpus too
  small for `vocab_size` ids gives fewer (all the merges it holds), with a warning.
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
  path = output_file(out)
  if path.exists() and not path.is_file():
    raise TokenDataError(f"--out={out!r}: {path} exists and is not a file.")
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = tmp_path(path)
  tok.save(str(tmp))
  try:
    if path.is_file() and canonical_sha256(path) != canonical_sha256(tmp):
      raise TokenDataError(
          f"--out={out!r}: {path} already holds another tokenizer, and train-tokenizer never "
          "replaces one (a checkpoint's, or the one data was prepared with); pass a new "
          "--out, or move that file away first.")
    durable.publish(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)
  trained = tok.get_vocab_size(with_added_tokens=True)
  if trained < vocab_size:
    log.warning("train-tokenizer: the corpus gave %d ids, fewer than --vocab_size=%d (it "
                "holds no more merges); train on more text for a larger vocabulary.",
                trained, vocab_size)
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
