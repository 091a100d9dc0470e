"""Tiny inputs of every kind for the token-data tests."""

import json

VAL_FRACTION = 0.25


def texts(n=120):
  """Documents with repeats inside (BPE merges) and across (one split per content)."""
  words = ["alpha", "beta", "gamma", "delta", "naïve", "δ-λ", "x = y + 1", "\n", "日本"]
  return [" ".join(words[(i * k) % len(words)] for k in range(3 + i % 11)) + f" #{i % 40}"
          for i in range(n)]


def write_inputs(root, docs):
  """docs split over a parquet file, a JSON-lines file and a folder of text files:
  (input spec, {file path: its documents})."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  root.mkdir(parents=True, exist_ok=True)
  a, b = len(docs) // 2, 3 * len(docs) // 4
  pq.write_table(pa.table({"text": docs[:a], "id": list(range(a))}), root / "part.parquet",
                 row_group_size=16)
  files = {str(root / "part.parquet"): docs[:a], str(root / "lines.jsonl"): docs[a:b]}
  with open(root / "lines.jsonl", "w") as f:
    for doc in docs[a:b]:
      f.write(json.dumps({"text": doc, "url": "u"}) + "\n")
  (root / "txt").mkdir(exist_ok=True)
  for i, doc in enumerate(docs[b:]):
    path = root / "txt" / f"{i:03d}.txt"
    path.write_text(doc, encoding="utf-8")
    files[str(path)] = [doc]
  return f"{root / 'part.parquet'},{root / 'lines.jsonl'},{root / 'txt'}", files
