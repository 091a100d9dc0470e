"""Semantic targets of a Python source file, per byte, from `tokenize` and `ast`.

Three levels (the Lngram v2 paper's caption / visual / local presence, carried
over to source code):

  local      the category of the token the byte belongs to: each keyword by
             itself ("def", "return", "True", ...), "BUILTIN" (any public name
             of the `builtins` module: one concept, because single builtins are
             too rare for a per-concept AP on a few thousand positions), "NAME"
             (other identifiers, soft keywords included), "STRING", "DOCSTRING"
             (the string of a module / class / function docstring), "COMMENT",
             "NUMBER", "OP". f-string pieces are "STRING"; the expressions
             inside an f-string keep their own categories. Whitespace, newlines
             and indentation have no local label.
  statement  the kind (ast class name) of the innermost statement whose line
             span holds the byte; where a statement starts after another one on
             the same line (`if x: return y`, `a = 1; b = 2`) it holds the bytes
             from its own start. Decorator lines are "decorator". Bytes outside
             every statement (blank lines and comments between top-level
             statements) have no statement label.
  document   the top-level modules the file imports (`import a.b` -> "a",
             `from a.b import c` -> "a"; relative imports are package-internal
             and skipped), anywhere in the file.

Offsets are BYTE offsets into the raw file (tokenize and ast count characters
and UTF-8 bytes of the decoded line; both are converted).

Token runs (a tokenizer's ids, not bytes: experiments/analysis/token_docs.py): the
targets are taken from the document's text exactly as above, then carried to its tokens
(`token_targets`): a token's local and statement label is that of its first byte that
has one (so " return" is "return", "):\n" is "OP", a whitespace-only token has none
unless its span reaches a labelled byte), and a document's imports are its text's.
"""

from __future__ import annotations

import ast
import builtins
import codecs
import dataclasses
import io
import keyword
import token as token_module
import tokenize

import numpy as np

KEYWORDS = tuple(keyword.kwlist)
LOCAL_CONCEPTS = KEYWORDS + ("BUILTIN", "NAME", "STRING", "DOCSTRING", "COMMENT", "NUMBER", "OP")
STATEMENT_CONCEPTS = (
    "FunctionDef", "AsyncFunctionDef", "ClassDef", "Return", "Delete", "Assign", "AugAssign",
    "AnnAssign", "TypeAlias", "For", "AsyncFor", "While", "If", "With", "AsyncWith", "Match",
    "Raise", "Try", "TryStar", "Assert", "Import", "ImportFrom", "Global", "Nonlocal", "Expr",
    "Pass", "Break", "Continue", "decorator")
BUILTIN_NAMES = frozenset(n for n in dir(builtins) if not n.startswith("_")) - set(KEYWORDS)

_LOCAL_ID = {name: i for i, name in enumerate(LOCAL_CONCEPTS)}
_STATEMENT_ID = {name: i for i, name in enumerate(STATEMENT_CONCEPTS)}
_DEF_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_DOC_OWNERS = (ast.Module, *_DEF_NODES)
# Non-statement nodes whose children may be statements (expressions never are:
# skipping them keeps the walk shallow on long expression chains).
_STMT_HOLDERS = tuple(getattr(ast, n) for n in ("excepthandler", "match_case") if hasattr(ast, n))
# Token types with a local label (others: NEWLINE, NL, INDENT, ... have none).
_STRING_TYPES = frozenset(
    getattr(token_module, name) for name in (
        "STRING", "FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END",
        "TSTRING_START", "TSTRING_MIDDLE", "TSTRING_END") if hasattr(token_module, name))


@dataclasses.dataclass(frozen=True)
class SourceTargets:
  """Per-byte labels of one file (N = its size in bytes).

  local: int16 [N], index into LOCAL_CONCEPTS, -1 where none.
  statement: int16 [N], index into STATEMENT_CONCEPTS, -1 where none.
  imports: the imported top-level module names, sorted.
  """

  local: np.ndarray
  statement: np.ndarray
  imports: tuple[str, ...]


def extract_targets(source: bytes) -> SourceTargets | None:
  """The targets of one file's bytes; None when it does not tokenize or parse.

  Files with a lone carriage return are also None: tokenize and ast disagree
  on their line numbers.
  """
  source = bytes(source)
  if b"\r" in source.replace(b"\r\n", b""):
    return None
  try:
    tree = ast.parse(source)
    tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
    offsets = _Offsets(source)
  except (SyntaxError, ValueError, UnicodeError, LookupError, tokenize.TokenError,
          RecursionError, MemoryError):
    return None
  try:
    statement = _statement_labels(tree, offsets, len(source))
  except RecursionError:   # statements nested ~1000 deep
    return None
  local = _local_labels(tokens, _docstring_spans(tree, offsets), offsets, len(source))
  return SourceTargets(local=local, statement=statement, imports=_imports(tree))


