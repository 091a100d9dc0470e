"""prepare / train_tokenizer: ids equal the tokenizers package's, splits, workers, resume."""

import filecmp
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokens_inputs import VAL_FRACTION, texts, write_inputs

from experiments.data.tokens import TokenCorpus, describe, prepare, train_tokenizer
from experiments.data.tokens import format as fmt
from experiments.data.tokens.prepare import is_validation_doc, tokenizer_texts


def shard_docs(out, shard):
  arrays = fmt.open_shard(Path(out), shard)
  o = arrays["offsets"]
  return [np.asarray(arrays["tokens"][o[i]:o[i + 1]]) for i in range(shard["docs"])], \
      np.asarray(arrays["val"], bool)


def same_tree(a, b):
  """Every file under a and b, byte for byte (temporary files included)."""
  names = sorted(p.relative_to(a) for p in Path(a).rglob("*") if p.is_file())
  assert names == sorted(p.relative_to(b) for p in Path(b).rglob("*") if p.is_file())
  for name in names:
    assert filecmp.cmp(Path(a) / name, Path(b) / name, shallow=False), name


@pytest.fixture(scope="module")
def prepared(corpus_inputs, tmp_path_factory):
  spec, files, tokenizer = corpus_inputs
  out = tmp_path_factory.mktemp("prepared")
  manifest = prepare(spec, str(tokenizer), str(out), val_fraction=VAL_FRACTION, progress=False)
  return out, manifest


def test_ids_equal_the_tokenizers_encoding(corpus_inputs, prepared):
  spec, files, tokenizer = corpus_inputs
  out, manifest = prepared
  tok = Tokenizer.from_file(str(tokenizer))
  eos = tok.token_to_id("<|endoftext|>")
  assert manifest["tokenizer"]["eos"] == {"id": eos, "token": "<|endoftext|>"}
  assert [s["path"] for s in manifest["sources"]] == sorted(files)
  tokens = 0
  for shard in manifest["shards"]:
    docs, val = shard_docs(out, shard)
    want = files[shard["source"]]
    assert len(docs) == len(want) == shard["docs"]
    for ids, text, is_val in zip(docs, want, val, strict=True):
      assert ids.dtype == np.uint16
      assert ids.tolist() == tok.encode(text, add_special_tokens=False).ids + [eos]
      assert is_val == is_validation_doc(text.encode(), VAL_FRACTION)
      tokens += ids.size
  assert tokens == manifest["tokens"] == manifest["train_tokens"] + manifest["val_tokens"]
  assert manifest["docs"] == sum(len(d) for d in files.values())
  assert 0 < manifest["val_docs"] < manifest["docs"]
  # One document, one split: equal texts never sit on both sides.
  split = {}
  for shard in manifest["shards"]:
    for text, is_val in zip(files[shard["source"]], shard_docs(out, shard)[1], strict=True):
      assert split.setdefault(text, is_val) == is_val


def test_bytes_tokenizer_writes_the_utf8_bytes(corpus_inputs, tmp_path):
  spec, files, _ = corpus_inputs
  manifest = prepare(spec, "bytes", str(tmp_path), val_fraction=VAL_FRACTION, progress=False)
  assert manifest["tokenizer"] == describe("bytes").to_json()
  assert manifest["tokenizer"]["vocab_size"] == 256 and manifest["tokenizer"]["eos"] is None
  for shard in manifest["shards"]:
    docs, _ = shard_docs(tmp_path, shard)
    assert [d.tobytes() for d in docs] == [
        np.frombuffer(t.encode(), np.uint8).astype(np.uint16).tobytes()
        for t in files[shard["source"]]]


def test_workers_and_reruns_give_the_same_bytes(corpus_inputs, prepared, tmp_path):
  spec, _, tokenizer = corpus_inputs
  out, manifest = prepared
  again = prepare(spec, str(tokenizer), str(tmp_path), workers=2, val_fraction=VAL_FRACTION,
                  progress=False)
  assert again == manifest
  same_tree(out, tmp_path)
  # A rerun keeps every finished shard: no file is rewritten.
  before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.suffix != ".json"}
  prepare(spec, str(tokenizer), str(tmp_path), val_fraction=VAL_FRACTION, progress=False)
  assert before == {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.suffix != ".json"}


