"""The reproduction queue (experiments.tools.reproduce), the runs it wrote (experiments.tools.report.collect)
and its summary table (experiments.tools.report): paired seeds, stale runs, verdicts from run files."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from experiments.analysis import stats
from experiments.configs import load_config
from experiments.data.validation import write_per_doc
from experiments.models import DecoderLM, lm_config, params
from experiments.tools import reproduce
from experiments.tools.report import collect as results
from experiments.tools.report import document as report
from experiments.tools.report import family
from experiments.tools.report import previous as report_previous
from experiments.tools.report import vlm as report_vlm


def test_plan_seeds_settings_and_commands():
  runs = reproduce.plan()
  keys = [r.key for r in runs]
  assert len(set(keys)) == len(keys)
  for setting in reproduce.SETTINGS:
    for arm in reproduce.ARMS[setting]:
      seeds = sorted(r.seed for r in runs if r.experiment == setting and r.name == arm)
      assert seeds == list(range(5 if arm in reproduce.FIVE_SEEDS else 3)), (setting, arm)
  for run in runs:
    assert run.after is None or run.after in keys
    command = run.command()
    assert command[:2] == ["lngram-exp", "train"]
    assert f"--config.train.seed={run.seed}" in command
    assert f"--config.data.seed={run.data_seed}" in command
    assert ("--config.data.path=runs/repro/tokens/data" in command) == (run.experiment == "tokens")
  inserted = {r.name: r for r in runs if r.after == "bytes/baseline_s1"}
  assert sorted(inserted) == sorted(reproduce.INSERTION_ARMS)
  assert {r.data_seed for r in inserted.values()} == {1001}          # paired with each other
  assert all("--config.init_from=runs/repro/bytes/baseline_s1" in r.command()
             for r in inserted.values())
  assert set(reproduce.INSERTION_PAIR) <= set(keys)
  smoke = runs[0].command("/tmp/x", smoke=True)
  assert smoke[2].endswith(",smoke") and "--workdir=/tmp/x/bytes/baseline_s0" in smoke


def test_every_distinct_config_loads_and_insertion_lowers_only_the_backbone_lr():
  for config in sorted({r.config for r in reproduce.plan() if r.experiment in reproduce.SETTINGS}):
    c = load_config(f"{reproduce.CONFIGS}/{config}")
    if c.data.kind == "tokens":
      c.model.vocab_size = reproduce.TOKEN_VOCAB
    lm_config(c)
    assert c.optim.get("backbone_lr", 0) == (pytest.approx(c.optim.lr * 0.05)
                                             if "insert_low" in config else 0)
  with pytest.raises(ValueError, match="repro_lm: arg"):
    load_config(f"{reproduce.CONFIGS}/repro_lm.py:bytes,nope")


def _backbone(arg):
  model_cfg = lm_config(load_config(f"experiments/configs/repro_lm.py:{arg}"))
  model = nnx.eval_shape(lambda: DecoderLM(model_cfg, rngs=nnx.Rngs(params=0)))
  total = sum(v.size for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  return total - params.memory_params(model_cfg)[0]


def test_the_bytes_setting_sizes():
  """Memory about 1x the backbone; the matched arms within the stated tolerances."""
  base, dense = _backbone("bytes,baseline"), _backbone("bytes,dense_active")
  assert _backbone("bytes,lngram_r16") == base
  mem = {arm: params.memory_params(lm_config(load_config(
      f"experiments/configs/repro_lm.py:bytes,{arm}"))) for arm in
      ("lngram_r16", "lngram_r64", "lngram_r16_mem128", "pkm", "engram", "sparse_ffn",
       "lngram_v1", "lngram_v1_paper")}
  total16, active16 = mem["lngram_r16"]
  assert 0.9 <= total16 / base <= 1.1
  assert abs((dense - base) - active16) / active16 < 0.01
  for arm in ("pkm", "engram", "sparse_ffn"):
    assert abs(mem[arm][0] / total16 - 1) < 0.02, arm
  assert abs(mem["sparse_ffn"][1] / active16 - 1) < 0.02
  assert abs(mem["lngram_v1"][1] / active16 - 1) < 0.1      # as close as Dm = 1 gets
  assert 0.79 <= 1 - total16 / mem["lngram_v1_paper"][0] <= 0.81
  tables = {a: load_config(f"experiments/configs/repro_lm.py:bytes,{a}").model.memory
            for a in ("lngram_r64", "lngram_r16_mem128")}
  rows = {a: m.routes * (16 ** 2 + 16 ** 3) * m.mem_dim for a, m in tables.items()}
  assert rows["lngram_r64"] == rows["lngram_r16_mem128"]      # equal table parameters


def _fake_run(root, run, final, *, docs=None, design=reproduce.DESIGN, steps=None):
  """A finished run directory: its stamp, metrics (and per-document evaluation)."""
  workdir = reproduce.run_dir(run, root)
  workdir.mkdir(parents=True)
  steps = steps or reproduce.steps(run)
  if design is not None:
    (workdir / reproduce.STAMP).write_text(json.dumps({"design": design}))
  rows = [{"step": 10, "train/tokens_per_s": 5.0}, {"step": 20, "train/tokens_per_s": 7.0},
          {"step": steps, "eval/bits_per_byte": final}]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  if docs is not None:
    nats, tokens = docs
    write_per_doc(workdir, steps, "byte", ["a.py", "b.py", "c.py"], nats, tokens)
  return workdir


@pytest.fixture(scope="module")
def five_pairs(tmp_path_factory):
  """baseline and Lngram v2 r16 on bytes, five seeds each, per-document evaluations."""
  root = tmp_path_factory.mktemp("repro")
  by_key = {r.key: r for r in reproduce.plan()}
  tokens = np.array([1000.0, 2000.0, 3000.0])
  rng = np.random.default_rng(0)
  finals = {}
  for seed in range(5):
    for arm, level in (("baseline", 2.10), ("lngram_r16", 2.05)):
      bits_D = level + 0.01 * seed + rng.normal(0, 0.005, 3)
      nats = bits_D * tokens * math.log(2)
      run = by_key[f"bytes/{arm}_s{seed}"]
      final = float(nats.sum() / tokens.sum() / math.log(2))
      finals[(arm, seed)] = final
      _fake_run(root, run, final + 0.5, docs=(nats, tokens))   # metrics differ: per-doc wins
  return root, finals, tokens


def test_summary_table_from_two_arms_times_five_seeds(five_pairs):
  root, finals, _ = five_pairs
  collected = results.collect(root)
  assert collected["bytes"]["baseline"]["seeds"][3]["final"] == pytest.approx(
      finals[("baseline", 3)])
  d = [finals[("baseline", s)] - finals[("lngram_r16", s)] for s in range(5)]
  test = stats.paired_t(d)
  text = family.summary(collected)
  [row] = [line for line in text.splitlines()
           if line.startswith("| bytes | Lngram v2 r16 beats the memory-free baseline")]
  cells = [c.strip() for c in row.split("|")[1:-1]]
  assert cells[3] == "5 (baseline 5 / lngram_r16 5)"
  assert cells[4] == f"{test['mean']:+.4f} [{test['ci'][0]:+.4f}, {test['ci'][1]:+.4f}]"
  assert cells[5].startswith("[") and cells[6] == f"{test['p']:.3g}"
  assert cells[7] == "0.0625 (min 0.0625)"
  # The only evaluable claim of the family: Holm's p is its own p.
  assert cells[8] == f"{test['p']:.3g}"
  assert cells[9] == f"{stats.min_detectable_effect(test['sd'], 5, alpha=0.05):.3g}"
  assert cells[10] == stats.verdict(test, test["p"]) == "supported"
  others = [line for line in text.splitlines() if line.startswith("| tokens | Lngram v2")]
  assert others and "pending: n = 0 paired seeds" in others[0]


def test_document_bootstrap_and_pairing_use_the_same_seeds(five_pairs):
  root, _, tokens = five_pairs
  collected = results.collect(root)
  seeds, d, docs, _ = family.paired_values(collected, "bytes", {"baseline": 1.0,
                                                               "lngram_r16": -1.0})
  assert seeds == [0, 1, 2, 3, 4] and docs[0].shape == (5, 3)
  point, lo, hi = stats.doc_bootstrap_ci(*docs)
  assert point == pytest.approx(np.mean(d)) and lo <= point <= hi
  np.testing.assert_array_equal(docs[1], tokens)


def test_stale_runs_are_listed_never_read(tmp_path):
  by_key = {r.key: r for r in reproduce.plan()}
  old = by_key["bytes/pkm_s0"]
  _fake_run(tmp_path, old, 1.9, design=None)              # an older design's directory
  new = _fake_run(tmp_path, by_key["bytes/pkm_s1"], 2.0)
  _fake_run(tmp_path, by_key["bytes/pkm_s2"], 2.1, design=1)
  assert reproduce.stale(old, tmp_path) and not reproduce.finished(old, tmp_path)
  assert reproduce.status(old, tmp_path) == "stale"
  assert reproduce.finished(by_key["bytes/pkm_s1"], tmp_path)
  assert set(results.collect(tmp_path)["bytes"]["pkm"]["seeds"]) == {1}
  assert "bytes/pkm_s0 (stale)" in report.pending_runs(tmp_path)
  assert new.name == "pkm_s1"


@pytest.mark.parametrize("claim", [False, True])
def test_run_queue_skips_stale_and_waits_for_the_baseline(tmp_path, monkeypatch, capsys, claim):
  by_key = {r.key: r for r in reproduce.plan()}
  _fake_run(tmp_path, by_key["bytes/baseline_s0"], 2.0, design=None)
  calls = []
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
  runs = [by_key[k] for k in ("bytes/baseline_s0", "bytes/inserted_low_s0", "bytes/pkm_s0")]
  assert reproduce.run_queue(runs, tmp_path, claim=claim) == 0
  out = capsys.readouterr().out
  assert "skip bytes/baseline_s0" in out and "stale" in out
  assert "skip bytes/inserted_low_s0: waits for bytes/baseline_s0" in out
  [call] = calls
  assert f"--workdir={tmp_path}/bytes/pkm_s0" in call
  assert json.loads((tmp_path / "bytes" / "pkm_s0" / "repro.json").read_text())["design"] == 2


def test_training_order_is_seed_major_and_shards_split_it():
  runs = reproduce.plan()
  by_key = {r.key: r for r in runs}
  order = reproduce.training_order(runs, by_key)
  lm = [r.seed for r in order if r.experiment not in reproduce.TRAINED_LAST]
  assert lm == sorted(lm) and len(lm) == len(order) - len(reproduce.vlm_plan())
  keys = [r.key for r in order]
  # Each insertion right after the baseline it starts from (its checkpoint used at once).
  first = keys.index("bytes/baseline_s0")
  assert keys[first + 1:first + 5] == ["bytes/continued_low_s0", "bytes/inserted_low_s0",
                                       "bytes/continued_full_s0", "bytes/inserted_full_s0"]
  assert all(keys.index(r.after) < keys.index(r.key) for r in order if r.after)
  assert reproduce.parse_shard("1/3") == (1, 3)
  with pytest.raises(SystemExit, match="--shard"):
    reproduce.parse_shard("3/3")


def test_analysis_jobs_every_seed_and_the_insertion_pair(tmp_path):
  by_key = {r.key: r for r in reproduce.plan()}
  for key in ("bytes/lngram_r16_s0", "bytes/lngram_r16_s1", "bytes/lngram_r16_frozen_s0",
              "bytes/inserted_low_s0", "tokens/lngram_r16_s0"):
    _fake_run(tmp_path, by_key[key], 2.0)
  jobs, skipped = reproduce.analysis_jobs(tmp_path)
  got = {r.key: names for r, names, _ in jobs}
  assert got["bytes/lngram_r16_s1"] == reproduce.RECORD_ANALYSES
  assert got["bytes/lngram_r16_s0"] == reproduce.ANALYSES      # also the insertion pair
  assert got["bytes/inserted_low_s0"] == reproduce.INSERTION_ANALYSES
  assert "bytes/lngram_r16_frozen_s0" in got and "tokens/lngram_r16_s0" not in got
  assert ("bytes/lngram_r64_s0", "not finished") in skipped
  command = reproduce.analyze_command(by_key["bytes/inserted_low_s0"], ("stability",), tmp_path)
  assert command[-2:] == ["--step=300", "--stability_steps=100,300"]
  command = reproduce.analyze_command(by_key["bytes/lngram_r16_s1"], ("id_knn",), tmp_path)
  assert "--max_positions=20000" in command
  # A record analysis of an older protocol is redone; one of the current protocol is not.
  from experiments.analysis.run import RECORD_PROTOCOL
  analysis = tmp_path / "bytes" / "lngram_r16_s1" / "analysis"
  analysis.mkdir()
  (analysis / "id_knn.json").write_text(json.dumps({"source": {"step": 600}}))
  assert not reproduce.analysis_written(by_key["bytes/lngram_r16_s1"], "id_knn", tmp_path)
  (analysis / "id_knn.json").write_text(json.dumps(
      {"source": {"step": 600}, "protocol": {"version": RECORD_PROTOCOL}}))
  assert reproduce.analysis_written(by_key["bytes/lngram_r16_s1"], "id_knn", tmp_path)
  from experiments.analysis.run import LM_ANALYSES
  assert reproduce.ANALYSES == LM_ANALYSES


def test_an_inserted_run_s_curve_continues_its_baseline_s_clock(tmp_path):
  by_key = {r.key: r for r in reproduce.plan()}
  inserted = by_key["bytes/inserted_low_s0"]
  assert reproduce.step_offset(inserted, by_key) == 600
  assert reproduce.step_offset(by_key["bytes/baseline_s0"], by_key) == 0
  _fake_run(tmp_path, inserted, 1.9)
  seeds = results.collect(tmp_path)["bytes"]["inserted_low"]["seeds"]
  assert seeds[0]["curve"] == [(900, 1.9)] and seeds[0]["final"] == 1.9
  assert seeds[0]["per_doc"] is None       # no per-document file: the metrics' final


def test_the_whole_report_renders_from_run_files(five_pairs, tmp_path):
  root, _, _ = five_pairs
  text = report.report(root, tmp_path / "plots")
  n = len(reproduce.plan())   # 10 runs of five_pairs finished
  assert f"Runs pending ({n - 10} of {n}" in text and "bytes/baseline_s0," not in text
  [row] = [line for line in text.splitlines() if line.startswith("| baseline | `repro_lm.py")]
  assert "| 0, 1, 2, 3, 4 |" in row and row.endswith("| 7 |")   # 1st interval: compiling
  assert "#### ID analyses" in text and "#### Insertion" in text   # the analysis sections
  assert "| `vlm_long/sft_pvm_s0` | `vlm_long_sft.py` | vlm_long/base_s0 | todo |" in text
  assert (tmp_path / "plots" / "bytes.png").read_bytes()[:4] == b"\x89PNG"


def test_the_pvm_rerun_rows_their_commands_and_order(tmp_path, monkeypatch, capsys):
  """Per seed a stage-0 base, then PVM / MLP / no branch / LoRA-SFT from it; trained after
  the LM runs,
  each Stage I after its base; done when metrics.json (the final evaluation) exists."""
  from experiments.cli.overrides import config_from_command_line
  vlm = reproduce.vlm_plan()
  assert vlm == [r for r in reproduce.plan() if r.experiment == "vlm_long"]
  assert [(r.key, r.config, r.after) for r in vlm if r.seed == 1] == [
      ("vlm_long/base_s1", "vlm_long_base.py:s1", None),
      ("vlm_long/sft_pvm_s1", "vlm_long_sft.py:s1", "vlm_long/base_s1"),
      ("vlm_long/sft_mlp_s1", "vlm_long_sft.py:mlp,s1", "vlm_long/base_s1"),
      ("vlm_long/sft_none_s1", "vlm_long_sft.py:none,s1", "vlm_long/base_s1"),
      ("vlm_long/sft_lora_s1", "vlm_long_sft.py:lora,s1", "vlm_long/base_s1")]
  assert sorted(r.seed for r in vlm) == [0] * 5 + [1] * 5 + [2] * 5
  mlp = next(r for r in vlm if r.key == "vlm_long/sft_mlp_s2").command(tmp_path)
  assert mlp[2] == "--config=experiments/configs/vlm_long_sft.py:mlp,s2"
  fields = [a[len("--config."):].split("=", 1) for a in mlp[3:] if a.startswith("--config.")]
  c = config_from_command_line(mlp[2].split("=", 1)[1], fields)   # as `lngram-exp train` parses
  assert c.vlm.stage.init_from == str(tmp_path / "vlm_long" / "base_s2")
  assert c.vlm.scenes.data_dir == str(tmp_path / "vlm_long" / "base_s2" / "data")
  assert (c.train.seed, c.vlm.branch.kind, c.vlm.stage.name) == (2, "mlp", "sft")
  assert vlm[0].command(tmp_path, smoke=True)[2].endswith("vlm_long_base.py:smoke")
  # The plan's phases and steps are the configs': stage 0's curriculum, Stage I's steps.
  base_c = config_from_command_line(vlm[0].command(tmp_path)[2].split("=", 1)[1], [])
  phases = tuple(int(p.split(":")[0]) for p in base_c.vlm.stage.curriculum.split(","))
  assert phases == reproduce.VLM_PHASE_STEPS["base"] and vlm[0].steps == sum(phases)
  assert (c.train.steps,) == reproduce.VLM_PHASE_STEPS["sft"] and vlm[3].steps == c.train.steps
  order = [r.key for r in reproduce.training_order(reproduce.plan(), {r.key: r for r in
                                                                     reproduce.plan()})]
  first = order.index("vlm_long/base_s0")
  assert all(k.startswith("vlm_long/") for k in order[first:]) and len(order[first:]) == 15
  assert all(order.index(r.after) < order.index(r.key) for r in vlm if r.after)
  # `list` notes the experiment is trained last; `run` trains each Stage I right after its base.
  assert reproduce.main(["list", "--only=vlm_long", f"--root={tmp_path}"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith("note  vlm_long: trained after the Lngram runs") and len(out) == 17
  # Nothing recorded: the training left is VLM_PRIOR_STEP_S's (3 bases, 12 Stage I runs).
  left_h = (3 * (1800 * 0.85 + 2000 * 10.2) + 12 * 600 * 3.5) * reproduce.DEADLINE_MARGIN / 3600
  assert out[-1].startswith(f"queue: 15 todo of 15 runs; ~{left_h:.1f} core-hours of training")
  calls = []
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
  assert reproduce.run_queue([vlm[3], vlm[7], vlm[0]], tmp_path) == 0   # sft s0, s1, base s0
  assert [next(a for a in c if a.startswith("--workdir=")) for c in calls] == [
      f"--workdir={tmp_path}/vlm_long/base_s0", f"--workdir={tmp_path}/vlm_long/sft_pvm_s0"]
  assert "skip vlm_long/sft_pvm_s1: waits for vlm_long/base_s1" in capsys.readouterr().out
  base = vlm[0]
  assert reproduce.status(base, tmp_path) == "todo"      # stamped, nothing trained (mocked)
  (reproduce.run_dir(base, tmp_path) / "metrics.jsonl").write_text('{"step": 1}\n')
  assert reproduce.status(base, tmp_path) == "part" and base.key in report.pending_runs(tmp_path)
  (reproduce.run_dir(base, tmp_path) / "metrics.json").write_text(json.dumps(
      {"eval": {"n": 512, "overall": {"item_acc": 0.5, "answer_acc": 0.25, "reward": 0.0},
                "groups": {g: {"n": 128, "item_acc": 0.5 + 0.1 * i}
                           for i, g in enumerate(("very_short", "short", "medium", "long"))}},
       "history": {"steps": [1, 2]}}))
  assert reproduce.finished(base, tmp_path) and base.key not in report.pending_runs(tmp_path)
  assert ("| `vlm_long/base_s0` | `vlm_long_base.py` | – | done | 0.5000 | 0.5000 | 0.6000 | "
          "0.7000 | 0.8000 | 0.2500 | 512 |" in report_vlm.runs_table(tmp_path))


def test_the_module_entry_point_runs_main(tmp_path, capsys):
  """`python -m experiments.tools.reproduce` (the package's __main__) is `main`: the same list."""
  assert reproduce.main(["list", "--only=vlm_long", f"--root={tmp_path}"]) == 0
  want = capsys.readouterr().out
  got = subprocess.run([sys.executable, "-m", "experiments.tools.reproduce", "list", "--only=vlm_long",
                        f"--root={tmp_path}"], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[3])
  assert (got.returncode, got.stdout) == (0, want), got.stderr[-2000:]
  with pytest.raises(SystemExit):
    reproduce.main(["nope"])
  assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_queued_runs_share_one_persistent_compilation_cache(tmp_path, monkeypatch):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  log = tmp_path / "run.log"
  show = "import os; print(os.environ['JAX_COMPILATION_CACHE_DIR'])"
  assert reproduce.queue._call([sys.executable, "-c", show], log, cache_dir=tmp_path / "c") == 0
  assert log.read_text().strip() == str((tmp_path / "c").absolute())
  # A cache the user chose is kept.
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  assert reproduce.queue._call([sys.executable, "-c", show], log, cache_dir=tmp_path / "c") == 0
  assert log.read_text().split() == [str((tmp_path / "c").absolute()), str(tmp_path / "mine")]


def test_the_token_setting_s_validation_is_capped_and_its_split_checked(tmp_path, capsys,
                                                                        monkeypatch):
  """Every token-setting config caps each validation document at TOKEN_VAL_DOC_CAP (at
  the base's 32,768 one file held 20% of the tokens); token data prepared with another
  split is refused, not trained on."""
  for run in reproduce.plan():
    if run.experiment in reproduce.SETTINGS:
      c = load_config(f"{reproduce.CONFIGS}/{run.config}")
      assert c.data.val_doc_cap == (8192 if run.experiment == "tokens" else 32768), run.key
  assert load_config(f"{reproduce.CONFIGS}/repro_lm.py:tokens,pkm,smoke").data.val_doc_cap == 256
  for prep in reproduce.preps(tmp_path)[1:]:
    assert f"--val_fraction={reproduce.TOKEN_VAL_FRACTION}" in prep.command
  data = reproduce.token_data(tmp_path)
  for prep in reproduce.preps(tmp_path):     # every step done, the split another one's
    (tmp_path / prep.marker).parent.mkdir(parents=True, exist_ok=True)
  (reproduce.token_root(tmp_path) / "corpus" / ".done").write_text("x")
  (reproduce.token_root(tmp_path) / "tok" / "tokenizer.json").write_text("{}")
  (data / "manifest.json").write_text(json.dumps({"split": {"val_fraction": 0.05}}))
  assert reproduce.prepared_val_fraction(tmp_path) == 0.05
  calls = []
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
  pkm = next(r for r in reproduce.plan() if r.key == "tokens/pkm_s0")
  assert reproduce.run_queue([pkm], tmp_path) == 2 and not calls
  assert "validation split of 0.05 (this design: 0.08)" in capsys.readouterr().out
  (data / "manifest.json").write_text(json.dumps(
      {"split": {"val_fraction": reproduce.TOKEN_VAL_FRACTION}}))
  assert reproduce.run_queue([pkm], tmp_path) == 0
  assert len(calls) == 1 and f"--workdir={tmp_path}/tokens/pkm_s0" in calls[0]


def test_the_previous_section_s_verdicts_sit_beside_the_computed_ones(five_pairs):
  root, _, _ = five_pairs
  verdicts = family.family_verdicts(family.family_tests(results.collect(root))[0])
  assert verdicts[("bytes", "Lngram v2 r16 beats the memory-free baseline")] == (5, "supported")
  assert verdicts[("tokens", "v2 r16 vs Engram")] == (0, "pending")
  text = report_previous.section(verdicts)
  rows = {cells[2]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]]
                                        for line in text.splitlines()[4:])}
  # Every previous claim maps onto a bytes claim of the family (a rename would raise).
  assert len(text.splitlines()) == 4 + len(report_previous.PREVIOUS)
  baseline = rows["Lngram v2 r16 beats the memory-free baseline"]
  assert baseline[1].startswith("reproduced") and baseline[3:6] == ["5", "supported",
                                                                    "unchanged"]
  assert rows["v2 r16 vs Engram"][3:6] == ["0", "pending", "pending"]
  # A verdict that differs from the previous one is named as a change.
  assert report_previous.change("reproduced", "not shown") == "supported -> not shown"
  assert report_previous.change("reversed", "reversed") == "unchanged"
  assert report_previous.change("no verdict", "supported") == "not shown -> supported"
  del verdicts[("bytes", "the sink helps")]
  with pytest.raises(KeyError, match="'the sink helps', which is not a bytes claim"):
    report_previous.section(verdicts)


def test_the_previous_analysis_verdicts_sit_beside_this_design_s():
  rows = [(claim, "paper", "ours", "inconclusive at this scale: 3/6")
          for claim, _ in report_previous.PREVIOUS_ANALYSES]
  rows[-2] = (rows[-2][0], "paper", "ours", "reproduced (one seed, CIs disjoint): more stable")
  text = report_previous.analysis_section(rows)
  table = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()[4:]]
  assert len(table) == len(report_previous.PREVIOUS_ANALYSES)
  by_claim = {cells[1]: cells for cells in table}
  stability = by_claim["inserted Lngram has more stable addresses (B.2)"]
  assert stability[0] == ("not reproduced (one seed, CIs disjoint) -> reproduced (one seed, "
                          "CIs disjoint)") and stability[3] == "reproduced (one seed, CIs disjoint)"
  joint = by_claim["the joint signature carries more than the single-code marginals (C.3)"]
  assert joint[0] == "unchanged" and joint[3] == "inconclusive at this scale"
  with pytest.raises(KeyError, match="is not an analysis claim"):
    report_previous.analysis_section(rows[1:])
