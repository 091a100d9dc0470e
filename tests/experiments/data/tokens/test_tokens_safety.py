"""prepare-data and train-tokenizer as careless users run them: a rerun into a folder of
its inputs, one file named twice, an --out that holds other files, kill -9 of the main
process, two runs into one --out, a very long document, a tiny corpus for a large
vocabulary, JSON lines named .json, and the one-line messages of those mistakes."""

import fcntl
import importlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import numpy as np
import pytest
from tokenizers import Tokenizer
from tokens_inputs import VAL_FRACTION, texts

from experiments.cli import run_main
from experiments.data.tokens import (
    TokenCorpus,
    TokenDataError,
    describe,
    prepare,
    train_tokenizer,
)
from experiments.data.tokens import format as fmt
from experiments.data.tokens import run as token_run
from experiments.data.tokens import tokenizer as tok_module
from experiments.data.tokens.prepare import is_validation_doc
from experiments.data.tokens.tokenizer import Encoder, cut_points, is_word_boundary

ROOT = Path(__file__).resolve().parents[4]
# The module (the package's `prepare` attribute is the function of that name).
prep_module = importlib.import_module("experiments.data.tokens.prepare")


def refused(match, fn, *args, **kwargs):
  with pytest.raises(TokenDataError, match=match) as info:
    fn(*args, **kwargs)
  assert "\n" not in str(info.value)
  return str(info.value)


def txt_folder(folder, n=12):
  folder.mkdir(parents=True, exist_ok=True)
  for i, text in enumerate(texts(n)):
    (folder / f"{i:03d}.txt").write_text(text)
  return folder


def files_of(folder):
  """{relative path: bytes} of every file under `folder`."""
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*"))
          if p.is_file()}


def cli(*args):
  return run_main(["lngram-exp", *args])


# D1: the output is never read back as input.

def test_a_rerun_into_a_folder_of_its_inputs_reads_only_the_inputs(corpus_inputs, tmp_path):
  _, _, tokenizer = corpus_inputs
  corpus = txt_folder(tmp_path / "corpus")
  out = corpus / "prepared"
  first = prepare(str(corpus), str(tokenizer), str(out), val_fraction=VAL_FRACTION,
                  progress=False)
  assert first["docs"] == 12 and (out / "tokenizer.json").is_file()
  # The rerun docs/training.md asks for after a kill: the same manifest, not its own files as text.
  again = prepare(str(corpus), str(tokenizer), str(out), val_fraction=VAL_FRACTION,
                  progress=False)
  assert again == first
  # A glob that reaches into the output skips it too.
  globbed = prepare(f"{corpus}/**", str(tokenizer), str(out), val_fraction=VAL_FRACTION,
                    progress=False)
  assert globbed == first
  assert not any(str(out) in s["path"] for s in globbed["sources"])


def test_an_out_that_is_or_holds_an_input_is_refused(tmp_path):
  raw = txt_folder(tmp_path / "data" / "raw")
  before = files_of(tmp_path)
  for inputs, out, says in [
      (raw, raw, "is --out="),                          # the input folder itself
      (raw, tmp_path / "data", "is inside --out="),     # the output would hold the input
      (raw / "001.txt", raw, "is inside --out="),
      (f"{raw}/*.txt", raw, "is inside --out="),        # every match is inside
  ]:
    message = refused(says, prepare, str(inputs), "bytes", str(out), progress=False)
    assert "outside the inputs" in message
  assert files_of(tmp_path) == before   # nothing written


def test_train_tokenizer_into_a_folder_of_its_inputs_reruns_identically(tmp_path, capsys):
  corpus = txt_folder(tmp_path / "corpus", 40)
  args = ("train-tokenizer", f"--input={corpus}", "--vocab_size=300", f"--out={corpus}")
  assert cli(*args) == 0
  first = (corpus / "tokenizer.json").read_bytes()
  assert cli(*args) == 0, capsys.readouterr().err   # tokenizer.json is not a training text
  assert (corpus / "tokenizer.json").read_bytes() == first


