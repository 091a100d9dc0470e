"""Tokenized corpora: prepare once into memory-mapped shards, stream packed token rows.

    prepare(inputs, tokenizer, out)       text files -> shards + manifest (prepare.py)
    train_tokenizer(texts, out)           a byte-level BPE saved as tokenizer.json
    TokenCorpus(path)                     a data directory opened for reading (rows.py)
    TokenBatches / token_eval_batches     training batches (resumable) / validation batches

The format and its invariants: format.py and DESIGN.md §4. Needs numpy; reading
parquet needs pyarrow and a tokenizer.json needs tokenizers (imported on use).
"""

from experiments.data.tokens.format import (
    FORMAT_VERSION,
    TokenDataError,
    check_tokenizer,
    read_manifest,
)
from experiments.data.tokens.prepare import prepare, tokenizer_texts
from experiments.data.tokens.rows import TokenBatches, TokenCorpus, TokenRows, token_eval_batches
from experiments.data.tokens.tokenizer import BYTES, TokenizerInfo, describe, train_tokenizer

__all__ = [
    "BYTES",
    "FORMAT_VERSION",
    "TokenBatches",
    "TokenCorpus",
    "TokenDataError",
    "TokenRows",
    "TokenizerInfo",
    "check_tokenizer",
    "describe",
    "prepare",
    "read_manifest",
    "token_eval_batches",
    "tokenizer_texts",
    "train_tokenizer",
]
