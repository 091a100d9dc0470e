"""Every bad input of token data is one line (a TokenDataError), and nothing is lost."""

import json
import logging

import pytest
from tokens_inputs import VAL_FRACTION, texts

from experiments.data.tokens import (
    TokenCorpus,
    TokenDataError,
    check_tokenizer,
    prepare,
    read_manifest,
)
from experiments.data.tokens import format as fmt


def refused(match, fn, *args, **kwargs):
  with pytest.raises(TokenDataError, match=match) as info:
    fn(*args, **kwargs)
  assert "\n" not in str(info.value)
  assert isinstance(info.value, ValueError)   # the CLI's one-line `error:`, exit 2
  return str(info.value)


def small(tmp_path, tokenizer="bytes", **kwargs):
  folder = tmp_path / "txt"
  folder.mkdir(exist_ok=True)
  for i, t in enumerate(texts(24)):
    (folder / f"{i}.txt").write_text(t)
  out = tmp_path / "out"
  return out, prepare(str(folder), tokenizer, str(out), val_fraction=VAL_FRACTION,
                      progress=False, **kwargs)


def test_a_missing_text_column_names_the_columns_found(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  pq.write_table(pa.table({"content": ["a b"], "id": [1]}), tmp_path / "x.parquet")
  message = refused("no column 'text'", prepare, str(tmp_path / "x.parquet"), "bytes",
                    str(tmp_path / "out"), progress=False)
  assert "content, id" in message
  (tmp_path / "y.jsonl").write_text(json.dumps({"body": "a"}) + "\n")
  refused("no field 'text' .found: body", prepare, str(tmp_path / "y.jsonl"), "bytes",
          str(tmp_path / "out2"), progress=False)
  out = tmp_path / "out3"
  prepare(str(tmp_path / "x.parquet"), "bytes", str(out), text_field="content",
          val_fraction=0.5, progress=False)
  assert read_manifest(out)["docs"] == 1


def test_non_utf8_text_is_counted_and_skipped_or_refused(tmp_path, caplog):
  folder = tmp_path / "in"
  folder.mkdir()
  (folder / "good.txt").write_text("fine text")
  (folder / "bad.txt").write_bytes(b"caf\xe9 latin-1")
  (folder / "mixed.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
  with caplog.at_level(logging.WARNING, logger="experiments"):
    manifest = prepare(str(folder), "bytes", str(tmp_path / "out"), val_fraction=0.5,
                       progress=False)
  assert manifest["skipped_bad_utf8"] == 2 and manifest["docs"] == 2
  assert "skipped 2 document(s) that are not UTF-8" in caplog.text
  refused("bad.txt is not UTF-8 text .byte 3.", prepare, str(folder), "bytes",
          str(tmp_path / "out2"), on_bad_utf8="error", progress=False)
  refused("on_bad_utf8='drop'", prepare, str(folder), "bytes", str(tmp_path / "o3"),
          on_bad_utf8="drop", progress=False)


def test_empty_inputs_are_refused(tmp_path):
  (tmp_path / "empty").mkdir()
  refused("names no input file", prepare, str(tmp_path / "empty"), "bytes",
          str(tmp_path / "o"), progress=False)
  refused("is not a file, a folder", prepare, str(tmp_path / "nowhere"), "bytes",
          str(tmp_path / "o"), progress=False)
  refused("matches no file", prepare, str(tmp_path / "*.parquet"), "bytes",
          str(tmp_path / "o"), progress=False)
  (tmp_path / "blank.jsonl").write_text("\n\n")
  refused("hold no document", prepare, str(tmp_path / "blank.jsonl"), "bytes",
          str(tmp_path / "o"), progress=False)
  refused("no tokenizer.json there", prepare, str(tmp_path / "blank.jsonl"),
          str(tmp_path / "empty"), str(tmp_path / "o"), progress=False)


def test_a_shard_whose_digest_does_not_match_is_refused(tmp_path):
  out, _ = small(tmp_path)
  TokenCorpus(out)
  tokens = fmt.part_path(out, 2, "tokens")
  data = bytearray(tokens.read_bytes())
  data[0] ^= 1
  tokens.write_bytes(bytes(data))
  refused("shard 00002: 00002.tokens does not match the digest", TokenCorpus, out)
  fmt.part_path(out, 3, "offsets").unlink()
  refused("00003.offsets is missing", TokenCorpus, out, verify=False)


def test_a_manifest_from_another_tokenizer_is_refused(corpus_inputs, tmp_path):
  _, _, tokenizer = corpus_inputs
  out, manifest = small(tmp_path, tokenizer=str(tokenizer))
  check_tokenizer(manifest, manifest["tokenizer"]["sha256"])
  message = refused("tokenized with tokenizer .* not the model's bytes", check_tokenizer,
                    manifest, "bytes", 256)
  assert "vocabulary 320" in message and "vocabulary 256" in message


def test_a_newer_format_version_is_refused(tmp_path):
  out, manifest = small(tmp_path)
  (out / fmt.MANIFEST).write_text(json.dumps(manifest | {"format_version": 99}))
  refused("format version 99, newer than this code reads .1.", TokenCorpus, out)
  refused("format version 99", prepare, str(tmp_path / "txt"), "bytes", str(out),
          progress=False)
  assert json.loads((out / fmt.MANIFEST).read_text())["format_version"] == 99   # kept
  (out / fmt.MANIFEST).unlink()
  refused("an unfinished prepare-data run", TokenCorpus, out)
