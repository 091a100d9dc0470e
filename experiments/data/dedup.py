"""Near-duplicate files across two splits, by a content hash of normalised lines.

One rule for both places that compare splits: the validation set deduplicated against
training (experiments/data/validation.py, `data.dedup_validation`) and the analyses'
reference and held-out files (experiments/analysis).

The standard library holds families of generated files (the `encodings/*` codec
tables, the CJK codecs, ...) that differ only in their string and number
literals. A corpus split by path hash puts members of one family on both
sides, and a held-out codec table then finds its twin among the reference
files: ID-KNN (and every other reader) scores a copy, not a generalisation.

Normalisation, line by line over Python tokens (`tokenize`):
  * comments, blank lines and indentation are dropped;
  * every string literal becomes `""` and every number `0`;
  * the remaining tokens of a source line are joined by one space.
A file that does not tokenize falls back to its whitespace-stripped non-blank
lines. The file's hash is sha256 over its normalised lines joined by newlines.
Two files are near-duplicates when their hashes are equal; every file whose
hash occurs in BOTH splits is removed from both (`cross_split_duplicates`),
except files with no normalised line at all (empty or comment-only files, e.g.
the many empty `__init__.py`), which share nothing.
"""

from __future__ import annotations

import hashlib
import io
import tokenize
from collections import defaultdict
from collections.abc import Iterable

_DROPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}


def normalised_lines(data: bytes) -> list[str]:
  """The normalised lines of one file (see the module docstring)."""
  lines: dict[int, list[str]] = defaultdict(list)
  try:
    for tok in tokenize.tokenize(io.BytesIO(bytes(data)).readline):
      if tok.type == tokenize.ERRORTOKEN:
        # Python 3.11 yields these where 3.12 raises: the same fallback on both.
        raise tokenize.TokenError("error token", tok.start)
      if tok.type in _DROPPED:
        continue
      text = ('""' if tok.type == tokenize.STRING else
              "0" if tok.type == tokenize.NUMBER else tok.string)
      lines[tok.start[0]].append(text)
  except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
    return [ln.strip() for ln in bytes(data).decode("utf-8", "replace").splitlines()
            if ln.strip()]
  return [" ".join(parts) for _, parts in sorted(lines.items())]


def content_hash(data: bytes) -> str:
  """sha256 (hex) of the normalised lines joined by newlines."""
  return hashlib.sha256("\n".join(normalised_lines(data)).encode()).hexdigest()


EMPTY = hashlib.sha256(b"").hexdigest()   # the hash of a file with no normalised line


def cross_split_duplicates(reference: Iterable, heldout: Iterable) -> tuple[set, set]:
  """(reference paths, held-out paths) whose content hash occurs in both splits.

  `reference`, `heldout`: (path, bytes) pairs, e.g. every training and every
  validation file of a corpus.
  """
  ref_hash = {str(path): content_hash(data) for path, data in reference}
  held_hash = {str(path): content_hash(data) for path, data in heldout}
  # A file with no code left (empty, or comments only) has no content to share.
  both = (set(ref_hash.values()) & set(held_hash.values())) - {EMPTY}
  return ({p for p, h in ref_hash.items() if h in both},
          {p for p, h in held_hash.items() if h in both})
