"""The GPU scale check's CPU dry run: smoke shapes, no grain, records that accumulate seeds,
the deadline skips what cannot finish; and at full scale: the arms matched by the
parameter accounting, the data refused at one epoch or more."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiments.data import validation
from experiments.models import lm_config
from experiments.tools import reproduce
from experiments.tools.bench import scale_check, scale_check_arms

# One interpreter, grain made unimportable before anything loads: the GPU machine has
# none. Two arms train seed 0 at smoke size and are recorded; the same call again finds
# them recorded and trains nothing; then the baseline trains with its deadline already
# passed (compiled from the persistent cache), which the probe skips.
SCRIPT = textwrap.dedent("""
    import json, sys, time
    sys.modules["grain"] = None
    from pathlib import Path
    from experiments.tools.bench import scale_check as sc
    from experiments.tools.bench.scale_check_train import train_arm
    out = Path(sys.argv[1])
    argv = ["--dry_run", f"--out={out}", "--arms=baseline,lngram_v1", "--seed=0",
            f"--cache-dir={out / 'cache'}"]
    assert sc.main(argv) == 0
    first = json.loads((out / "scale_check.json").read_text())
    assert sc.main(argv) == 0                      # recorded: nothing trains again
    (out / "first.json").write_text(json.dumps(first))
    scale = dict(sc.SMOKE)
    [(spec, config)] = sc.arm_configs(scale, smoke=True, seed=0, names=["baseline"]).values()
    from experiments.data import validation
    from experiments.data.corpus import corpus_spec, load_corpus
    corpus = load_corpus(corpus_spec(config))
    val = validation.config_batches(corpus.val_docs, corpus.val_paths, config.data,
                                    default=list)
    late = train_arm("baseline", config, sc.Rows(corpus, scale["seq_len"], 0), val, scale,
                     deadline=time.perf_counter(), workdir=out / "late")
    (out / "late.json").write_text(json.dumps(late))
    print("grain" in sys.modules and sys.modules["grain"] is None)
""")


@pytest.mark.slow  # a subprocess that compiles two small training programs
def test_dry_run_records_accumulate_without_grain(tmp_path):
  proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  first = json.loads((tmp_path / "first.json").read_text())
  assert [(a["arm"], a["seed"], a["status"]) for a in first["arms"]] == [
      ("baseline", 0, "done"), ("lngram_v1", 0, "done")]
  assert first["tokens_per_step"] == 2 * 32 and first["backend"] == "cpu"
  assert first["declared"] == reproduce.DECLARED["scale_check"]
  assert first["data"]["epochs"] < 1 and len(first["data"]["sha256"]) == 64
  again = json.loads((tmp_path / "scale_check.json").read_text())
  assert [a["status"] for a in again["arms"]] == ["recorded", "recorded"]
  for arm in first["arms"]:
    assert arm["trained_steps"] == 4 and 0 < arm["final_eval_bpb"] < 9 and arm["step_s"] > 0
    record = tmp_path / "records" / f"{arm['arm']}_s0"
    stamp = json.loads((record / "repro.json").read_text())
    assert stamp["declared"] == {"scale_check": reproduce.DECLARED["scale_check"]}
    assert stamp["smoke"] is True and stamp["data"]["sha256"] == first["data"]["sha256"]
    curve = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [2, 4] and "eval/bits_per_byte" in curve[-1]
    per_doc = validation.read_per_doc(record)
    assert per_doc["bits_per_unit"] == pytest.approx(arm["final_eval_bpb"])
    assert per_doc["dedup"]["count"] == len(per_doc["dedup"]["removed"])
    assert json.loads((record / "provenance.json").read_text())["corpus"] == stamp["data"][
        "sha256"]
  assert "| lngram_v1 | 0 | recorded |" in (tmp_path / "scale_check_table.txt").read_text()
  late = json.loads((tmp_path / "late.json").read_text())
  assert late["status"] == "skipped" and "past the deadline" in late["reason"]
  assert any((tmp_path / "cache").iterdir())   # the persistent compilation cache
  # Smoke records never enter the family's section.
  (tmp_path / "root").mkdir()
  (tmp_path / "records").rename(tmp_path / "root" / reproduce.SCALE_DIR)
  assert reproduce.scale_records(tmp_path / "root") == []


def test_no_time_left_skips_every_arm_without_compiling(tmp_path):
  result = scale_check.run(tmp_path, smoke=True, budget_s=0, arms=["baseline", "engram"],
                           seeds=(0, 1), log=lambda *_: None)
  assert [(a["arm"], a["seed"], a["status"]) for a in result["arms"]] == [
      ("baseline", 0, "skipped"), ("engram", 0, "skipped"), ("baseline", 1, "skipped"),
      ("engram", 1, "skipped")]
  assert not (tmp_path / "runs").exists() and not (tmp_path / "records").exists()
  with pytest.raises(ValueError, match="unknown arms"):
    scale_check.run(tmp_path, smoke=True, arms=["nope"])
  assert scale_check.parse_args(["--seeds=2,3"]).seeds == "2,3"
  assert scale_check._seeds(scale_check.parse_args(["--seed=4"])) == (4,)
  assert scale_check._seeds(scale_check.parse_args(["--seeds=2,3"])) == (2, 3)


def test_full_scale_arms_are_matched_by_the_parameter_accounting():
  configs = scale_check_arms.arm_configs(scale_check.SCALE, smoke=False, seed=0)
  assert list(configs) == ["baseline", "lngram_r16", "lngram_v1", "engram"]
  for name, (_, config) in configs.items():
    model = lm_config(config)
    assert model.d_model == 512 and model.n_layers == 8
    assert config.data.batch_size * config.data.seq_len == 16384 and config.train.steps == 1000
    assert config.data.dedup_validation and config.data.val_doc_cap == 32768
    assert model.memory_layers == (() if name == "baseline" else (1, 4))
  rows = {r["arm"]: r for r in scale_check_arms.param_table(configs)}
  assert len({r["backbone"] for r in rows.values()}) == 1            # one backbone
  v2, v1, engram = rows["lngram_r16"], rows["lngram_v1"], rows["engram"]
  assert abs(v1["memory_active"] / v2["memory_active"] - 1) < 0.05   # v1: active parameters
  assert abs(engram["memory_tables"] / v2["memory_tables"] - 1) < 0.001   # Engram: tables
  v1_memory = lm_config(configs["lngram_v1"][1]).memory
  assert (v1_memory.routes, v1_memory.bits) == (16, 4)               # v2 r16's router width
  assert configs["lngram_v1"][0] == "lm_lngram_v1.py:r16,mem8"
  assert "| lngram_v1 |" in scale_check_arms.param_markdown(list(rows.values()))


def test_data_read_once_or_more_is_refused(tmp_path):
  """The standard library's ~11 MB training split: 1,000 x 32 x 512 bytes read it > 1x."""
  with pytest.raises(ValueError, match="pass --data="):
    scale_check.run(tmp_path, budget_s=0, arms=["baseline"], log=lambda *_: None)
  with pytest.raises(ValueError, match="no installed package"):
    scale_check.resolve_data("pkg:no_such_package_here")
  folder, about = scale_check.resolve_data("pkg:json")   # the standard library's json
  assert folder.endswith("json") and about["spec"] == "pkg:json"


