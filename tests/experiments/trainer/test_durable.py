"""Writes that survive a power cut (experiments/trainer/durable.py and its users).

A power cut cannot be caused in a test, so the calls are recorded instead: every
fsync (by the path its descriptor names, from /proc) and every rename. Each
writer must fsync the files, then the folder holding them, rename, then fsync
the parent folder. Readers of what a power cut can leave (an empty or cut-short
file) refuse it in one line naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from experiments.data.tokens import format as fmt
from experiments.data.tokens.prepare import prepare
from experiments.data.tokens.rows import TokenCorpus
from experiments.data.tokens.run import RECORD, check_run
from experiments.hf.atomic_dir import new_directory
from experiments.trainer import durable, writers


@pytest.fixture
def calls(monkeypatch):
  """The list of ("fsync", path) and ("rename", source, target) calls, in order."""
  seen = []
  fsync, rename, replace = os.fsync, os.rename, os.replace

  def record_fsync(fd):
    seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
    return fsync(fd)

  def record_rename(source, target, *a, **k):
    seen.append(("rename", str(source), str(target)))
    return rename(source, target, *a, **k)

  def record_replace(source, target, *a, **k):
    seen.append(("rename", str(source), str(target)))
    return replace(source, target, *a, **k)

  monkeypatch.setattr(os, "fsync", record_fsync)
  monkeypatch.setattr(os, "rename", record_rename)
  monkeypatch.setattr(os, "replace", record_replace)
  return seen


def _index(calls, call) -> int:
  assert call in calls, (call, calls)
  return calls.index(call)


def test_a_directory_is_fsynced_files_then_folders_then_renamed_then_its_parent(tmp_path,
                                                                                   calls):
  """export-hf's and import-hf's writer (`new_directory`)."""
  final = tmp_path / "out"
  with new_directory(final, "out", "export-hf", "checkpoint") as tmp:
    (tmp / "config.json").write_text("{}")
    (tmp / "sub").mkdir()
    (tmp / "sub" / "model.safetensors").write_bytes(b"x" * 10)
  tmp = str(tmp)
  rename = _index(calls, ("rename", tmp, str(final)))
  files = [_index(calls, ("fsync", f"{tmp}/config.json")),
           _index(calls, ("fsync", f"{tmp}/sub/model.safetensors"))]
  sub, folder = _index(calls, ("fsync", f"{tmp}/sub")), _index(calls, ("fsync", tmp))
  parent = _index(calls, ("fsync", str(tmp_path)))
  assert max(files) < sub < folder < rename < parent, calls
  assert (final / "sub" / "model.safetensors").read_bytes() == b"x" * 10


def test_a_file_is_fsynced_renamed_then_its_folder(tmp_path, calls):
  """The single-file writers: durable.write_text (run config, metrics rewrite, corpus
  manifest, lm-eval results) and prepare-data's write_json_atomic."""
  for write in (lambda p: durable.write_text(p, "{}"), lambda p: fmt.write_json_atomic(p, {})):
    calls.clear()
    path = tmp_path / "f.json"
    write(path)
    (kind, tmp), rename = calls[0], calls[1]
    assert kind == "fsync" and rename == ("rename", tmp, str(path)), calls
    assert calls[2] == ("fsync", str(tmp_path)) and json.loads(path.read_text()) == {}


def test_prepare_data_syncs_each_shard_before_its_done_record(tmp_path, calls):
  """Shard files fsynced, renamed, the shards folder fsynced, and only then the
  done-record (which says the shard is complete) and, last, the manifest."""
  source = tmp_path / "in.txt"
  source.write_text("hello world\n")
  out = tmp_path / "data"
  prepare(str(source), "bytes", str(out), progress=False)
  shards = str(out / fmt.SHARDS)
  tokens = _index(calls, ("fsync", f"{shards}/00000.tokens.{os.getpid()}.tmp"))
  renamed = [i for i, c in enumerate(calls) if c[0] == "rename" and c[2].startswith(shards)
             and not c[2].endswith(".json")]
  folder = _index(calls, ("fsync", shards))
  done = next(i for i, c in enumerate(calls) if c[0] == "rename"
              and c[2].endswith("00000.done.json"))
  manifest = next(i for i, c in enumerate(calls) if c[0] == "rename"
                  and c[2] == str(out / fmt.MANIFEST))
  assert tokens < min(renamed) and max(renamed) < folder < done < manifest, calls
  assert calls[manifest + 1] == ("fsync", str(out))


def test_metrics_are_fsynced_with_each_checkpoint(tmp_path, calls):
  writer = writers.MetricsWriter(tmp_path)
  writer.write(1, {"train/loss": 2.0})
  calls.clear()
  writer.sync()
  assert calls == [("fsync", str(tmp_path / writers.METRICS_FILE))]
  writer.close()


def test_an_empty_or_cut_json_file_is_one_line_naming_it(tmp_path):
  path = tmp_path / "x.json"
  for data, why in ((b"", "is empty"), (b'{"a": [1, 2', "not whole JSON")):
    path.write_bytes(data)
    with pytest.raises(ValueError, match=why) as e:
      durable.read_json(path, "record")
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


def test_readers_refuse_what_a_power_cut_leaves(tmp_path):
  """A token run's record emptied, a shard cut short (read without its digests), a
  metrics file whose last line was cut: one line each, or the cut line left out."""
  source = tmp_path / "in.txt"
  source.write_text("hello world, some text\n" * 20)
  data = tmp_path / "data"
  prepare(str(source), "bytes", str(data), progress=False)
  run = tmp_path / "run"
  (run / "checkpoints" / "4").mkdir(parents=True)   # a run with a saved step
  (run / RECORD).write_bytes(b"")
  with pytest.raises(ValueError, match="token-data record is empty") as e:
    check_run(TokenCorpus(data), run)
  assert str(e.value).startswith(str(run / RECORD)) and "\n" not in str(e.value)

  tokens = fmt.part_path(data, 0, "tokens")
  tokens.write_bytes(tokens.read_bytes()[:-10])
  with pytest.raises(fmt.TokenDataError, match="not its manifest's") as e:
    TokenCorpus(data, verify=False)
  assert "\n" not in str(e.value)

  (run / writers.METRICS_FILE).write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
  assert writers.read_metrics(run) == [{"step": 1, "x": 1.0}]
  (run / writers.METRICS_FILE).write_text('{"step": 1, "x\n{"step": 2, "x": 1.0}\n')
  with pytest.raises(ValueError, match="line 1: not a JSON object"):
    writers.read_metrics(run)


def test_prepare_data_names_the_file_and_the_flag_on_a_full_disk(tmp_path, monkeypatch):
  """ENOSPC while a shard is written: one line naming the shard file and --out, and
  no temporary file left behind."""
  source = tmp_path / "in.txt"
  source.write_text("hello world\n")
  out = tmp_path / "data"
  fsync = os.fsync

  def full(fd):
    if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
      raise OSError(28, "No space left on device")
    return fsync(fd)

  monkeypatch.setattr(os, "fsync", full)
  with pytest.raises(fmt.TokenDataError) as e:
    prepare(str(source), "bytes", str(out), progress=False)
  text = str(e.value)
  assert text.startswith(f"{out}/shards/00000.tokens: no space left on device"), text
  assert f"--out={out}" in text and "\n" not in text
  assert not list(Path(out, fmt.SHARDS).glob("*.tmp"))
  assert np.all([p.suffix != ".tmp" for p in Path(out).rglob("*")])
