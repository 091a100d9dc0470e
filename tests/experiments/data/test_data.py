"""Data: stable split, packing with segment ids, deterministic and resumable batches."""

import json
import re

import numpy as np
import pytest

from experiments.data import (
    CorpusSpec,
    TrainIterator,
    eval_batches,
    is_validation,
    list_files,
    load_corpus,
    num_rows,
    pack_row,
    reference_rows,
    split_files,
    stream_offsets,
    write_manifest,
)


def _docs(lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, 256, n).astype(np.uint8) for n in lengths]


@pytest.mark.parametrize("seq_len", [1, 5, 16])
def test_pack_row_matches_reference(seq_len):
  docs = _docs([7, 0, 23, 1, 40, 3, 0, 12])
  order = np.asarray([3, 0, 5, 1, 7, 2, 6, 4])
  offsets = stream_offsets(np.asarray([docs[i].size for i in order]))
  expected = reference_rows(docs, order, seq_len)
  assert len(expected) == num_rows(offsets[-1], seq_len)
  for r, want in enumerate(expected):
    got = pack_row(docs, order, offsets, r, seq_len)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=f"row {r} {key}")


def test_packing_structure():
  docs = [np.full(5, 10, np.uint8), np.full(3, 20, np.uint8), np.full(9, 30, np.uint8)]
  order = np.arange(3)
  offsets = stream_offsets(np.asarray([5, 3, 9]))
  row = pack_row(docs, order, offsets, 0, 8)  # bytes 0..8 of the stream
  np.testing.assert_array_equal(row["inputs"], [10] * 5 + [20] * 3)
  np.testing.assert_array_equal(row["targets"], [10] * 4 + [20] * 3 + [30])
  np.testing.assert_array_equal(row["segment_ids"], [1] * 5 + [2] * 3)
  np.testing.assert_array_equal(row["positions"], [0, 1, 2, 3, 4, 0, 1, 2])
  # Targets that start a new document are not predictable: masked.
  np.testing.assert_array_equal(row["loss_mask"], [1, 1, 1, 1, 0, 1, 1, 0])
  row = pack_row(docs, order, offsets, 1, 8)  # bytes 8..16: doc 2 only
  np.testing.assert_array_equal(row["segment_ids"], [1] * 8)
  np.testing.assert_array_equal(row["positions"], np.arange(8))
  assert row["loss_mask"].all()
  with pytest.raises(IndexError, match="row=2"):
    pack_row(docs, order, offsets, 2, 8)


def test_rows_tile_the_stream():
  """Inputs of consecutive rows plus the last target reproduce the stream."""
  docs = _docs([11, 30, 2, 19])
  order = np.asarray([2, 0, 3, 1])
  offsets = stream_offsets(np.asarray([docs[i].size for i in order]))
  rows = [pack_row(docs, order, offsets, r, 7) for r in range(num_rows(offsets[-1], 7))]
  rebuilt = np.concatenate([r["inputs"] for r in rows] + [rows[-1]["targets"][-1:]])
  stream = np.concatenate([docs[i] for i in order]).astype(np.int32)
  np.testing.assert_array_equal(rebuilt, stream[:rebuilt.size])


def test_split_is_stable_and_per_file():
  paths = [f"pkg{i // 10}/mod{i}.py" for i in range(400)]
  spec = CorpusSpec(val_fraction=0.1)
  train, val = split_files(paths, spec)
  assert split_files(paths, spec) == (train, val)
  assert 20 <= len(val) <= 60  # ~10% by hash
  # A file's split depends on its path alone: dropping other files keeps it.
  train2, val2 = split_files(paths[::3], spec)
  assert set(val2) == set(val) & set(paths[::3])


@pytest.mark.parametrize("path, fraction", [
    ("os.py", 0.8509), ("json/decoder.py", 0.2312), ("email/mime/text.py", 0.5674)])
def test_split_hash_pinned(path, fraction):
  """The split must never change: sha256(path)[:8] / 2**64 pinned to 4 digits."""
  assert not is_validation(path, fraction - 1e-4)
  assert is_validation(path, fraction + 1e-4)


def test_stdlib_corpus_excludes_tests():
  files = list_files(CorpusSpec())
  assert "os.py" in files and "json/decoder.py" in files
  for path in files:
    parts = path.split("/")
    assert not {"test", "tests", "idle_test"} & set(parts[:-1]), path
    assert parts[0] != "site-packages" and path.endswith(".py")


