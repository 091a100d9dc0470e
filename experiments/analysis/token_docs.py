"""The documents of a run trained on token data, read by the ID analyses (`run.analyze_lm`).

A token run (`data.kind="tokens"`) keeps `token_data.json` (its data directory and the
digest of its tokenizer) and a copy of its tokenizer (experiments/data/tokens/run.py).
The analyses open that data directory (the recorded path, else `data.path`; refused
when it now holds another tokenizer's ids) and read:

  reference  `n_reference` documents of the training split, drawn with `seed`
  held-out   the validation split's documents (all, or `n_heldout` drawn with `seed`)
  windows    the validation documents again (`val_docs`), for stability and injection

Each document is a `records.TokenDoc`: its token ids (what the model reads; the EOS
that token data appends to every document holds no text and is left out) and its text
as bytes, with each token's byte span [start, end) in it. Ids map to bytes through the
run's tokenizer: the "bytes" tokenizer's ids are the bytes; a byte-level BPE (a
ByteLevel decoder: what `train-tokenizer` writes, GPT-2, Llama 3, Qwen) maps every
vocabulary entry to its bytes exactly; another tokenizer maps an id to its text decoded
alone. Special tokens hold no bytes. A document whose tokens' bytes do not add up to its
decoded text is skipped (counted like a file that does not parse); when every document
is, the tokenizer is refused.

`dedup`: documents whose normalised content occurs both among the drawn reference
documents and among the held-out ones are removed from both (experiments/analysis/
dedup.py). Unlike the byte corpus's (every training file is compared, before the draw),
only the drawn reference documents are compared, since decoding a whole token corpus
costs as much as preparing it; they are the only neighbours a held-out query can find,
so no query is scored against its own copy.

A document is named by its shard's source file (relative to the folder holding all the
sources) and, when that file holds several documents, "#k": its index there (both
splits counted, so a name is never shared across the splits).

How positions of token documents are read (surface and nuisance features, targets):
experiments/analysis/records.py and experiments/analysis/targets.py.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from experiments.analysis.records import TokenDoc

log = logging.getLogger("experiments")

RECORD = "token_data.json"     # experiments/data/tokens/run.py
TOKENIZER_FILE = "tokenizer.json"


def is_token_run(workdir=None, config=None) -> bool:
  """Whether the run was trained on token data: its `token_data.json`, or its config's
  `data.kind`."""
  if workdir is not None and (Path(workdir) / RECORD).is_file():
    return True
  return config is not None and (config.data.get("kind", "bytes") or "bytes") == "tokens"


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character map, which byte-level BPE vocabularies spell in."""
  bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1)))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs), strict=True))


class TokenBytes:
  """Token ids -> bytes with a run's tokenizer (the module docstring): `table[i]` is id
  i's bytes, `document(name, ids)` a document's TokenDoc. `exact`: every id's bytes are
  its own (the "bytes" ids, a byte-level BPE); else each document is checked against
  the text the tokenizer decodes it to."""

  def __init__(self, tokenizer_path: Path | None, vocab_size: int):
    self._tok = None
    if tokenizer_path is None:   # the "bytes" tokenizer: an id is its byte
      self.table = [bytes([i]) for i in range(256)]
      self.exact = True
    else:
      from tokenizers import Tokenizer
      self._tok = Tokenizer.from_file(str(tokenizer_path))
      spec = json.loads(Path(tokenizer_path).read_text())
      self.table, self.exact = self._table(spec, vocab_size)
    self.lengths = np.asarray([len(b) for b in self.table], np.int64)

  def _table(self, spec: dict, vocab_size: int) -> tuple[list[bytes], bool]:
    decoder = spec.get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders") or []}
    byte_level = "ByteLevel" in kinds
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    added = {int(t["id"]): t for t in spec.get("added_tokens") or []}
    size = max(vocab_size, self._tok.get_vocab_size(with_added_tokens=True))
    table, exact = [], byte_level
    for i in range(size):
      if i in added:
        table.append(b"" if added[i].get("special") else added[i]["content"].encode())
        continue
      piece = self._tok.id_to_token(i)
      if piece is None:
        table.append(b"")
      elif byte_level and all(c in byte_of for c in piece):
        table.append(bytes(byte_of[c] for c in piece))
      else:   # its text decoded alone
        table.append(self._tok.decode([i], skip_special_tokens=True).encode("utf-8"))
        exact = False
    return table, exact

  def document(self, name: str, ids: np.ndarray) -> TokenDoc | None:
    """The TokenDoc of one document's ids; None when its tokens' bytes do not add up to
    its decoded text."""
    ids = np.asarray(ids, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= len(self.table)):
      return None
    data = b"".join([self.table[i] for i in ids.tolist()])
    if not self.exact:
      text = self._tok.decode(ids.tolist(), skip_special_tokens=True).encode("utf-8")
      if text != data:
        return None
    ends = np.cumsum(self.lengths[ids]) if ids.size else np.zeros(0, np.int64)
    return TokenDoc(name, ids.astype(np.int32), data, ends - self.lengths[ids], ends)


