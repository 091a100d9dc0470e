"""The §3 / App. C analyses on synthetic PositionRecords whose answer is known.

A latent class y per position drives the local concepts ("is y == j"); the
codes, h and z carry y perfectly, noisily or not at all, so the readers must
give AP 1 / rho 1, a distributed gain, or nothing and a large permutation p.
"""

import json

import numpy as np
import pytest

from experiments.analysis import (
    associations,
    distributed,
    id_permutation,
    id_readers,
    utilisation,
)
from experiments.analysis.records import PositionRecords

R, BITS, C, D = 4, 2, 4, 8
LAYER = 3
N_STRATA = 6


def _records(split, n_files, per_file, *, codes_mode, seed, stratum_concept=False):
  """Synthetic records: y uniform in [0, 4); the local concepts are y == 0, 1, 2.

  codes_mode: "perfect" (every route reads y), "noisy" (each route reads y
  with probability 0.5, else a random code) or "random" (codes ignore y).
  stratum_concept: one more local concept that is exactly "stratum == 0".
  """
  rng = np.random.default_rng(seed)
  P = n_files * per_file
  file_ids = np.repeat(np.arange(n_files), per_file).astype(np.int32)
  y = rng.integers(0, C, P)
  nuisance = rng.integers(0, N_STRATA, P).astype(np.int32)
  if codes_mode == "perfect":
    codes = np.repeat(y[:, None], R, 1)
  elif codes_mode == "noisy":
    keep = rng.random((P, R)) < 0.5
    codes = np.where(keep, y[:, None], rng.integers(0, C, (P, R)))
  else:
    codes = rng.integers(0, C, (P, R))
  codes = codes.astype(np.int32)
  # Router logits whose signs give the codes (bit j of route r is channel r*M + j).
  bits_PxRxM = (codes[..., None] >> np.arange(BITS)) & 1
  z = np.where(bits_PxRxM, 1.0, -1.0) * (1 + rng.random(bits_PxRxM.shape))
  h = np.eye(D)[y] + 0.05 * rng.standard_normal((P, D))
  local = np.stack([y == j for j in range(3)], 1)
  local_names = ["y0", "y1", "y2"]
  if stratum_concept:
    local = np.concatenate([local, (nuisance == 0)[:, None]], 1)
    local_names.append("stratum0")
  doc_flag = (rng.random(n_files) < 0.5)[file_ids]
  return PositionRecords(
      split=split, file_ids=file_ids, files=[f"{split}/f{i}.py" for i in range(n_files)],
      layers=(LAYER,), h={LAYER: h.astype(np.float32)},
      z={LAYER: z.reshape(P, R * BITS).astype(np.float32)}, codes={LAYER: codes}, bits=BITS,
      nuisance=nuisance, surface=rng.integers(-1, 256, (P, 2)).astype(np.int32),
      targets={"local": (local_names, local),
               "statement": (["even"], (y % 2 == 0)[:, None]),
               "document": (["flag"], doc_flag[:, None])},
      skipped_files=0)


def _pair(codes_mode, **kw):
  return (_records("reference", 24, 25, codes_mode=codes_mode, seed=1, **kw),
          _records("heldout", 12, 25, codes_mode=codes_mode, seed=2, **kw))


def _json_roundtrip(result):
  return json.loads(json.dumps(result, allow_nan=False))


def test_perfect_codes_read_like_h():
  ref, held = _pair("perfect")
  res = id_readers.id_knn(ref, held, k=5, max_queries=120, n_perm=19, progress=False)
  _json_roundtrip(res)
  row = res["layers"][str(LAYER)]
  for reader in ("H_model", "Q_route", "ID"):
    assert row["ap"][reader]["local"] == pytest.approx(1.0)
  assert row["ap"]["nuisance"]["local"] < 0.5
  assert row["rho"]["local"] == pytest.approx(1.0)
  perm = row["permutation"]["local"]
  assert perm["p"] == pytest.approx(1 / 20)   # the observed AP beats every permutation
  assert perm["null_max"] < perm["observed"]
  assert "| 3 | local |" in id_readers.markdown(res)


def test_random_codes_retain_nothing():
  ref, held = _pair("random")
  res = id_readers.id_knn(ref, held, k=5, max_queries=120, n_perm=19, progress=False)
  row = res["layers"][str(LAYER)]
  assert row["ap"]["H_model"]["local"] == pytest.approx(1.0)
  assert abs(row["rho"]["local"]) < 0.15
  assert row["permutation"]["local"]["p"] > 0.05


