"""The ID analyses' protocol fixes: near-duplicate files out of both splits, a per-file
cap on positions, the surface readers and rho against the best of them, permutations
within stratum x current byte, and document-bootstrap CIs of rho (tiny synthetic data)."""

import json
import types

import numpy as np
import pytest

from experiments.analysis import id_permutation, id_readers
from experiments.analysis import records as records_lib
from experiments.analysis.records import PositionRecords
from experiments.data import dedup

LAYER = 1


def test_normalisation_collapses_literal_only_differences():
  a = b"# codec cp1\nx = ('\\x00'  # 0x00 -> NULL\n     , 'a')\n\ndef f():\n    return 1\n"
  b = b"# codec cp2: other comment\nx = ('\\x01' # 0x01 -> ONE\n , 'b')\ndef f():\n  return 22\n"
  c = b"x = ('\\x00', 'a')\ndef g():\n    return 1\n"   # another name: not a duplicate
  assert dedup.normalised_lines(a) == ['x = ( ""', ', "" )', "def f ( ) :", "return 0"]
  assert dedup.content_hash(a) == dedup.content_hash(b) != dedup.content_hash(c)
  # A file that does not tokenize falls back to its stripped lines.
  assert dedup.normalised_lines(b"x = '\n  y\n") == ["x = '", "y"]


def test_split_files_removes_cross_split_duplicates_from_both_sides():
  docs = {"t0.py": b"a = 1\n", "t1.py": b"b = 2\n", "t2.py": b"a = 7  # twin of v0\n",
          "t3.py": b"# comments only\n", "v0.py": b"a = 5\n", "v1.py": b""}  # empty: no twin
  as_arr = lambda p: np.frombuffer(docs[p], np.uint8)  # noqa: E731
  train = ("t0.py", "t1.py", "t2.py", "t3.py")
  corpus = types.SimpleNamespace(train_paths=train, train_docs=tuple(map(as_arr, train)),
                                 val_paths=("v0.py", "v1.py"),
                                 val_docs=tuple(map(as_arr, ("v0.py", "v1.py"))))
  assert records_lib.removed_duplicates(corpus) == ({"t0.py", "t2.py"}, {"v0.py"})
  ref, held = records_lib.split_files(corpus, n_reference=10, seed=0, dedup=True)
  assert [f.path for f in ref] == ["t1.py", "t3.py"] and [f.path for f in held] == ["v1.py"]
  # Off by default: the split of earlier analyses.
  ref, held = records_lib.split_files(corpus, n_reference=10, seed=0)
  assert len(ref) == 4 and len(held) == 2


def test_per_file_cap_bounds_every_file_and_is_seeded():
  sizes = [5000, 30, 40, 20]
  ids, offsets = records_lib.sample_positions(sizes, 100, seed=3, max_per_file=25)
  counts = np.bincount(ids, minlength=4)
  assert counts.tolist() == [25, 25, 25, 20]   # capped; the 20-byte file gives all it has
  assert np.all(offsets < np.asarray(sizes)[ids])
  assert len(set(zip(ids.tolist(), offsets.tolist(), strict=True))) == len(ids)  # distinct
  again = records_lib.sample_positions(sizes, 100, seed=3, max_per_file=25)
  np.testing.assert_array_equal(again[1], offsets)
  # Without a cap: the uncapped sample, as before (one file takes most of it).
  ids_u, _ = records_lib.sample_positions(sizes, 100, seed=3)
  assert np.bincount(ids_u).max() > 90
  with pytest.raises(ValueError, match="max_per_file"):
    records_lib.sample_positions(sizes, 100, seed=3, max_per_file=0)


def _records(split, n_files, per_file, *, codes_mode, seed):
  """y in [0, 4) drives the local concepts; the current byte equals y (so the
  surface readers read y exactly); codes carry y ("perfect") or not ("random")."""
  rng = np.random.default_rng(seed)
  P = n_files * per_file
  y = rng.integers(0, 4, P)
  codes = (np.repeat(y[:, None], 4, 1) if codes_mode == "perfect"
           else rng.integers(0, 4, (P, 4))).astype(np.int32)
  bits = (codes[..., None] >> np.arange(2)) & 1
  z = (np.where(bits, 1.0, -1.0) * (1 + rng.random(bits.shape))).reshape(P, 8)
  h = np.eye(8)[y] + 0.05 * rng.standard_normal((P, 8))
  surface = np.stack([y + 40, rng.integers(-1, 256, P)], 1).astype(np.int32)
  return PositionRecords(
      split=split, file_ids=np.repeat(np.arange(n_files), per_file).astype(np.int32),
      files=[f"{split}/f{i}.py" for i in range(n_files)], layers=(LAYER,),
      h={LAYER: h.astype(np.float32)}, z={LAYER: z.astype(np.float32)}, codes={LAYER: codes},
      bits=2, nuisance=rng.integers(0, 3, P).astype(np.int32), surface=surface,
      targets={"local": (["y0", "y1", "y2"], np.stack([y == j for j in range(3)], 1))},
      skipped_files=0)