def test_a_shard_without_its_done_record_is_redone(corpus_inputs, prepared, tmp_path):
  spec, _, tokenizer = corpus_inputs
  out, _ = prepared
  prepare(spec, str(tokenizer), str(tmp_path), val_fraction=VAL_FRACTION, progress=False)
  # A crash between renames: the tokens file is short and no done-record was written.
  fmt.done_path(tmp_path, 1).unlink()
  tokens = fmt.part_path(tmp_path, 1, "tokens")
  tokens.write_bytes(tokens.read_bytes()[:3])
  (tmp_path / fmt.MANIFEST).unlink()
  prepare(spec, str(tokenizer), str(tmp_path), val_fraction=VAL_FRACTION, progress=False)
  same_tree(out, tmp_path)
  # Other settings (here the split) redo every shard rather than mix two runs.
  other = prepare(spec, str(tokenizer), str(tmp_path), val_fraction=0.5, progress=False)
  assert other["split"]["val_fraction"] == 0.5
  assert fmt.read_done(tmp_path, 0)["settings"]["val_fraction"] == 0.5


_CHILD = """
import sys
from experiments.data.tokens import prepare
if __name__ == "__main__":
  prepare(sys.argv[1], sys.argv[2], sys.argv[3], val_fraction=0.25, workers=2, progress=False)
"""


@pytest.mark.slow
def test_kill_9_during_prepare_then_rerun_gives_identical_shards(corpus_inputs, tmp_path):
  _, _, tokenizer = corpus_inputs
  # Enough larger files that the kill lands mid-run.
  spec, _ = write_inputs(tmp_path / "in", [t * 200 for t in texts(200)])
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  prepare(spec, str(tokenizer), str(straight), val_fraction=0.25, workers=2, progress=False)
  script = tmp_path / "child.py"
  script.write_text(_CHILD)
  child = subprocess.Popen([sys.executable, str(script), spec, str(tokenizer), str(killed)],
                           start_new_session=True, cwd=os.getcwd())
  deadline = time.monotonic() + 120
  while not fmt.done_path(killed, 3).exists():
    assert child.poll() is None, "prepare ended before it could be killed"
    assert time.monotonic() < deadline
    time.sleep(0.005)
  os.killpg(child.pid, signal.SIGKILL)   # the parent and its workers, at once
  child.wait()
  assert not (killed / fmt.MANIFEST).exists()
  shards = len(list((straight / fmt.SHARDS).glob("*.done.json")))
  assert sum(fmt.read_done(killed, i) is not None for i in range(shards)) < shards
  prepare(spec, str(tokenizer), str(killed), val_fraction=0.25, workers=2, progress=False)
  for tmp in killed.rglob("*.tmp"):   # what the kill left half-written stays unused
    tmp.unlink()
  same_tree(straight, killed)


def test_train_tokenizer_is_deterministic(tmp_path):
  docs = texts(60)
  a = train_tokenizer(iter(docs), str(tmp_path / "a"), vocab_size=300)
  b = train_tokenizer(iter(docs), str(tmp_path / "b.json"), vocab_size=300)
  assert a.name == "tokenizer.json" and b.name == "b.json"
  assert a.read_bytes() == b.read_bytes()
  info = describe(str(tmp_path / "a"))   # a directory holding tokenizer.json
  assert info.vocab_size == 300 and info.eos_id == 0
  assert json.loads(a.read_text())["pre_tokenizer"]["type"] == "ByteLevel"


def test_tokenizer_texts_are_the_training_split(corpus_inputs):
  spec, files, _ = corpus_inputs
  got = list(tokenizer_texts(spec, val_fraction=VAL_FRACTION))
  want = [t for path in sorted(files) for t in files[path]
          if not is_validation_doc(t.encode(), VAL_FRACTION)]
  assert got == want
  first = next(tokenizer_texts(""))   # the embedded standard-library corpus
  assert isinstance(first, str) and first


def test_the_corpus_maps_its_shards(prepared):
  out, manifest = prepared
  corpus = TokenCorpus(out)
  assert isinstance(corpus.train_docs._shards[0], np.memmap)
  assert len(corpus.train_docs) == manifest["train_docs"]
  assert corpus.val_docs.tokens == manifest["val_tokens"]
  assert corpus.vocab_size == 320


@pytest.mark.parametrize("workers", [1, 2])
def test_the_progress_line_counts_new_tokens(corpus_inputs, tmp_path, capsys, workers):
  spec, files, tokenizer = corpus_inputs
  manifest = prepare(spec, str(tokenizer), str(tmp_path), workers=workers,
                     val_fraction=VAL_FRACTION)
  n = len(files)
  err = capsys.readouterr().err
  assert f"prepare-data: {n}/{n} files, {manifest['tokens']:,} new tokens, " in err
  assert err.count(f"prepare-data: {n}/{n} files") == 1, err   # the last line once
  prepare(spec, str(tokenizer), str(tmp_path), workers=workers, val_fraction=VAL_FRACTION)
  assert f"prepare-data: {n}/{n} files, 0 new tokens, 0 tokens/s" in capsys.readouterr().err