@pytest.mark.slow  # reads and deduplicates ~50 MB of source text (~15 s)
def test_the_gpu_suite_s_default_data_passes_the_full_size_check(tmp_path):
  """The GPU suite's step 9 trains on SCALE_CHECK_DATA, by default the transformers package
  the GPU image holds: at the declared scale it must hold >= MIN_TRAIN_BYTES that 1,000
  steps read less than once (else the device run would stop at its data check)."""
  suite = (Path(scale_check.__file__).parent / "gpu_suite.sh").read_text()
  [default] = re.findall(r"^SCALE_DATA=\$\{SCALE_CHECK_DATA:-([^}]+)\}$", suite, re.M)
  assert "--data \"$SCALE_DATA\"" in suite
  result = scale_check.run(tmp_path, budget_s=0, arms=["baseline"], data=default,
                           records=str(tmp_path / "records"), log=lambda *_: None)
  assert result["data"]["train_bytes"] >= scale_check.MIN_TRAIN_BYTES
  assert result["data"]["epochs"] < 1 and result["data"]["spec"] == default
  assert [a["status"] for a in result["arms"]] == ["skipped"]   # no time: nothing compiled


def test_the_scale_is_the_declared_one():
  """The family `scale_check` declares what its runs train at: SCALE must say the same."""
  setup = dict(reproduce.FAMILIES["scale_check"].setup)
  scale = scale_check.SCALE
  for key in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "dtype"):
    assert scale["model"][key] == setup[key], key
  for key in ("seq_len", "batch_size", "steps", "lr", "warmup_steps", "eval_every"):
    assert scale[key] == setup[key], key
  assert tuple(scale["memory_layers"]) == setup["memory_layers"]
  assert scale_check.MIN_TRAIN_BYTES == setup["min_train_bytes"]
  config = scale_check_arms.arm_config("lm_baseline.py", scale, smoke=False, seed=0)
  assert (config.data.val_doc_cap, config.data.val_budget, config.data.dedup_validation) == (
      setup["val_doc_cap"], setup["val_budget"], setup["dedup_validation"])
  assert [a for a, _ in scale_check.ARMS] == [
      a.split("/", 1)[1] for a in reproduce.FAMILIES["scale_check"].new_arms]


def test_a_recorded_seed_is_skipped_and_one_on_other_data_refused(tmp_path):
  digest = reproduce.DECLARED["scale_check"]

  def record(base, data, declared=digest, smoke=False):
    (base / "engram_s3").mkdir(parents=True)
    (base / "engram_s3" / "repro.json").write_text(json.dumps(
        {"declared": {"scale_check": declared}, "smoke": smoke, "data": {"sha256": data}}))
    (base / "engram_s3" / validation.PER_DOC_FILE).write_text("{}")

  record(tmp_path / "mine", "a" * 64)
  record(tmp_path / "old", "b" * 64, declared="0" * 64)   # another declaration: not counted
  record(tmp_path / "dry", "a" * 64, smoke=True)
  roots = [tmp_path / "old", tmp_path / "mine"]
  assert scale_check.recorded(roots, "engram_s3", "a" * 64) == (True, None)
  assert scale_check.recorded(roots, "engram_s2", "a" * 64) == (False, None)
  done, clash = scale_check.recorded(roots, "engram_s3", "c" * 64)
  assert not done and "on other data" in clash
  assert scale_check.recorded([tmp_path / "dry"], "engram_s3", "a" * 64) == (False, None)
  assert scale_check.recorded([tmp_path / "dry"], "engram_s3", "a" * 64, smoke=True) == (
      True, None)