class _Offsets:
  """(line, column) -> byte offset in the raw file.

  Lines split on b"\\n" (what tokenize's readline sees); columns are characters
  of the decoded line (tokenize) or UTF-8 bytes of it (ast). A UTF-8 byte order
  mark is not part of the decoded first line: it shifts that line by 3 bytes.
  """

  def __init__(self, source: bytes):
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    self.bom = len(codecs.BOM_UTF8) if source.startswith(codecs.BOM_UTF8) else 0
    self.encoding = "utf-8" if encoding == "utf-8-sig" else encoding
    self.raw = source.split(b"\n")
    # Line i (1-based) starts at starts[i - 1]; the last entry is the file size.
    self.starts = np.cumsum([0] + [len(line) + 1 for line in self.raw]).tolist()
    self.starts[-1] = len(source)
    self._text = {}

  def line_start(self, lineno: int) -> int:
    return self.starts[min(lineno, len(self.raw)) - 1]

  def line_end(self, lineno: int) -> int:
    """The byte after the line (its newline included)."""
    return self.starts[min(lineno, len(self.raw))]

  def _content(self, lineno: int) -> bytes:
    """The line's bytes after the byte order mark (line 1)."""
    return self.raw[lineno - 1][self.bom if lineno == 1 else 0:]

  def _decoded(self, lineno: int) -> str:
    if lineno not in self._text:
      self._text[lineno] = self._content(lineno).decode(self.encoding)
    return self._text[lineno]

  def from_chars(self, lineno: int, col: int) -> int:
    if lineno > len(self.raw):
      return self.starts[-1]
    start = self.line_start(lineno) + (self.bom if lineno == 1 else 0)
    if self._content(lineno).isascii():
      return start + col
    return start + len(self._decoded(lineno)[:col].encode(self.encoding))

  def from_utf8(self, lineno: int, col: int) -> int:
    if lineno > len(self.raw) or self._content(lineno).isascii():
      return self.from_chars(lineno, col)
    chars = len(self._decoded(lineno).encode("utf-8")[:col].decode("utf-8", errors="ignore"))
    return self.from_chars(lineno, chars)


def token_targets(found: SourceTargets, starts, ends) -> SourceTargets:
  """The per-byte targets `found` of a text carried to its tokens, token t holding bytes
  [starts[t], ends[t]): each token's label is the first label among its bytes (-1 where
  none has one, or the token holds no byte); `imports` unchanged."""
  starts = np.asarray(starts, np.int64)
  ends = np.asarray(ends, np.int64)

  def carry(labels_N):
    n = labels_N.size
    # first[i]: the first labelled byte at or after byte i (n: none).
    first = np.where(labels_N >= 0, np.arange(n), n)
    first = np.append(np.minimum.accumulate(first[::-1])[::-1], n)
    at = first[np.clip(starts, 0, n)]
    ok = at < np.minimum(ends, n)
    out = np.full(starts.shape, -1, np.int16)
    out[ok] = labels_N[at[ok]]
    return out

  return SourceTargets(local=carry(found.local), statement=carry(found.statement),
                       imports=found.imports)


def _statement_labels(tree: ast.Module, offsets: _Offsets, size: int) -> np.ndarray:
  """Innermost statement per byte: spans painted outer first, so inner ones win."""
  spans = []  # (depth, start byte, end byte, label id)

  def visit(node, depth):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.stmt):
        spans.append((depth, child))
        if isinstance(child, _DEF_NODES):
          for dec in child.decorator_list:
            spans.append((depth, ("decorator", dec)))
        visit(child, depth + 1)
      elif isinstance(child, _STMT_HOLDERS):
        visit(child, depth)

  visit(tree, 0)
  # The first statement starting on a line holds the line from its start
  # (indentation included); later ones on that line hold bytes from their start.
  first_col = {}
  for _, node in spans:
    node = node[1] if isinstance(node, tuple) else node
    first_col[node.lineno] = min(first_col.get(node.lineno, node.col_offset), node.col_offset)
  labels = np.full(size, -1, np.int16)
  for _, node in sorted(spans, key=lambda s: s[0]):
    if isinstance(node, tuple):
      kind, node = node
      # A decorator's line starts at its "@", one column before the expression.
      start = offsets.line_start(node.lineno)
    else:
      kind = type(node).__name__
      start = (offsets.line_start(node.lineno) if node.col_offset == first_col[node.lineno]
               else offsets.from_utf8(node.lineno, node.col_offset))
    if kind not in _STATEMENT_ID:
      continue
    labels[start:offsets.line_end(node.end_lineno)] = _STATEMENT_ID[kind]
  return labels


def _docstring_spans(tree: ast.Module, offsets: _Offsets) -> list[tuple[int, int]]:
  spans = []
  for node in ast.walk(tree):
    if isinstance(node, _DOC_OWNERS) and node.body:
      first = node.body[0]
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
        spans.append((offsets.from_utf8(first.lineno, first.col_offset),
                      offsets.from_utf8(first.end_lineno, first.end_col_offset)))
  return spans


def _local_labels(tokens, doc_spans, offsets: _Offsets, size: int) -> np.ndarray:
  labels = np.full(size, -1, np.int16)
  for tok in tokens:
    kind = _token_kind(tok)
    if kind is None:
      continue
    start = offsets.from_chars(*tok.start)
    end = offsets.from_chars(*tok.end)
    if kind == "STRING" and any(a <= start < b for a, b in doc_spans):
      kind = "DOCSTRING"
    labels[start:end] = _LOCAL_ID[kind]
  return labels


def _token_kind(tok) -> str | None:
  if tok.type == tokenize.NAME:
    if keyword.iskeyword(tok.string):
      return tok.string
    return "BUILTIN" if tok.string in BUILTIN_NAMES else "NAME"
  if tok.type in _STRING_TYPES:
    return "STRING"
  if tok.type == tokenize.COMMENT:
    return "COMMENT"
  if tok.type == tokenize.NUMBER:
    return "NUMBER"
  if tok.type == tokenize.OP:
    return "OP"
  return None


def _imports(tree: ast.Module) -> tuple[str, ...]:
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      found.add(node.module.split(".")[0])
  return tuple(sorted(found))