# D8a: a file is read once, however it is named.

def test_one_file_named_several_ways_is_read_once(tmp_path, monkeypatch):
  folder = txt_folder(tmp_path / "in", 5)
  with open(folder / "a.jsonl", "w") as f:
    for text in texts(7):
      f.write(json.dumps({"text": text}) + "\n")
  (tmp_path / "link.jsonl").symlink_to(folder / "a.jsonl")
  monkeypatch.chdir(tmp_path)
  spec = f"in/a.jsonl,{folder / 'a.jsonl'},./in/a.jsonl,link.jsonl,in/a.jsonl"
  manifest = prepare(spec, "bytes", "o1", val_fraction=0.5, progress=False)
  assert manifest["docs"] == 7 and len(manifest["sources"]) == 1
  # A folder and files inside it.
  manifest = prepare(f"in,in/000.txt,{folder}/001.txt", "bytes", "o2", val_fraction=0.5,
                     progress=False)
  assert manifest["docs"] == 5 + 7 and len(manifest["sources"]) == 6


# D5: never write among other files, never overwrite a tokenizer.json of someone else.

def test_prepare_data_never_writes_among_other_files(corpus_inputs, tmp_path):
  _, _, tokenizer = corpus_inputs
  folder = txt_folder(tmp_path / "in")
  other = train_tokenizer(iter(texts(60)), str(tmp_path / "tok_b"), vocab_size=290)
  hf = tmp_path / "hf"   # a model checkpoint with its own tokenizer
  hf.mkdir()
  (hf / "config.json").write_text("{}")
  shutil.copy(other, hf / "tokenizer.json")
  (tmp_path / "afile").write_text("")
  before = files_of(tmp_path)
  for out, says in [(hf, "is not empty and is not a prepare-data directory"),
                    (other.parent, "is not empty and is not a prepare-data directory"),
                    (tmp_path / "afile", "exists and is not a directory")]:
    refused(says, prepare, str(folder), str(tokenizer), str(out), progress=False)
  assert files_of(tmp_path) == before
  # A prepare-data directory whose tokenizer.json someone replaced: kept, refused.
  data = tmp_path / "data"
  prepare(str(folder), str(tokenizer), str(data), val_fraction=0.5, progress=False)
  shutil.copy(other, data / "tokenizer.json")
  refused("tokenizer.json is not a tokenizer this directory was prepared with", prepare,
          str(folder), str(tokenizer), str(data), val_fraction=0.5, progress=False)
  assert (data / "tokenizer.json").read_bytes() == other.read_bytes()
  # Its own tokenizer.json is replaced by a run with another tokenizer, removed by "bytes".
  shutil.copy(tokenizer, data / "tokenizer.json")
  prepare(str(folder), str(other), str(data), val_fraction=0.5, progress=False)
  assert (data / "tokenizer.json").read_bytes() == other.read_bytes()
  manifest = prepare(str(folder), "bytes", str(data), val_fraction=0.5, progress=False)
  assert manifest["tokenizer"]["kind"] == "bytes" and not (data / "tokenizer.json").exists()


def test_train_tokenizer_never_overwrites_another_tokenizer(tmp_path):
  hf = tmp_path / "hf"
  hf.mkdir()
  theirs = json.dumps({"model": {"type": "theirs"}})
  (hf / "tokenizer.json").write_text(theirs)
  refused("hf/tokenizer.json already holds another tokenizer", train_tokenizer,
          iter(texts(40)), str(hf), vocab_size=300)
  assert files_of(hf) == {"tokenizer.json": theirs.encode()}   # no temporary left either
  path = train_tokenizer(iter(texts(40)), str(tmp_path / "tok"), vocab_size=300)
  first = path.read_bytes()
  assert train_tokenizer(iter(texts(40)), str(tmp_path / "tok"), vocab_size=300) == path
  refused("already holds another tokenizer", train_tokenizer, iter(texts(50)),
          str(tmp_path / "tok"), vocab_size=300)
  assert path.read_bytes() == first


