"""A tokenizer trained on tiny inputs of every kind (made once per module)."""

import pytest
from tokens_inputs import texts, write_inputs

from experiments.data.tokens import train_tokenizer


@pytest.fixture(scope="module")
def corpus_inputs(tmp_path_factory):
  """(input spec, {file: its documents}, tokenizer.json path)."""
  root = tmp_path_factory.mktemp("inputs")
  docs = texts()
  spec, files = write_inputs(root, docs)
  tokenizer = train_tokenizer(iter(docs), str(root / "tok"), vocab_size=320)
  return spec, files, tokenizer
