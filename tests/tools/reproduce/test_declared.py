"""The families declared before their runs (experiments/tools/reproduce/design.py FAMILIES):
pinned digests, the v3 controls in the queue (configs, seeds, commands, stamps, one smoke
run), and their claims read from records (experiments/tools/reproduce/declared.py): byte
runs on the deduplicated validation set, the stability measure, the scale check's."""

import dataclasses
import json
import math

import numpy as np
import pytest

from experiments.analysis import stats
from experiments.configs import load_config
from experiments.data.validation import Dedup, DocNames, read_per_doc, write_per_doc
from experiments.models import lm_config
from experiments.models.params import branch_param_count
from experiments.tools import reproduce
from experiments.tools.reproduce import design


def test_the_noninferiority_margins_are_pinned_as_declared():
  """The margins are pinned like a family: an edit changes the digest and fails here; each
  margin-bearing claim names a setting that has a declared baseline."""
  margins = design.NONINFERIORITY
  assert design.margins_digest(margins) == design.MARGINS_DECLARED
  moved = dataclasses.replace(margins, share=0.4)
  assert design.margins_digest(moved) != design.MARGINS_DECLARED
  settings = dict(margins.baseline_bits)
  assert margins.claims and all(setting in settings for setting, _ in margins.claims)
  assert "post hoc" in margins.declared


def test_every_family_is_pinned_as_declared():
  """Editing a declared family changes its digest: this test then fails until DECLARED
  says so, and every run stamped with the old digest leaves that family (a new family,
  not an edit, once its runs have trained)."""
  assert set(reproduce.DECLARED) == set(reproduce.FAMILIES)
  for name, family in reproduce.FAMILIES.items():
    assert family.name == name
    assert reproduce.declaration_digest(family) == reproduce.DECLARED[name], name
    for claim in family.claims:
      assert claim.measure in reproduce.MEASURES and len(claim.contrast) >= 2
      assert math.isclose(sum(c for _, c in claim.contrast), 0.0)   # a paired difference


def test_the_controls_are_queued_with_their_seeds_configs_and_stamps():
  by_key = {r.key: r for r in reproduce.plan()}
  controls = reproduce.control_plan()
  assert [r.key for r in controls] == [r.key for r in reproduce.plan() if r in controls]
  keys = {r.key for r in controls}
  assert keys == reproduce.family_runs(reproduce.FAMILIES["controls_v3"])
  assert len(keys) == 4 * len(reproduce.CONTROL_SEEDS)
  for run in controls:
    assert run.seed in reproduce.CONTROL_SEEDS
    assert run.config.endswith(",dedup") == (run.experiment == "bytes")
    stamp = reproduce.stamp(run)
    assert stamp["declared"] == {"controls_v3": reproduce.DECLARED["controls_v3"]}
  assert "declared" not in reproduce.stamp(by_key["bytes/lngram_v1_s0"])   # recorded before
  young = by_key["bytes/inserted_young_low_s1"]
  assert young.after == "bytes/baseline_young_s1" and young.data_seed == 1001
  assert young.data_seed == by_key["bytes/inserted_low_s1"].data_seed     # the same batches
  assert "--config.init_from=runs/repro/bytes/baseline_young_s1" in young.command()
  assert reproduce.step_offset(young) == reproduce.YOUNG_STEPS == 200
  assert young.key in reproduce.B2_CONTROL_RUNS and "bytes/inserted_low_s2" in (
      reproduce.B2_CONTROL_RUNS)
  assert reproduce.wanted_analyses(by_key["bytes/inserted_low_s2"])[0] == ["stability"]
  assert reproduce.analyze_command(young, ("stability",))[-1] == "--stability_steps=100,300"
  smoke = young.command("/tmp/x", smoke=True)
  assert smoke[2].endswith(",dedup,smoke") and "--config.init_from=/tmp/x/bytes/" \
      "baseline_young_s1" in smoke and not any("train.steps" in a for a in smoke)


def _memory(arg):
  c = load_config(f"experiments/configs/repro_lm.py:{arg}")
  if c.data.kind == "tokens":
    c.model.vocab_size = reproduce.TOKEN_VOCAB
  return c, lm_config(c).memory