def test_the_cli_refuses_a_foreign_out_in_one_line(corpus_inputs, tmp_path, capsys):
  _, _, tokenizer = corpus_inputs
  folder = txt_folder(tmp_path / "in")
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "tokenizer.json").write_text("{}")
  for args in [("prepare-data", f"--input={folder}", f"--tokenizer={tokenizer}",
                f"--out={hf}"),
               ("train-tokenizer", f"--input={folder}", "--vocab_size=300", f"--out={hf}")]:
    assert cli(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
  assert (hf / "tokenizer.json").read_text() == "{}"


# D8b: workers die with the process that started them.

_CHILD = """
import sys
from experiments.data.tokens import prepare
if __name__ == "__main__":
  prepare(sys.argv[1], "bytes", sys.argv[2], val_fraction=0.25, workers=2, progress=False)
"""


def _stat(pid):
  try:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return {"state": fields[0], "ppid": int(fields[1]), "session": int(fields[3])}


def _alive_in(session, pid):
  stat = _stat(pid)
  return stat is not None and stat["state"] != "Z" and stat["session"] == session


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_kill_9_of_prepare_leaves_no_worker_running(tmp_path):
  folder = tmp_path / "in"
  folder.mkdir()
  for i in range(400):   # many small files: the run lasts well past the first shard
    (folder / f"{i:04d}.txt").write_text(f"document {i} " * 20)
  out = tmp_path / "out"
  script = tmp_path / "child.py"
  script.write_text(_CHILD)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                               "")]))
  child = subprocess.Popen([sys.executable, str(script), str(folder), str(out)], env=env,
                           start_new_session=True)
  workers = []
  try:
    deadline = time.monotonic() + 120
    while not fmt.done_path(out, 0).exists():
      assert child.poll() is None, "prepare ended before it could be killed"
      assert time.monotonic() < deadline
      time.sleep(0.005)
    workers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
               and (_stat(p.name) or {}).get("ppid") == child.pid]
    assert len(workers) >= 2, workers
    os.kill(child.pid, signal.SIGKILL)   # the main process only, as `kill -9 <pid>` does
    child.wait()
    deadline = time.monotonic() + 10
    while any(_alive_in(child.pid, w) for w in workers) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert not [w for w in workers if _alive_in(child.pid, w)], "orphaned workers run on"
    assert not (out / fmt.MANIFEST).exists()
  finally:
    if child.poll() is None:
      child.kill()
      child.wait()
    for w in workers:   # only the processes this test started, by pid
      if _alive_in(child.pid, w):
        os.kill(w, signal.SIGKILL)


# D8c: one run at a time writes into --out.

def test_a_second_prepare_into_the_same_out_is_refused(tmp_path):
  folder = txt_folder(tmp_path / "in")
  out = tmp_path / "out"
  out.mkdir()
  with open(out / fmt.LOCK, "w") as lock:   # a run in progress holds the lock
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.write("4242\n")
    lock.flush()
    message = refused("another prepare-data is writing into", prepare, str(folder), "bytes",
                      str(out), progress=False)
    assert f"into {out} (pid 4242)" in message
    assert os.listdir(out) == [fmt.LOCK]
  # Its holder gone (the kernel drops the lock of a killed process): a run goes through
  # and removes the temporaries of killed runs and its lock file.
  (out / fmt.SHARDS).mkdir()
  (out / fmt.SHARDS / "00000.tokens.999999.tmp").write_bytes(b"half")
  (out / fmt.SHARDS / "00001.tokens.tmp").write_bytes(b"half")
  (out / "manifest.json.999999.tmp").write_text("{")
  manifest = prepare(str(folder), "bytes", str(out), val_fraction=0.5, progress=False)
  assert manifest["docs"] == 12
  assert not list(out.rglob("*.tmp")) and not (out / fmt.LOCK).exists()


