"""Per-byte targets from tokenize / ast against labels written by hand."""

import numpy as np
import pytest

from experiments.analysis.targets import LOCAL_CONCEPTS, STATEMENT_CONCEPTS, extract_targets

# (text, local label, statement label) pieces; None: no label. Their concatenation
# is the file. Line 8 holds a 2-byte character, so byte and character offsets differ.
PIECES = [
    ('"""Doc."""', "DOCSTRING", "Expr"), ("\n", None, "Expr"),
    ("import", "import", "Import"), (" ", None, "Import"), ("os", "NAME", "Import"),
    (".", "OP", "Import"), ("path", "NAME", "Import"), ("\n", None, "Import"),
    ("from", "from", "ImportFrom"), (" ", None, "ImportFrom"), (".", "OP", "ImportFrom"),
    (" ", None, "ImportFrom"), ("import", "import", "ImportFrom"), (" ", None, "ImportFrom"),
    ("x", "NAME", "ImportFrom"), ("\n", None, "ImportFrom"),
    ("\n", None, None),
    ("@", "OP", "decorator"), ("deco", "NAME", "decorator"), ("\n", None, "decorator"),
    ("def", "def", "FunctionDef"), (" ", None, "FunctionDef"), ("f", "NAME", "FunctionDef"),
    ("(", "OP", "FunctionDef"), ("a", "NAME", "FunctionDef"), ("):", "OP", "FunctionDef"),
    ("\n", None, "FunctionDef"),
    ("  ", None, "Return"), ("return", "return", "Return"), (" ", None, "Return"),
    ("len", "BUILTIN", "Return"), ("(", "OP", "Return"), ("a", "NAME", "Return"),
    (")", "OP", "Return"), (" ", None, "Return"), ("+", "OP", "Return"),
    (" ", None, "Return"), ("1", "NUMBER", "Return"), ("  ", None, "Return"),
    ("# c", "COMMENT", "Return"), ("\n", None, "Return"),
    ("x", "NAME", "Assign"), (" ", None, "Assign"), ("=", "OP", "Assign"),
    (" ", None, "Assign"), ('"é"', "STRING", "Assign"), (";", "OP", "Assign"),
    (" ", None, "Assign"), ("del", "del", "Delete"), (" ", None, "Delete"),
    ("x", "NAME", "Delete"), ("\n", None, "Delete"),
    ("if", "if", "If"), (" ", None, "If"), ("True", "True", "If"), (":", "OP", "If"),
    (" ", None, "If"), ("pass", "pass", "Pass"), ("\n", None, "Pass"),
    ("# end", "COMMENT", None), ("\n", None, None),
    ("class", "class", "ClassDef"), (" ", None, "ClassDef"), ("C", "NAME", "ClassDef"),
    (":", "OP", "ClassDef"), ("\n", None, "ClassDef"),
    ("  ", None, "Expr"), ('"""D."""', "DOCSTRING", "Expr"), ("\n", None, "Expr"),
    ("  ", None, "Expr"), ('"s"', "STRING", "Expr"), ("\n", None, "Expr"),
]


def _expected(pieces):
  source = b"".join(text.encode() for text, _, _ in pieces)
  local, statement = [], []
  for text, loc, stmt in pieces:
    n = len(text.encode())
    local += [-1 if loc is None else LOCAL_CONCEPTS.index(loc)] * n
    statement += [-1 if stmt is None else STATEMENT_CONCEPTS.index(stmt)] * n
  return source, np.array(local), np.array(statement)


def _names(ids, vocab):
  return [None if i < 0 else vocab[i] for i in ids]


def test_hand_labelled_file():
  source, local, statement = _expected(PIECES)
  found = extract_targets(source)
  assert found is not None
  assert found.local.shape == found.statement.shape == (len(source),)
  assert _names(found.local, LOCAL_CONCEPTS) == _names(local, LOCAL_CONCEPTS)
  assert _names(found.statement, STATEMENT_CONCEPTS) == _names(statement, STATEMENT_CONCEPTS)
  # Relative imports are package-internal: only "os".
  assert found.imports == ("os",)


def test_imports_are_top_level_modules_anywhere():
  found = extract_targets(b"import a.b, c as d\ndef f():\n  from e.f import g\n")
  assert found.imports == ("a", "c", "e")


@pytest.mark.parametrize("source", [
    b"def f(:\n  pass\n",           # does not parse
    b'x = """never closed\n',       # does not tokenize
    b"x = 1\ry = 2\n",              # lone carriage return
    b"\xff\xfe = 1\n",              # not UTF-8
])
def test_broken_files_are_none(source):
  assert extract_targets(source) is None


def _at(found, source, needle, nth=0):
  """(local, statement) concept names at the first byte of the nth `needle`."""
  i = -1
  for _ in range(nth + 1):
    i = source.index(needle, i + 1)
  return LOCAL_CONCEPTS[found.local[i]], STATEMENT_CONCEPTS[found.statement[i]]


def test_offsets_are_bytes_for_other_encodings_bom_and_crlf():
  latin = b"# -*- coding: latin-1 -*-\nx = '\xe9\xe9'; del x\n"
  assert _at(extract_targets(latin), latin, b"del") == ("del", "Delete")
  assert _at(extract_targets(latin), latin, b"x", 1) == ("NAME", "Delete")
  bom = b"\xef\xbb\xbfx = '\xc3\xa9'; del x\n"
  assert _at(extract_targets(bom), bom, b"x") == ("NAME", "Assign")
  assert _at(extract_targets(bom), bom, b"del") == ("del", "Delete")
  crlf = b"x = 1\r\nif x: y = 2\r\n"
  found = extract_targets(crlf)
  assert _at(found, crlf, b"y") == ("NAME", "Assign")
  assert _at(found, crlf, b"if") == ("if", "If")
  assert found.local[crlf.index(b"\r")] == -1


def test_a_token_takes_the_first_label_among_its_bytes():
  from experiments.analysis.targets import SourceTargets, token_targets

  # Bytes:     0   1   2  3  4   5
  byte = np.array([-1, -1, 3, 4, -1, 7], np.int16)
  found = SourceTargets(local=byte, statement=byte[::-1].copy(), imports=("os",))
  # Tokens: leading whitespace then a label; one label; no label; empty (an EOS); the end.
  starts, ends = np.array([0, 3, 4, 4, 5]), np.array([3, 4, 5, 4, 6])
  tokens = token_targets(found, starts, ends)
  assert tokens.local.tolist() == [3, 4, -1, -1, 7]
  assert tokens.statement.tolist() == [7, 3, -1, -1, -1]   # bytes 7, -1, 4, 3, -1, -1
  assert tokens.imports == ("os",) and tokens.local.dtype == np.int16
  # Over the hand-labelled file, cut into tokens: each carries its first labelled byte.
  source, local, _ = _expected(PIECES)
  found = extract_targets(source)
  cuts = np.arange(0, len(source), 3)
  tokens = token_targets(found, cuts, np.append(cuts[1:], len(source)))
  for t, (a, b) in enumerate(zip(cuts, np.append(cuts[1:], len(source)), strict=True)):
    labelled = [x for x in local[a:b] if x >= 0]
    assert tokens.local[t] == (labelled[0] if labelled else -1)