def test_the_control_arms_are_what_their_claims_say():
  base, v2 = _memory("bytes,lngram_r16")
  v2_count = branch_param_count(v2)
  zero, v1 = _memory("bytes,lngram_v1_zerotable,dedup")
  assert zero.optim.freeze == ("tables",) and v1.table_init_std == 0.0
  assert zero.data.dedup_validation and not base.data.dedup_validation
  assert v1 == _memory("bytes,lngram_v1")[1]                  # lngram_v1, its tables zeroed
  _, routed = _memory("bytes,lngram_v1_r16,dedup")
  count = branch_param_count(routed)
  assert (routed.routes, routed.bits, routed.router_dim) == (16, 4, 64) == (
      v2.routes, v2.bits, v2.routes * v2.bits)
  assert abs(count["active"] / v2_count["active"] - 1) < 0.001
  assert abs(count["dense"] / v2_count["dense"] - 1) < 0.01
  _, engram_arm = _memory("tokens,engram")   # at v2 r16's table memory (no control needed)
  assert abs(branch_param_count(engram_arm)["tables"] / v2_count["tables"] - 1) < 0.002
  young, _ = _memory("bytes,baseline_young,dedup")
  old, _ = _memory("bytes,baseline")
  assert (young.train.steps, young.optim.schedule_steps, young.train.ckpt_every) == (200, 600,
                                                                                     200)
  optim = young.optim.to_dict()
  assert optim.pop("schedule_steps") == 600 and optim == old.optim.to_dict()
  assert young.model.to_dict() == old.model.to_dict()


def test_list_shows_the_controls_as_todo_with_their_time(tmp_path, capsys):
  assert reproduce.main(["list", f"--root={tmp_path}", "--only=bytes,tokens"]) == 0
  lines = capsys.readouterr().out.splitlines()
  for run in reproduce.control_plan():
    [line] = [x for x in lines if f"--workdir={reproduce.run_dir(run, tmp_path)} " in x]
    assert line.startswith("todo  ") and run.config in line
  assert lines[-1].startswith("queue: ")


@pytest.mark.slow  # one smoke training run in a subprocess, ~20 s
def test_a_control_runs_at_smoke_size_and_is_recorded_with_its_declaration(tmp_path):
  from flax import nnx

  from experiments.jobs.restore import restore_module
  by_key = {r.key: r for r in reproduce.plan()}
  run = by_key["bytes/lngram_v1_zerotable_s0"]
  assert reproduce.run_queue([run], tmp_path, smoke=True) == 0
  assert reproduce.finished(run, tmp_path)
  record = reproduce.run_dir(run, reproduce.records_root(tmp_path))
  assert reproduce.declared.stamp_digest(record, "controls_v3") == reproduce.DECLARED[
      "controls_v3"]
  per_doc = read_per_doc(record)
  assert "dedup" in per_doc and per_doc["dedup"]["count"] == len(per_doc["dedup"]["removed"])
  model, _, step = restore_module(reproduce.run_dir(run, tmp_path))
  tables = [v for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param)) if "tables" in k]
  assert step == reproduce.SMOKE_STEPS and tables
  assert all(not np.asarray(t[...]).any() for t in tables)   # zero and frozen throughout


# --- the claims from records ---------------------------------------------------------------

NAMES = ["a.py", "b.py", "c.py", "enc.py"]   # enc.py: the near-duplicate left out


def _record(root, key, bits_of_doc, *, dedup=False, digest=None, steps=600, analysis=None):
  """A finished record: stamp, final metrics row, per-document evaluation (on the full
  set, or without enc.py when `dedup`)."""
  run = {r.key: r for r in reproduce.plan()}[key]
  workdir = reproduce.run_dir(run, root)
  workdir.mkdir(parents=True)
  stamp = {"design": reproduce.DESIGN, "key": key}
  if digest is not None:
    stamp["declared"] = {"controls_v3": digest}
  (workdir / reproduce.STAMP).write_text(json.dumps(stamp))
  names = NAMES[:3] if dedup else NAMES
  tokens = np.array([100.0, 200.0, 300.0, 400.0])[:len(names)]
  nats = np.array([bits_of_doc[n] for n in names]) * tokens * math.log(2)
  final = float(nats.sum() / tokens.sum() / math.log(2))
  unit = "eval/bits_per_token" if run.experiment == "tokens" else "eval/bits_per_byte"
  (workdir / "metrics.jsonl").write_text(json.dumps({"step": steps, unit: final}) + "\n")
  found = Dedup(("enc.py",), 400, {"enc.py": ("t.py",)}) if dedup else None
  write_per_doc(workdir, steps, "byte", DocNames(names, found), nats, tokens)
  if analysis is not None:
    (workdir / "analysis").mkdir()
    (workdir / "analysis" / "stability.json").write_text(json.dumps(analysis))
  return final


def _stability(layers):
  rows = [{"protocol": "fixed", "layer": k, "from_step": 100, "to_step": 300,
           "code_agreement": [v, v - 0.01, v + 0.01]} for k, v in enumerate(layers, 1)]
  rows.append({"protocol": "own", "layer": 1, "from_step": 100, "to_step": 300,
               "code_agreement": [0.1, 0.0, 0.2]})
  return {"primary": "fixed", "rows": rows}