def test_two_concurrent_prepares_into_one_out(tmp_path):
  folder = tmp_path / "in"
  folder.mkdir()
  for i in range(150):
    (folder / f"{i:04d}.txt").write_text(f"document {i} " * 50)
  straight = prepare(str(folder), "bytes", str(tmp_path / "straight"), val_fraction=0.25,
                     progress=False)
  out = tmp_path / "out"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                               "")]))
  args = [sys.executable, "-m", "experiments", "prepare-data", f"--input={folder}",
          "--tokenizer=bytes", f"--out={out}", "--val_fraction=0.25"]
  runs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True) for _ in range(2)]
  results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
  for rc, err in results:
    assert rc == 0 or (rc == 2 and err.strip().splitlines()[-1].startswith(
        f"error: another prepare-data is writing into {out} (pid ")), err
  assert 0 in [rc for rc, _ in results]
  assert read_json(out / fmt.MANIFEST) == straight
  assert not list(out.rglob("*.tmp")) and not (out / fmt.LOCK).exists()


def read_json(path):
  return json.loads(Path(path).read_text())


# D10: a long document is encoded in pieces, with the ids of one call.

def tricky_text(lines=300):
  """Lines, blank lines, indents, trailing spaces, CRLF, a long line of words."""
  parts = []
  for i, text in enumerate(texts(lines)):
    parts.append(text.replace("\n", " "))
    parts.append(["", "  indented", "trailing  ", "x.", "\r", "\t", "日本"][i % 7])
  parts.append(" ".join(texts(200)).replace("\n", " "))   # one line of ~4000 words
  return "\n".join(parts) + "\nend"