def test_folder_corpus_and_manifest(tmp_path):
  root = tmp_path / "texts"
  (root / "sub").mkdir(parents=True)
  for i in range(30):
    (root / "sub" / f"f{i}.txt").write_text(f"hello {i} " * (i + 3))
  (root / "image.bin").write_bytes(b"\x89PNG\0\0binary")
  (root / ".hidden.txt").write_text("secret")
  spec = CorpusSpec(source="folder", path=str(root), val_fraction=0.2)
  corpus = load_corpus(spec)
  names = set(corpus.train_paths) | set(corpus.val_paths)
  assert names == {f"sub/f{i}.txt" for i in range(30)}
  assert corpus.val_paths and corpus.train_paths
  path = write_manifest(corpus, tmp_path / "run")
  manifest = json.loads(path.read_text())
  assert manifest["train_bytes"] == corpus.train_bytes > 0
  assert manifest["val_bytes"] == corpus.val_bytes > 0
  assert len(manifest["files"]) == 30
  assert manifest == load_corpus(spec).manifest  # same files, same hashes
  (root / "sub" / "f0.txt").write_text("changed")
  changed = load_corpus(spec).manifest
  assert changed["file_list_sha256"] != manifest["file_list_sha256"]
  assert changed["content_sha256"] != manifest["content_sha256"]
  with pytest.raises(ValueError, match="path"):
    CorpusSpec(source="folder")


def _tiny_corpus(max_files=6):
  return load_corpus(CorpusSpec(max_files=max_files))


def test_train_batches_deterministic_and_resumable():
  corpus = _tiny_corpus()
  make = lambda seed: TrainIterator(corpus, seq_len=16, batch_size=3, seed=seed, prefetch=2)
  a, b = make(0), make(0)
  first = [next(a)["inputs"] for _ in range(5)]
  for x in first:
    np.testing.assert_array_equal(x, next(b)["inputs"])
  assert not np.array_equal(first[0], next(iter(make(1)))["inputs"])
  state = a.get_state()
  json.dumps(state)  # the checkpoint stores it as JSON
  expected = [next(a) for _ in range(3)]
  resumed = make(0)
  resumed.set_state(json.loads(json.dumps(state)))
  for want in expected:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
  other = TrainIterator(corpus, seq_len=32, batch_size=3, seed=0)
  with pytest.raises(ValueError, match="different data"):
    other.set_state(state)


def test_a_process_reads_only_its_rows_of_every_batch():
  """Processes split every global batch by rows: together the whole batch, each its
  block, in the same order, and a state saved from the whole stream resumes a block."""
  corpus = _tiny_corpus()
  whole = TrainIterator(corpus, seq_len=16, batch_size=6, seed=3, prefetch=0)
  parts = [TrainIterator(corpus, seq_len=16, batch_size=6, seed=3, prefetch=0, rows=r)
           for r in ((0, 2), (2, 6))]
  for _ in range(3):
    batch = next(whole)
    got = [next(p) for p in parts]
    for key in batch:
      np.testing.assert_array_equal(np.concatenate([g[key] for g in got]), batch[key])
  state = whole.get_state()
  resumed = TrainIterator(corpus, seq_len=16, batch_size=6, seed=3, prefetch=0, rows=(2, 6))
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["inputs"], next(whole)["inputs"][2:6])
  with pytest.raises(ValueError, match="rows=\\(4, 9\\)"):
    TrainIterator(corpus, seq_len=16, batch_size=6, seed=3, rows=(4, 9))


def test_each_epoch_is_a_permutation_of_rows():
  corpus = _tiny_corpus(max_files=3)
  it = TrainIterator(corpus, seq_len=64, batch_size=1, seed=7, prefetch=0)
  n = it.rows_per_epoch
  epochs = [[next(it)["inputs"][0].tobytes() for _ in range(n)] for _ in range(2)]
  assert epochs[0] != epochs[1]  # reshuffled
  for e, rows in enumerate(epochs):
    order, _, _ = it.source._epoch(e)
    want = [r["inputs"].tobytes() for r in reference_rows(corpus.train_docs, order, 64)]
    assert sorted(rows) == sorted(want)


