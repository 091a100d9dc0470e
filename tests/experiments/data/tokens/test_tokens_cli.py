"""`lngram-exp prepare-data` and `train-tokenizer`: results on stdout, mistakes one line, exit 2."""

import json

from tokens_inputs import texts

from experiments.cli import run_main


def cli(*args):
  return run_main(["lngram-exp", *args])


def test_train_tokenizer_then_prepare_data(tmp_path, capsys):
  folder = tmp_path / "in"
  folder.mkdir()
  for i, text in enumerate(texts(40)):
    (folder / f"{i}.txt").write_text(text)
  assert cli("train-tokenizer", f"--input={folder}", "--vocab_size=300",
             f"--out={tmp_path / 'tok'}") == 0
  assert "a byte-level BPE of 300 ids" in capsys.readouterr().out
  assert cli("prepare-data", f"--input={folder}", f"--tokenizer={tmp_path / 'tok'}",
             f"--out={tmp_path / 'data'}", "--workers=2", "--val_fraction=0.25") == 0
  out = capsys.readouterr().out
  manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
  assert f"done: {manifest['docs']:,} documents" in out and "vocabulary 300" in out
  assert manifest["split"]["val_fraction"] == 0.25


def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys):
  (tmp_path / "x.jsonl").write_text(json.dumps({"body": "a"}) + "\n")
  for args, message in [
      (["prepare-data", "--input=x"], "usage: lngram-exp prepare-data needs --tokenizer --out"),
      (["prepare-data", f"--input={tmp_path / 'x.jsonl'}", "--tokenizer=bytes",
        f"--out={tmp_path / 'o'}"], "error: " + str(tmp_path / "x.jsonl")
       + " line 1: no field 'text' (found: body)"),
      (["prepare-data", f"--input={tmp_path / 'none'}", "--tokenizer=bytes",
        f"--out={tmp_path / 'o'}"], "is not a file, a folder or a glob"),
      (["train-tokenizer", "--vocab_size=300"], "usage: lngram-exp train-tokenizer needs --out"),
      (["train-tokenizer", f"--out={tmp_path / 't'}", "--tokenizer=bytes"],
       "train-tokenizer does not take --tokenizer"),
      (["prepare-data", "--workdir=runs/x"], "prepare-data does not take --workdir"),
  ]:
    assert cli(*args) == 2, args
    err = capsys.readouterr().err
    assert message in err, (args, err)
    assert len(err.strip().splitlines()) == 1, err