def test_control_claims_read_the_deduplicated_set_and_wait_for_every_seed(tmp_path):
  digest = reproduce.DECLARED["controls_v3"]
  rng = np.random.default_rng(0)
  expected = {}
  for seed in (0, 1):
    r16 = {n: 2.0 + 0.01 * seed + rng.normal(0, 0.01) for n in NAMES}
    r16["enc.py"] = 0.1    # a copy: nearly free on the full set
    v1 = {n: r16[n] - 0.04 for n in NAMES}
    zero = {n: r16[n] - 0.03 + rng.normal(0, 0.002) for n in NAMES[:3]}
    _record(tmp_path, f"bytes/lngram_r16_s{seed}", r16)
    _record(tmp_path, f"bytes/lngram_v1_s{seed}", v1)
    _record(tmp_path, f"bytes/lngram_v1_zerotable_s{seed}", zero, dedup=True, digest=digest)
    on_kept = lambda b: sum(b[n] * t for n, t in zip(NAMES[:3], (100, 200, 300),
                                                     strict=True)) / 600
    expected[seed] = on_kept(zero) - on_kept(r16)        # r16 re-scored without enc.py
    _record(tmp_path, f"bytes/inserted_low_s{seed}", r16, steps=300,
            analysis=_stability([0.93, 0.95]))
    _record(tmp_path, f"bytes/inserted_young_low_s{seed}", r16, dedup=True, digest=digest,
            steps=300, analysis=_stability([0.80, 0.84]))
  # A run stamped under another declaration is left out, not counted.
  _record(tmp_path, "bytes/lngram_v1_zerotable_s2", {n: 1.0 for n in NAMES[:3]}, dedup=True,
          digest="0" * 64)
  family = reproduce.FAMILIES["controls_v3"]
  assert reproduce.dedup_set(family, tmp_path)[0] == NAMES[:3]
  rows = {r["claim"].claim: r for r in reproduce.claim_values(family, tmp_path)}
  dense = rows["v2 r16 beats v1's dense path alone (v1 with its tables zeroed)"]
  assert dense["seeds"] == [0, 1]
  assert dense["d"] == pytest.approx([expected[0], expected[1]], abs=1e-9)
  assert dense["left_out"] == ["bytes/lngram_v1_zerotable_s2 (not trained under this "
                               "declaration)"]
  b2 = next(r for r in rows.values() if r["claim"].measure == "stability")
  assert b2["d"] == pytest.approx([0.12, 0.12])           # mature 0.94 - young 0.82
  assert rows["v2 r16 beats v1 with v2 r16's router (16 x 4 bits) and readout "
              "parameters"]["seeds"] == []
  text = reproduce.controls_section(tmp_path)
  assert "pending: 2 of 3 seeds" in text and "3 documents" in text
  assert "lngram_v1_zerotable_s2 (not trained under this declaration)" in text
  verdicts = reproduce.declared.tested(family, list(rows.values()))
  assert all(v.startswith("pending") for _, _, v in verdicts)
  # Every claim complete: Holm over the family's four claims.
  for row in rows.values():
    row["seeds"], row["d"] = [0, 1, 2], [0.05, 0.051, 0.049]
    row["test"] = stats.paired_t(row["d"])
  verdicts = reproduce.declared.tested(family, list(rows.values()))
  p = stats.paired_t([0.05, 0.051, 0.049])["p"]
  assert [v for _, _, v in verdicts] == ["supported"] * 4
  assert verdicts[0][1] == pytest.approx(min(1.0, 4 * p))


def _scale_record(root, arm, seed, bits, *, data="d" * 64, digest=None, smoke=False):
  workdir = root / reproduce.SCALE_DIR / f"{arm}_s{seed}"
  workdir.mkdir(parents=True)
  stamp = {"arm": arm, "seed": seed, "smoke": smoke, "data": {"sha256": data, "spec": "pkg:x",
                                                             "train_bytes": 4 * 10 ** 7,
                                                             "epochs": 0.4},
           "declared": {"scale_check": digest or reproduce.DECLARED["scale_check"]},
           "validation": {"docs": 2, "units": 3, "largest_share": 0.6, "removed_count": 1},
           "params": {"memory_total": 10, "memory_active": 5}, "device": "H100"}
  (workdir / "repro.json").write_text(json.dumps(stamp))
  write_per_doc(workdir, 1000, "byte", ["x", "y"], [bits * math.log(2), bits * math.log(2)],
                [1.0, 1.0])