def test_nuisance_reader_reads_the_stratum_rate():
  ref, held = _pair("random", stratum_concept=True)
  q_idx = id_readers.sample_queries(held, 100, seed=0)
  scores = id_readers.reader_scores(ref, held, q_idx, LAYER, "nuisance")["local"]
  labels = held.targets["local"][1][q_idx]
  aps = id_readers.ap_per_concept(scores, labels)
  assert aps[3] == pytest.approx(1.0)   # "stratum0" is the stratum itself
  # The score is the reference rate of the query's stratum.
  s = held.nuisance[q_idx[0]]
  expected = ref.targets["local"][1][ref.nuisance == s].mean(0)
  np.testing.assert_allclose(scores[0], expected)


def test_surface_reader_falls_back_to_the_byte_then_the_overall_rate():
  ref, held = _pair("random")
  ref.surface[:] = [[10, 20]]
  ref.surface[:100] = [[11, 21]]
  held.surface[:3] = [[10, 20], [10, 99], [12, 20]]   # seen pair, seen byte, unseen byte
  scores = id_readers.reader_scores(ref, held, np.arange(3), LAYER, "surface")["local"]
  labels = ref.targets["local"][1]
  np.testing.assert_allclose(scores[0], labels[100:].mean(0))
  np.testing.assert_allclose(scores[1], labels[100:].mean(0))
  np.testing.assert_allclose(scores[2], labels.mean(0))


def test_surface_readers_and_strata_keep_token_ids_apart():
  """Token runs' surface features are token ids (records.py): pairs and the
  nuisance x current-id cells never merge two ids however large they are."""
  ref, held = _pair("random")
  # (1, 511) and (2, -1) would share a key at a byte run's width (512).
  ref.surface[:] = [[1, 511]]
  ref.surface[:100] = [[2, -1]]
  held.surface[:2] = [[1, 511], [2, -1]]
  scores = id_readers.reader_scores(ref, held, np.arange(2), LAYER, "surface")["local"]
  labels = ref.targets["local"][1]
  np.testing.assert_allclose(scores[0], labels[100:].mean(0))
  np.testing.assert_allclose(scores[1], labels[:100].mean(0))
  ref.nuisance[:] = 0
  ref.surface[:, 0] = np.where(np.arange(len(ref.surface)) % 2, 257, 0)
  strata = id_permutation.permutation_strata(ref, "nuisance_byte")
  assert len(np.unique(strata)) == 2   # ids 0 and 257, one stratum
  # A byte run's cells are numbered as before (stratum x 257 + byte + 1).
  ref.surface[:, 0] = 5
  np.testing.assert_array_equal(id_permutation.permutation_strata(ref, "nuisance_byte"), 6)


def test_sample_queries_is_seeded_and_sorted():
  _, held = _pair("random")
  a = id_readers.sample_queries(held, 50, seed=3)
  np.testing.assert_array_equal(a, id_readers.sample_queries(held, 50, seed=3))
  assert len(a) == 50 and (np.diff(a) > 0).all()
  assert len(id_readers.sample_queries(held, None, seed=3)) == len(held.file_ids)


def test_document_ids_match_by_path():
  ref, held = _pair("random")
  ref_docs, held_docs = id_readers.document_ids(ref, held)
  # Same integer ids, different paths: different documents.
  assert not set(ref_docs[ref.file_ids == 0]) & set(held_docs[held.file_ids == 0])
  held.files[0] = ref.files[5]
  ref_docs, held_docs = id_readers.document_ids(ref, held)
  assert set(held_docs[held.file_ids == 0]) == set(ref_docs[ref.file_ids == 5])
  # That held-out file's own reference positions are never its neighbours.
  q_idx = np.flatnonzero(held.file_ids == 0)
  idx = id_readers.knn_indices(ref, held, q_idx, LAYER, "ID", k=5, z_metric="cosine")
  assert (ref.file_ids[idx] != 5).all()