@pytest.fixture(scope="module")
def results():
  out = {}
  for mode in ("perfect", "random"):
    ref = _records("reference", 16, 20, codes_mode=mode, seed=1)
    held = _records("heldout", 8, 20, codes_mode=mode, seed=2)
    out[mode] = id_readers.id_knn(ref, held, k=5, max_queries=None, n_perm=19,
                                  perm_strata="nuisance_byte", n_boot=30, progress=False)
  return out


def test_surface_readers_and_rho_against_the_best_of_them(results):
  row = results["perfect"]["layers"][str(LAYER)]
  # The byte is y: both surface readers are perfect, so nothing is left over them.
  assert row["ap"]["surface_byte"]["local"] == pytest.approx(1.0)
  assert row["best_surface"]["local"] in id_readers.SURFACE_READERS
  assert row["rho"]["local"] == pytest.approx(1.0)
  assert row["rho_surface"]["local"] is None   # H does not beat the surface: undefined
  text = id_readers.markdown(results["perfect"])
  assert "surface_byte" in text and "ρ vs best surface" in text
  json.loads(json.dumps(results["perfect"], allow_nan=False))


def test_bootstrap_cis_bracket_rho(results):
  for mode in ("perfect", "random"):
    row = results[mode]["layers"][str(LAYER)]
    lo, hi = row["bootstrap"]["local"]["rho"]
    assert lo <= row["rho"]["local"] + 1e-9 and row["rho"]["local"] <= hi + 1e-9
  lo, hi = results["random"]["layers"][str(LAYER)]["bootstrap"]["local"]["rho"]
  assert hi < 0.5 and lo > -0.5   # random codes: rho near 0, and the CI says so
  assert results["perfect"]["layers"][str(LAYER)]["bootstrap"]["local"][
      "rho_surface_undefined"] == 30


def test_permutation_within_stratum_x_byte(results):
  # The byte carries y, so moving codes among positions of the same byte keeps their
  # information: the ID reader is no better than its null (a large p), unlike the test
  # within the nuisance strata alone, where perfect codes beat every permutation.
  perm = results["perfect"]["layers"][str(LAYER)]["permutation"]["local"]
  assert perm["p"] > 0.5
  assert results["perfect"]["perm_strata"] == "nuisance_byte"
  assert 0.9 < results["perfect"]["perm_movable"] <= 1.0
  ref = _records("reference", 16, 20, codes_mode="perfect", seed=1)
  held = _records("heldout", 8, 20, codes_mode="perfect", seed=2)
  coarse = id_readers.id_knn(ref, held, k=5, max_queries=None, n_perm=19, progress=False)
  assert coarse["layers"][str(LAYER)]["permutation"]["local"]["p"] == pytest.approx(1 / 20)
  strata = id_permutation.permutation_strata(ref, "nuisance_byte")
  cells = np.unique(np.stack([ref.nuisance, ref.surface[:, 0]]), axis=1)
  assert len(np.unique(strata)) == cells.shape[1]
  with pytest.raises(ValueError, match="perm_strata"):
    id_permutation.permutation_strata(ref, "bytes")


def test_fast_bootstrap_equals_its_reference_twin():
  from experiments.analysis import rho_bootstrap
  rng = np.random.default_rng(7)
  Q = 60
  labels = {"local": (["a", "b", "c"], rng.random((Q, 3)) < 0.3),
            "document": (["d"], np.repeat(rng.random(12) < 0.5, 5)[:, None])}
  # Coarse scores: many ties, as the KNN share readers give.
  scores = {r: {lv: np.round(rng.random((Q, len(n))) * 4) / 4 for lv, (n, _) in labels.items()}
            for r in ("H_model", "ID", "nuisance", "surface", "surface_byte")}
  for lv, (_, lab) in labels.items():   # H reads the labels well, so rho is defined
    scores["H_model"][lv] = lab + 0.1 * scores["H_model"][lv]
  docs = np.repeat(np.arange(12), 5)
  fast = rho_bootstrap.bootstrap_rho(scores, labels, docs, n_boot=25, seed=3, chunk=7)
  slow = rho_bootstrap.bootstrap_rho_reference(scores, labels, docs, n_boot=25, seed=3)
  for lv in labels:
    for key in ("rho", "rho_surface"):
      np.testing.assert_allclose(fast[lv][key], slow[lv][key], rtol=1e-5, atol=1e-6)
      assert fast[lv][f"{key}_undefined"] == slow[lv][f"{key}_undefined"]


def test_analyze_checks_the_protocol_options_before_anything_is_read(tmp_path):
  from experiments.analysis.run import analyze_lm
  with pytest.raises(ValueError, match="perm_strata='bytes'"):
    analyze_lm(tmp_path / "no_run", restore=None, perm_strata="bytes")
  with pytest.raises(ValueError, match="max_file_share=0"):
    analyze_lm(tmp_path / "no_run", restore=None, max_file_share=0)