def test_eval_batches_padded_and_fixed():
  corpus = _tiny_corpus()
  batches = eval_batches(corpus, seq_len=16, batch_size=4, max_batches=1000)
  rows = num_rows(corpus.val_bytes, 16)
  assert len(batches) == -(-rows // 4)
  assert all(b["inputs"].shape == (4, 16) for b in batches)
  pad = len(batches) * 4 - rows
  if pad:
    assert not batches[-1]["loss_mask"][-pad:].any()
    assert not batches[-1]["segment_ids"][-pad:].any()
  again = eval_batches(corpus, seq_len=16, batch_size=4, max_batches=1000)
  np.testing.assert_array_equal(batches[0]["inputs"], again[0]["inputs"])


def test_corpus_spec_from_an_experiment_config(tmp_path):
  import ml_collections

  from experiments.data import corpus_spec
  data = dict(path="", val_fraction=0.2, max_files=3)
  config = ml_collections.ConfigDict({"data": data})
  assert corpus_spec(config) == CorpusSpec(source="stdlib", val_fraction=0.2, max_files=3)
  config.data.path = str(tmp_path)
  assert corpus_spec(config) == CorpusSpec(source="folder", path=str(tmp_path),
                                           val_fraction=0.2, max_files=3)


# --- a resumed run refuses a changed corpus ---------------------------------------------------


def _folder(root, n=12):
  (root / "sub").mkdir(parents=True)
  for i in range(n):
    (root / "sub" / f"f{i}.txt").write_text(f"def f{i}(x):\n  return x + {i}\n" * (i + 20))
  return root


def test_a_changed_corpus_is_refused_on_resume_naming_what_changed(tmp_path):
  from experiments.data import CorpusChangedError, record_manifest
  spec = CorpusSpec(source="folder", path=str(_folder(tmp_path / "texts")), val_fraction=0.2)
  run = tmp_path / "run"
  record_manifest(load_corpus(spec), run)
  # Before the first checkpoint there is nothing to resume: a new corpus is just recorded.
  (tmp_path / "texts" / "sub" / "f0.txt").write_text("edited before any step")
  record_manifest(load_corpus(spec), run)
  (run / "checkpoints" / "4").mkdir(parents=True)
  before = (run / "corpus_manifest.json").read_text()
  record_manifest(load_corpus(spec), run)   # the same corpus resumes quietly
  assert (run / "corpus_manifest.json").read_text() == before

  texts = tmp_path / "texts" / "sub"
  (texts / "f1.txt").write_text("edited")
  (texts / "f2.txt").unlink()
  (texts / "new.txt").write_text("added " * 50)
  with pytest.raises(CorpusChangedError) as refused:
    record_manifest(load_corpus(spec), run)
  message = str(refused.value)
  assert "\n" not in message and "data.allow_corpus_change" in message and "step 4" in message
  for what, name in (("added", "new.txt"), ("removed", "f2.txt"), ("edited", "f1.txt")):
    assert re.search(rf"\d file\(s\) {what} \([^)]*sub/{name}", message), (what, message)
  assert (run / "corpus_manifest.json").read_text() == before   # the record is kept

  record_manifest(load_corpus(spec), run, allow_change=True)
  assert (run / "corpus_manifest.4.json").read_text() == before
  assert json.loads((run / "corpus_manifest.json").read_text()) == load_corpus(spec).manifest


@pytest.mark.slow
def test_train_refuses_a_changed_corpus_and_keeps_both_manifests_when_allowed(tmp_path,
                                                                            capsys):
  """`lngram-exp train` on data.path=F, F edited, the same command: one `error:` line and
  exit 2; with --config.data.allow_corpus_change=true it resumes and both manifests stay.
  The commands run in this process (the resumed run reuses the first one's compiles)."""
  from experiments.cli import run_main
  texts = _folder(tmp_path / "texts")
  workdir = tmp_path / "run"
  command = ["lngram-exp", "train", "--config=experiments/configs/lm_baseline.py:smoke",
             f"--workdir={workdir}", f"--config.data.path={texts}", "--config.data.val_fraction=0.3",
             "--config.train.steps=2", "--config.train.ckpt_every=2",
             "--config.train.eval_every=2", "--config.train.progress=False"]
  assert run_main(command) == 0, capsys.readouterr().err[-3000:]
  manifest = (workdir / "corpus_manifest.json").read_text()
  (texts / "sub" / "f3.txt").write_text("one edited file")
  capsys.readouterr()
  assert run_main(command) == 2
  stderr = capsys.readouterr().err
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "1 file(s) edited (sub/f3.txt)" in errors[0], stderr
  assert (workdir / "corpus_manifest.json").read_text() == manifest
  assert run_main([*command, "--config.data.allow_corpus_change=true"]) == 0, \
      capsys.readouterr().err[-3000:]
  assert (workdir / "corpus_manifest.2.json").read_text() == manifest
  assert json.loads((workdir / "corpus_manifest.json").read_text())["files"] != json.loads(
      manifest)["files"]
