"""A run on token data, through the CLI: it names its bits per token (train and validation
metrics, the summary line, `lngram-exp eval`), a run from before that name resumes, and
`lngram-exp analyze` runs every ID analysis over its tokens."""

import json
import shutil

import pytest
from cli_runner import run_cli

from experiments.analysis.run import LM_ANALYSES

pytestmark = pytest.mark.slow   # trains through the CLI

MODULES = ("os", "sys", "json", "math", "re", "time")


def python_sources(root, n=48):
  """Small Python files (the ID analyses' targets come from Python source)."""
  root.mkdir(parents=True)
  texts = []
  for i in range(n):
    a, b = MODULES[i % 6], MODULES[(i * 5 + 1) % 6]
    text = (f'"""Module {i}."""\nimport {a}\nimport {b}\n\n\nclass Thing{i}:\n'
            f'  """A thing."""\n\n  def __init__(self, x={i}):\n    self.x = x\n\n'
            f'  def value(self):\n    if self.x > {i % 7}:\n      return self.x * 2  # double\n'
            f'    return {a}.__name__\n\n\ndef run(n):\n  total = 0\n  for k in range(n):\n'
            f'    total += k\n  print("done", total)\n  return total\n')
    (root / f"m{i:02d}.py").write_text(text)
    texts.append(text)
  return texts


def train_args(workdir, data, steps=2, *extra):
  return ["train", "--config=experiments/configs/lm_lngram.py:smoke", f"--workdir={workdir}",
          "--config.data.kind=tokens", f"--config.data.path={data}",
          f"--config.train.steps={steps}", "--config.train.ckpt_every=1",
          "--config.train.eval_every=2", "--config.train.progress=false", *extra]


@pytest.fixture(scope="module")
def token_run(tmp_path_factory):
  """(run directory, `train`'s stdout) of a 2-step lm_lngram smoke run on tokenized Python
  files, checkpoints at steps 1 and 2."""
  from experiments.data.tokens import prepare, train_tokenizer

  root = tmp_path_factory.mktemp("py_tokens")
  texts = python_sources(root / "src")
  tokenizer = train_tokenizer(iter(texts), str(root / "tok"), vocab_size=400)
  prepare(str(root / "src"), str(tokenizer), str(root / "data"), val_fraction=0.25,
          progress=False)
  done = run_cli(*train_args(root / "run", root / "data"), timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return root / "run", done.stdout


def rows(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_token_run_logs_bits_per_token(token_run):
  from experiments.trainer.writers import bits_unit

  workdir, stdout = token_run
  logged = rows(workdir)
  assert all("train/bits_per_token" in r for r in logged if "train/loss" in r)
  [final] = [r for r in logged if "eval/loss" in r]
  assert final["step"] == 2 and "eval/bits_per_token" in final
  assert not any(key.endswith("bits_per_byte") for r in logged for key in r)
  assert bits_unit(logged) == "token" and (workdir / "loss_curve.png").is_file()
  assert "validation bits per token:" in stdout and "bits per byte" not in stdout
  said = float(stdout.rsplit("validation bits per token:", 1)[1].split()[0])
  assert said == pytest.approx(final["eval/bits_per_token"], abs=1e-4)

  evaluated = run_cli("eval", f"--workdir={workdir}")
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  values = dict(line.split() for line in evaluated.stdout.splitlines() if line.strip())
  assert "eval/bits_per_byte" not in values
  assert float(values["eval/bits_per_token"]) == pytest.approx(said, abs=1e-4)


def test_a_token_run_from_before_the_name_resumes_and_reads(token_run, tmp_path):
  """A token run logged its bits per token as `bits_per_byte` before; resumed, its old
  lines stay and the new ones use the new name; its readers take both."""
  from experiments.tools.report.collect import eval_curve
  from experiments.tools.reproduce import final_eval
  from experiments.trainer.writers import bits_unit, bits_value

  workdir = tmp_path / "old"
  shutil.copytree(token_run[0], workdir)
  metrics = workdir / "metrics.jsonl"
  metrics.write_text(metrics.read_text().replace("bits_per_token", "bits_per_byte"))
  old = rows(workdir)
  assert bits_unit(old) == "byte" and final_eval(old, 2) == bits_value(old[-1], "eval")

  done = run_cli(*train_args(workdir, json.loads(
      (workdir / "token_data.json").read_text())["path"], 3,
      "--config.train.allow_config_change=true"), timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "validation bits per token:" in done.stdout
  logged = rows(workdir)
  assert [r["step"] for r in logged if "train/bits_per_byte" in r] == [1, 2]
  assert [r["step"] for r in logged if "train/bits_per_token" in r] == [3]
  assert bits_unit(logged) == "token"
  assert [step for step, _ in eval_curve(logged)] == [2, 3]
  assert final_eval(logged, 3) == pytest.approx(
      [r for r in logged if "eval/bits_per_token" in r][-1]["eval/bits_per_token"])


def test_analyze_runs_every_analysis_on_a_token_run(token_run, tmp_path):
  from experiments.analysis.records import load_records

  workdir = tmp_path / "run"
  shutil.copytree(token_run[0], workdir)
  done = run_cli("analyze", f"--workdir={workdir}", "--max_positions=300", "--n_perm=3",
                 "--n_rho_boot=20", "--seed=1", timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  out = workdir / "analysis"
  res = {name: json.loads((out / f"{name}.json").read_text()) for name in LM_ANALYSES}
  assert {r["source"]["step"] for r in res.values()} == {2}
  assert res["id_knn"]["layers"]["1"]["permutation"]
  assert res["id_knn"]["n_queries"] > 0 and res["utilisation"]["layers"]["1"]
  assert res["stability"]["steps"] == [1, 2] and res["stability"]["rows"]
  assert set(res["injection"]["interventions"]) == {"1", "all"}
  ref = load_records(out / "records_reference.npz")
  held = load_records(out / "records_heldout.npz")
  assert ref.meta["unit"] == held.meta["unit"] == "token"
  assert ref.surface[:, 0].max() >= 256   # token ids, not bytes (a 400-id vocabulary)
  assert set(ref.files).isdisjoint(held.files) and all(f.endswith(".py") for f in ref.files)
  # The local target of a token: its Python token kind (keywords found among the tokens).
  names, labels = ref.targets["local"]
  assert labels[:, names.index("def")].any() and labels[:, names.index("NAME")].any()
