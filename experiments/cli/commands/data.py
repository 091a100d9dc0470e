"""The `lngram-exp` data commands: their flags and bodies (experiments/cli/ dispatches to `run`).

    lngram-exp prepare-data --input=fineweb/*.parquet --tokenizer=tok/tokenizer.json
                            --out=data/fw [--text_field=text --workers=8
                            --on_bad_utf8=skip --val_fraction=0.01]
    lngram-exp train-tokenizer [--input=texts/] --vocab_size=8192 --out=tok

`train-tokenizer` without `--input` trains on the embedded standard-library
corpus (experiments/data/corpus.py), training split only. The library is
`experiments.data.tokens`; a mistake is a one-line ValueError (`error: ...`).
Imports nothing heavy at module level: the CLI reads the tables below first.
"""

from __future__ import annotations

COMMANDS = {
    "prepare-data": "tokenize text inputs (parquet, JSON lines, text) once into --out",
    "train-tokenizer": "train a byte-level BPE tokenizer.json on a corpus into --out",
}
FLAGS_OF = {
    "prepare-data": {"input", "tokenizer", "out", "text_field", "workers", "on_bad_utf8",
                     "val_fraction"},
    "train-tokenizer": {"input", "vocab_size", "out", "text_field", "val_fraction"},
}
REQUIRED_OF = {"prepare-data": ("input", "tokenizer", "out"), "train-tokenizer": ("out",)}
# (absl kind, name, default, lower bound, help), as experiments/cli/flags.py defines its own.
FLAGS = [
    ("string", "input", None, None, "prepare-data, train-tokenizer: comma-separated files, "
     "folders or globs of .parquet, .jsonl or text files."),
    ("string", "tokenizer", None, None, "prepare-data: a tokenizer.json, a directory holding "
     "one, a Hugging Face hub id (org/name[@revision]: its tokenizer, fetched once into the "
     "hub's cache), or 'bytes'."),
    ("string", "out", None, None, "prepare-data: the data directory; train-tokenizer: a "
     "directory (or .json file) for tokenizer.json."),
    ("string", "text_field", "text", None, "prepare-data: the text column or JSON field."),
    ("integer", "workers", 1, 1, "prepare-data: worker processes."),
    ("string", "on_bad_utf8", "skip", None, "prepare-data: skip (count, warn) or error on "
     "text that is not UTF-8."),
    ("float", "val_fraction", None, None, "prepare-data, train-tokenizer: share of documents "
     "(by content hash) in the validation split (default 0.01)."),
    ("integer", "vocab_size", 4096, 258, "train-tokenizer: vocabulary size (e.g. 4096, 8192)."),
]


def run(command: str, f, argv: list[str]) -> int:
  """Runs data command `command` with the parsed flags `f`."""
  del argv
  from experiments.data.tokens.prepare import VAL_FRACTION

  val_fraction = VAL_FRACTION if f.val_fraction is None else f.val_fraction
  if command == "prepare-data":   # the flags in REQUIRED_OF are checked by experiments/cli
    return prepare_data_command(f.input, f.tokenizer, f.out, text_field=f.text_field,
                                workers=f.workers, on_bad_utf8=f.on_bad_utf8,
                                val_fraction=val_fraction)
  return train_tokenizer_command(f.input or "", f.out, vocab_size=f.vocab_size,
                                 text_field=f.text_field, val_fraction=val_fraction)


def prepare_data_command(inputs: str, tokenizer: str, out: str, **options) -> int:
  """Prepares the data directory and prints what it holds."""
  from experiments.data.tokens import prepare

  m = prepare(inputs, tokenizer, out, **options)
  print(f"done: {m['docs']:,} documents, {m['tokens']:,} tokens ({m['train_tokens']:,} train, "
        f"{m['val_tokens']:,} validation) in {len(m['shards'])} shard(s), vocabulary "
        f"{m['tokenizer']['vocab_size']}, into {out}")
  return 0


def train_tokenizer_command(inputs: str, out: str, *, vocab_size: int, text_field: str,
                            val_fraction: float) -> int:
  """Trains the tokenizer and prints where it went and how many ids it holds (fewer
  than `vocab_size` on a small corpus: train_tokenizer then warns)."""
  from experiments.data.tokens import describe, tokenizer_texts, train_tokenizer
  from experiments.data.tokens.tokenizer import output_file

  path = train_tokenizer(tokenizer_texts(inputs, text_field=text_field,
                                         val_fraction=val_fraction,
                                         exclude=output_file(out)),
                         out, vocab_size=vocab_size)
  print(f"done: a byte-level BPE of {describe(str(path)).vocab_size} ids in {path}")
  return 0
