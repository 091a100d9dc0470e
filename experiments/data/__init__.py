"""Byte-level text data: the embedded corpus, packing, grain pipelines.

`corpus` and `packing` need only numpy; `pipeline` (imported on first use of
its names) needs grain.
"""

from experiments.data.corpus import (
    Corpus,
    CorpusChangedError,
    CorpusSpec,
    corpus_spec,
    is_validation,
    list_files,
    load_corpus,
    record_manifest,
    split_files,
    write_manifest,
)
from experiments.data.packing import num_rows, pack_row, reference_rows, stream_offsets

__all__ = [
    "Corpus",
    "CorpusChangedError",
    "CorpusSpec",
    "PackedRows",
    "TrainIterator",
    "corpus_spec",
    "eval_batches",
    "is_validation",
    "list_files",
    "load_corpus",
    "num_rows",
    "pack_row",
    "record_manifest",
    "reference_rows",
    "split_files",
    "stream_offsets",
    "write_manifest",
]


def __getattr__(name):
  if name in ("PackedRows", "TrainIterator", "eval_batches"):
    from experiments.data import pipeline
    return getattr(pipeline, name)
  raise AttributeError(f"module 'experiments.data' has no attribute {name!r}")