class TokenRunData:
  """A token run's data directory, opened for the analyses (the module docstring)."""

  def __init__(self, workdir, config):
    from experiments.data.tokens import TokenCorpus, check_tokenizer
    workdir = Path(workdir) if workdir is not None else None
    record = None
    if workdir is not None and (workdir / RECORD).is_file():
      record = json.loads((workdir / RECORD).read_text())
    path = Path(record["path"]) if record and Path(record["path"]).is_dir() else None
    if path is None:
      if not config.data.get("path"):
        raise ValueError("analyze: the token run records no data directory (token_data.json) "
                         "and its config no data.path.")
      path = Path(config.data.path).expanduser()
    self.corpus = TokenCorpus(path)
    manifest = self.corpus.manifest
    if record is not None:
      check_tokenizer(manifest, record["tokenizer"]["sha256"],
                      record["tokenizer"]["vocab_size"], what="this run's")
      if record.get("shards_sha256") != self.corpus.digest:
        log.warning("analyze: the token data in %s changed since the run recorded it "
                    "(%s -> %s documents); the analyses read it as it is now.", path,
                    record.get("docs"), manifest["docs"])
    tok = manifest["tokenizer"]
    eos = tok.get("eos")
    self.eos_id = None if eos is None else int(eos["id"])
    tokenizer = None
    if tok["kind"] != "bytes":
      own = workdir / TOKENIZER_FILE if workdir is not None else None
      tokenizer = own if own is not None and own.is_file() else path / TOKENIZER_FILE
      if not tokenizer.is_file():
        raise ValueError(f"analyze: no {TOKENIZER_FILE} in the run directory or in {path}: "
                         "the token ids cannot be read back as text.")
    self.bytes = TokenBytes(tokenizer, int(tok["vocab_size"]))
    self._names = None

  def _ids(self, docs, i: int) -> np.ndarray:
    """A document's ids without the EOS token data appends to it."""
    ids = np.asarray(docs[i])
    if self.eos_id is not None and ids.size and int(ids[-1]) == self.eos_id:
      ids = ids[:-1]
    return ids.astype(np.int32)

  @property
  def val_docs(self) -> list[np.ndarray]:
    """The validation documents' ids (EOS left out): the stability / injection windows."""
    docs = self.corpus.val_docs
    return [self._ids(docs, i) for i in range(len(docs))]

  def names(self, split: str, index) -> list[str]:
    """Names (the module docstring) of documents `index` of `split` ("train", "val")."""
    if self._names is None:
      self._names = _name_parts(self.corpus)
    sources, shard, rank, count, n_train = self._names
    offset = 0 if split == "train" else n_train
    out = []
    for i in np.asarray(index, np.int64).tolist():
      k, r = int(shard[offset + i]), int(rank[offset + i])
      out.append(sources[k] + (f"#{r}" if count[k] > 1 else ""))
    return out

  def documents(self, split: str, index) -> tuple[list[TokenDoc], int]:
    """(TokenDocs of documents `index` of `split`, how many could not be read as text)."""
    docs = self.corpus.train_docs if split == "train" else self.corpus.val_docs
    index = np.asarray(index, np.int64)
    out, bad = [], 0
    for name, i in zip(self.names(split, index), index.tolist(), strict=True):
      doc = self.bytes.document(name, self._ids(docs, i))
      if doc is None:
        bad += 1
      else:
        out.append(doc)
    return out, bad


def _name_parts(corpus):
  """(source names, each document's shard, its rank in that shard, documents per shard,
  training documents): over the training documents, then the validation ones."""
  shards = corpus.manifest["shards"]
  sources = [str(s["source"]) for s in shards]
  try:
    root = os.path.commonpath([os.path.dirname(s) for s in sources]) if sources else ""
  except ValueError:   # absolute and relative paths mixed
    root = ""
  sources = [os.path.relpath(s, root) if root else s for s in sources]
  tr, va = corpus.train_docs, corpus.val_docs
  shard = np.concatenate([tr.shard_D, va.shard_D]).astype(np.int64)
  start = np.concatenate([tr.start_D, va.start_D]).astype(np.int64)
  order = np.lexsort((start, shard))
  first = np.searchsorted(shard[order], np.arange(len(shards)))
  rank = np.empty(order.size, np.int64)
  rank[order] = np.arange(order.size) - first[shard[order]]
  return sources, shard, rank, np.bincount(shard, minlength=len(shards)), len(tr)


def split_docs(data: TokenRunData, *, n_reference: int = 256, n_heldout: int | None = None,
               seed: int = 0, dedup: bool = False) -> tuple[list[TokenDoc], list[TokenDoc], int]:
  """(reference, held-out) TokenDocs of a token run's data (the module docstring), and how
  many documents were skipped because their ids do not read back as their text."""
  rng = np.random.default_rng(seed)

  def draw(n_docs, n):
    if n is None or n >= n_docs:
      return np.arange(n_docs)
    return np.sort(rng.choice(n_docs, size=n, replace=False))

  ref, bad_ref = data.documents("train", draw(len(data.corpus.train_docs), n_reference))
  held, bad_held = data.documents("val", draw(len(data.corpus.val_docs), n_heldout))
  if (bad_ref or bad_held) and not (ref or held):
    raise ValueError("analyze: no document of this token run reads back as its text with "
                     "its tokenizer (experiments/analysis/token_docs.py).")
  if dedup:
    from experiments.data import dedup as dedup_lib
    drop_ref, drop_held = dedup_lib.cross_split_duplicates(
        ((d.path, d.data) for d in ref), ((d.path, d.data) for d in held))
    ref = [d for d in ref if d.path not in drop_ref]
    held = [d for d in held if d.path not in drop_held]
  return ref, held, bad_ref + bad_held