def test_a_long_document_is_encoded_in_pieces_with_the_ids_of_one_call(corpus_inputs):
  _, _, tokenizer = corpus_inputs
  info = describe(str(tokenizer))
  text = tricky_text()
  want = Tokenizer.from_file(str(tokenizer)).encode(text, add_special_tokens=False).ids
  whole = Encoder(info, piece_chars=10**9).encode([text.encode()])[0]
  assert whole.tolist() == want + [info.eos_id]
  for every in (7, 50, 1000):
    encoder = Encoder(info, piece_chars=every)
    assert encoder.cuttable
    cuts = cut_points(text, every)
    assert len(cuts) >= 10 and any(text[c] == " " for c in cuts)   # in the long line too
    head = text[:every // 2]   # shorter than a piece: one call
    got = encoder.encode([text.encode(), head.encode()])
    assert got[0].tolist() == whole.tolist(), every
    assert got[1].tolist() == Encoder(info, piece_chars=10**9).encode([head.encode()])[0].tolist()


def test_cut_points_fall_between_words():
  text = "one two\nthree  four\n\nfive\n six seven"
  for every in range(6, len(text)):   # no forced cut: whitespace every 4 * 6 characters
    for cut in cut_points(text, every):
      left, right = text[cut - 1], text[cut]
      assert (left == "\n" and not text[cut - 2].isspace() and not right.isspace()) or (
          right == " " and not left.isspace() and not text[cut + 1].isspace()), (every, cut)
      assert is_word_boundary(text, cut)
  assert cut_points("ab\ncd ef", 100) == []   # short: whole
  assert cut_points("a b\nc d", 2, ("\n",)) == [4]   # only the kinds asked for
  # No whitespace for FORCE_AFTER pieces: cut inside the word, pieces stay bounded.
  assert cut_points("x" * 100, 10) == [10, 20, 30, 40, 50, 60]
  assert cut_points("x" * 40, 10) == []


def test_a_stretch_without_whitespace_is_cut_inside_a_word_with_a_warning(
    corpus_inputs, tmp_path, caplog, monkeypatch):
  _, _, tokenizer = corpus_inputs
  text = "some words first\n" + "abcdefghij0123456789" * 40 + "\nthen words"
  (tmp_path / "blob.txt").write_text(text)
  monkeypatch.setattr(tok_module, "PIECE_CHARS", 50)
  monkeypatch.setattr(prep_module, "_ENCODERS", {})
  with caplog.at_level(logging.WARNING, logger="experiments"):
    prepare(str(tmp_path / "blob.txt"), str(tokenizer), str(tmp_path / "out"), val_fraction=0.5,
            progress=False)
  warned = [r.getMessage() for r in caplog.records if "without whitespace" in r.getMessage()]
  forced = [c for c in cut_points(text, 50) if not is_word_boundary(text, c)]
  assert len(forced) > 10 and all(20 <= c < 820 for c in forced)   # in the stretch only
  assert len(warned) == 1 and f"blob.txt: cut {len(forced)} time(s) inside a word" in warned[0]
  assert "over 200 characters" in warned[0]
  shard = read_json(tmp_path / "out" / fmt.MANIFEST)["shards"][0]
  ids = np.asarray(fmt.open_shard(tmp_path / "out", shard)["tokens"]).tolist()
  assert Tokenizer.from_file(str(tokenizer)).decode(ids[:-1]) == text   # nothing lost


def test_tokenizers_are_cut_only_where_their_ids_stay(corpus_inputs, tmp_path):
  """A tokenizer that prepends "▁" to every text changes at a newline cut: it is cut
  only at spaces. One without a pre-tokenizer merges across both: it is never cut."""
  from tokenizers import decoders, models, pre_tokenizers, trainers

  text = tricky_text(40)
  for name, pre, allowed in [("metaspace", pre_tokenizers.Metaspace(prepend_scheme="always"),
                              (" ",)),
                             ("none", None, ())]:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if pre is not None:
      tok.pre_tokenizer = pre
      tok.decoder = decoders.Metaspace(prepend_scheme="always")
    tok.train_from_iterator(texts(80), trainers.BpeTrainer(vocab_size=200,
                                                           special_tokens=["<unk>", "</s>"]))
    (tmp_path / name).mkdir()
    tok.save(str(tmp_path / name / "tokenizer.json"))
    info = describe(str(tmp_path / name))
    encoder = Encoder(info, piece_chars=20)
    assert encoder.seps == allowed, (name, encoder.seps)
    assert encoder.encode([text.encode()])[0].tolist() == \
        tok.encode(text, add_special_tokens=False).ids + [info.eos_id], name


_MEASURE = """
import json, resource, sys
from experiments.data.tokens import prepare
from experiments.data.tokens.prepare import _encoder
from experiments.data.tokens.tokenizer import describe
_encoder(describe(sys.argv[2]))   # the tokenizer loaded: what follows is the document's
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prepare(sys.argv[1], sys.argv[2], sys.argv[3], val_fraction=0.5, progress=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kb": before, "after_kb": after}))
"""


def test_peak_memory_does_not_grow_with_a_long_document(corpus_inputs, tmp_path):
  """An 8 MB single-document file: one call held ~1.1 GB more (~200 bytes a token)."""
  _, _, tokenizer = corpus_inputs
  block = "\n".join(t.replace("\n", " ") for t in texts(120)) + "\n"
  doc = tmp_path / "long.txt"
  doc.write_text(block * (8 * 2**20 // len(block.encode()) + 1))
  script = tmp_path / "measure.py"
  script.write_text(_MEASURE)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                               "")]))
  result = subprocess.run([sys.executable, str(script), str(doc), str(tokenizer),
                           str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          timeout=300, check=True)
  rss = json.loads(result.stdout.strip().splitlines()[-1])
  grown_mb = (rss["after_kb"] - rss["before_kb"]) / 1024
  manifest = read_json(tmp_path / "out" / fmt.MANIFEST)
  assert manifest["docs"] == 1 and manifest["tokens"] > 2_000_000
  assert grown_mb < 300, f"peak RSS grew by {grown_mb:.0f} MB for an 8 MB document"


# D14: the vocabulary trained, not the one asked for.

def test_train_tokenizer_says_how_many_ids_it_trained(tmp_path, capsys):
  folder = txt_folder(tmp_path / "in", 10)
  assert cli("train-tokenizer", f"--input={folder}", "--vocab_size=100000",
             f"--out={tmp_path / 'tok'}") == 0
  captured = capsys.readouterr()
  trained = describe(str(tmp_path / "tok")).vocab_size
  assert trained < 100000
  assert f"done: a byte-level BPE of {trained} ids in" in captured.out
  warnings = [line for line in captured.err.splitlines() if "--vocab_size=100000" in line]
  assert len(warnings) == 1 and f"gave {trained} ids" in warnings[0], captured.err


# D16: JSON lines named .json.

def test_json_lines_named_json_are_warned_about(tmp_path, caplog):
  lines = "".join(json.dumps({"text": t}) + "\n" for t in texts(5))
  (tmp_path / "data.json").write_text(lines)
  (tmp_path / "ok.jsonl").write_text(lines)
  (tmp_path / "plain.txt").write_text("{not json} but text\nmore")
  with caplog.at_level(logging.WARNING, logger="experiments"):
    manifest = prepare(f"{tmp_path}/data.json,{tmp_path}/ok.jsonl,{tmp_path}/plain.txt",
                       "bytes", str(tmp_path / "out"), val_fraction=0.5, progress=False)
  assert manifest["docs"] == 1 + 5 + 1   # the documented rule still holds
  warned = [r.getMessage() for r in caplog.records if "JSON object" in r.getMessage()]
  assert len(warned) == 1 and "data.json" in warned[0] and ".jsonl" in warned[0], warned
  assert "\n" not in warned[0]


# Messages that were one line but misled.

def test_an_unrelated_manifest_is_not_called_a_newer_format(tmp_path):
  folder = txt_folder(tmp_path / "in")
  out = tmp_path / "unrel"
  out.mkdir()
  (out / "manifest.json").write_text(json.dumps({"name": "app", "version": "1.0"}))
  for fn, args in [(prepare, (str(folder), "bytes", str(out))), (TokenCorpus, (out,))]:
    message = refused("is not a prepare-data manifest", fn, *args)
    assert "newer" not in message and "upgrade" not in message


def test_inputs_whose_documents_all_are_not_utf8_say_so(tmp_path):
  (tmp_path / "garbage.bin").write_bytes(b"\xff\xfe\x80 caf\xe9")
  (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "caf\xe9"}\n{"text": "\xe0 la"}\n')
  for name, n in [("garbage.bin", 1), ("latin1.jsonl", 2)]:
    message = refused(f"all {n} document.s. were skipped as not UTF-8 text", prepare,
                      str(tmp_path / name), "bytes", str(tmp_path / f"o_{n}"), progress=False)
    assert "--on_bad_utf8=error" in message


def test_token_data_without_a_validation_document_says_raise_val_fraction(tmp_path):
  text = "a single training document, long enough for rows " * 4
  assert not is_validation_doc(text.encode(), 0.01)
  (tmp_path / "a.txt").write_text(text)
  prepare(str(tmp_path / "a.txt"), "bytes", str(tmp_path / "o"), val_fraction=0.01,
          progress=False)
  config = ml_collections.ConfigDict({
      "model": {"vocab_size": 0}, "init_from": "",
      "data": {"kind": "tokens", "path": str(tmp_path / "o"), "seq_len": 16, "batch_size": 2,
               "seed": 0, "eval_batches": 1, "allow_corpus_change": False,
               "val_doc_cap": 64, "val_budget": 0}})
  for cap in (64, 0):
    config.data.val_doc_cap = cap
    message = refused("validation split holds 0 document", token_run.run_data, config,
                      tmp_path / f"run{cap}")
    assert "larger --val_fraction (it was 0.01)" in message
  assert np.asarray(TokenCorpus(tmp_path / "o").val_docs.length_D).size == 0