def test_the_scale_check_section_pairs_seeds_on_one_data_set(tmp_path):
  level = {"baseline": 1.60, "lngram_r16": 1.55, "lngram_v1": 1.50, "engram": 1.40}
  for seed in range(5):
    for arm, bits in level.items():
      _scale_record(tmp_path, arm, seed, bits + 0.01 * seed + 0.001 * (seed % 2) * (
          arm == "lngram_r16"))
  _scale_record(tmp_path, "baseline", 7, 1.0, data="e" * 64)      # other data: left out
  _scale_record(tmp_path, "engram", 8, 1.0, digest="0" * 64)      # another declaration
  _scale_record(tmp_path, "lngram_r16", 9, 1.0, smoke=True)       # a dry run: never read
  rows, about = reproduce.scale_values(tmp_path)
  assert about["data"] == "d" * 64 and sorted(about["left_out"]) == ["baseline_s7", "engram_s8"]
  by_claim = {r["claim"].contrast[0][0]: r for r in rows}
  assert by_claim["baseline"]["seeds"] == [0, 1, 2, 3, 4]
  assert by_claim["baseline"]["test"]["mean"] == pytest.approx(0.05 - 0.0004, abs=1e-9)
  text = reproduce.scale_section(tmp_path)
  assert "| baseline | 0, 1, 2, 3, 4 |" in text and "reversed" in text and "supported" in text
  assert "Left out (another declaration or data set): baseline_s7, engram_s8." in text
  assert "No scale-check run" in reproduce.scale_section(tmp_path / "none")


def test_the_young_baseline_is_checked_against_its_baseline_s_logged_training(tmp_path):
  by_key = {r.key: r for r in reproduce.plan()}
  rows = [{"step": s, "train/loss": 3.0 - s / 1000, "train/grad_norm": 1.0} for s in
          range(10, 210, 10)]
  for key, extra, final in (("bytes/baseline_s0", rows + [{"step": 600, "train/loss": 1.0}],
                             600), ("bytes/baseline_young_s0", rows, 200)):
    workdir = reproduce.run_dir(by_key[key], tmp_path)
    workdir.mkdir(parents=True)
    (workdir / reproduce.STAMP).write_text(json.dumps({"design": reproduce.DESIGN}))
    lines = extra + [{"step": final, "eval/bits_per_byte": 2.0 + final / 1000}]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  assert reproduce.declared.young_check(tmp_path) == [
      "seed 0 against its baseline: equal over 20 logged steps"]
  workdir = reproduce.run_dir(by_key["bytes/baseline_young_s0"], tmp_path)
  changed = [dict(r, **({"train/loss": 9.0} if r["step"] == 50 else {})) for r in rows]
  changed.append({"step": 200, "eval/bits_per_byte": 2.2})
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
  assert reproduce.declared.young_check(tmp_path) == [
      "seed 0 against its baseline: DIFFERS at step 50 (after 4 equal)"]
  assert "seed 0 against its baseline: DIFFERS at step 50" in reproduce.controls_section(
      tmp_path)
  # Where the mature insertion's analyses are a twin's, the young baseline is checked
  # against the retrained baseline that twin started from.
  twin = reproduce.run_dir(by_key["bytes/inserted_low_s0"], tmp_path) / "twin.json"
  twin.parent.mkdir(parents=True)
  twin.write_text(json.dumps({"analyses": ["analysis/stability.json"], "differs": "why",
                              "base_training": changed[:-1]}))
  assert reproduce.declared.young_check(tmp_path) == [
      "seed 0 against the retrained baseline of its mature twin: equal over 20 logged steps"]
  assert "bytes/inserted_low_s0 (stability): why" in reproduce.controls_section(tmp_path)


def test_v1_with_routes_set_apart_from_its_width():
  """`n_routes` (lngram_v1_r16, the scale check's v1): router d -> R·M, tables of R·C^n
  rows; its parameter count is the built layer's; 0 keeps v1's own R = d / M."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from experiments.models.arms.lngram_v1 import LngramV1, LngramV1Config
  from experiments.models.branches import BranchContext
  for routes, router in ((0, (64, 64)), (4, (64, 16))):
    config = LngramV1Config(d_model=64, bits=4, mem_dim=3, n_routes=routes)
    layer = LngramV1(config, rngs=nnx.Rngs(params=0))
    assert layer.router_w[...].shape == router
    assert [t[...].shape[0] for t in layer.tables] == [config.routes * 16 ** n for n in (2, 3)]
    built = sum(v.size for _, v in nnx.to_flat_state(nnx.state(layer, nnx.Param)))
    assert built == branch_param_count(config)["total"]
    x = jax.random.normal(jax.random.key(0), (2, 5, 64))
    y, aux = layer.forward(x, BranchContext(segment_ids_BxT=jnp.ones((2, 5), jnp.int32)))
    assert y.shape == x.shape and aux["router_codes"].shape == (2, 5, config.routes)
  with pytest.raises(ValueError, match="n_routes"):
    LngramV1Config(d_model=64, n_routes=-1)