def test_association_statistics_by_hand():
  # One route, codes 0/1; concept z; two strata with rates 0.5 (stratum 0) and 0 (stratum 1).
  codes = np.array([[0], [0], [1], [1], [0], [1]], np.int32)
  z = np.array([1, 0, 0, 0, 0, 0], bool)
  strata = np.array([0, 0, 0, 0, 1, 1], np.int32)
  # stratum 0 holds 4 positions (1 positive): rate 0.25; stratum 1: rate 0.
  rec = PositionRecords(
      split="reference", file_ids=np.arange(6, dtype=np.int32), files=[str(i) for i in range(6)],
      layers=(0,), h={0: np.zeros((6, 2), np.float32)}, z={0: np.zeros((6, 1), np.float32)},
      codes={0: codes}, bits=1, nuisance=strata, surface=np.zeros((6, 2), np.int32),
      targets={"local": (["z"], z[:, None])}, skipped_files=0)
  eff = associations.effects(rec, 0, z[:, None])
  # Code 0 on positions 0, 1, 4: P = 1/3, P0 = (0.25 + 0.25 + 0) / 3.
  np.testing.assert_allclose(eff["n"][0], [3, 3])
  np.testing.assert_allclose(eff["P"][0, 0, 0], 1 / 3)
  np.testing.assert_allclose(eff["P0"][0, 0, 0], 0.5 / 3)
  np.testing.assert_allclose(eff["delta"][0, 0, 0], 1 / 3 - 0.5 / 3)
  # Code 1 on positions 2, 3, 5: P = 0, P0 = 0.5 / 3.
  np.testing.assert_allclose(eff["delta"][0, 1, 0], -0.5 / 3)
  assert eff["ci_low"][0, 0, 0] < eff["delta"][0, 0, 0] < eff["ci_high"][0, 0, 0]
  assert 0 < eff["p"][0, 0, 0] <= 1


def test_perfect_codes_replicate_and_random_codes_do_not():
  ref, held = _pair("perfect")
  res = _json_roundtrip(associations.associations(ref, held))
  assert res["total"]["replicated"] > 0
  assert res["by_level"]["local"]["rate"] == pytest.approx(1.0)
  ex = res["examples"][0]
  assert ex["P"] == pytest.approx(1.0) and ex["delta"] > 0.5
  assert ex["expression"].startswith(f"C_{{{LAYER},")
  first = [e["concept"] for e in res["examples"][:4]]   # one per concept first
  assert len(set(first)) == 4
  assert "⇒" in associations.markdown(res)

  ref, held = _pair("random")
  res = associations.associations(ref, held)
  assert res["total"]["replicated"] <= 1


def test_route_counts():
  assert distributed.route_counts(16) == [1, 2, 4, 8, 16]
  assert distributed.route_counts(6) == [1, 2, 4, 6]
  assert distributed.route_counts(1) == [1]


def test_top_m_scores_sum_the_largest_effects():
  d = np.array([[[0.1], [-0.5], [0.2]]])   # [Q=1, R=3, Z=1]
  top = distributed.top_m_scores(d, [1, 2, 3])
  np.testing.assert_allclose([top[m][0, 0] for m in (1, 2, 3)], [-0.5, -0.3, -0.2])


def test_s_dict_perfect_and_distributed():
  ref, held = _pair("perfect")
  res = _json_roundtrip(distributed.distributed(ref, held, max_queries=120))
  row = res["layers"][str(LAYER)]
  assert row["ap_s_dict"]["local"] == pytest.approx(1.0)
  assert row["rho"]["local"] == pytest.approx(1.0)
  assert row["ratio"]["local"] == pytest.approx(1.0)   # one route already says it all
  # Each route reads y only half the time: routes add up.
  ref, held = _pair("noisy")
  knn_res = id_readers.id_knn(ref, held, k=5, max_queries=120, n_perm=0, progress=False)
  res = distributed.distributed(ref, held, max_queries=120, readers=knn_res)
  row = res["layers"][str(LAYER)]
  assert row["ratio"]["local"] > 1.3
  assert row["ap_m"][str(R)]["local"] > row["ap_m"]["1"]["local"]
  assert 0 < row["rho"]["local"] < 1.05
  assert "AP_m, layer 3" in distributed.markdown(res)
  with pytest.raises(ValueError, match="other queries"):
    distributed.distributed(ref, held, max_queries=60, readers=knn_res)


def test_utilisation_known_distributions():
  rec, _ = _pair("random")
  codes = np.tile(np.arange(C, dtype=np.int32), 150)[:, None].repeat(R, 1)   # uniform
  codes[:, 0] = 2                                                            # route 0 constant
  rec.codes = {LAYER: codes}
  rec.file_ids = np.zeros(len(codes), np.int32)
  res = _json_roundtrip(utilisation.utilisation(rec))
  row = res["layers"][str(LAYER)]
  assert row["per_route"]["n_eff"] == pytest.approx([1, C, C, C])
  assert row["n_eff"] == pytest.approx((1 + 3 * C) / R)
  assert row["normalised_entropy"] == pytest.approx(3 / R)
  assert row["dead_codes"] == C - 1 and row["total_codes"] == R * C
  assert "3 / 16" in utilisation.markdown(res)
