"""The report's declared additions of Reproductions v3: the near-duplicate sensitivity
analysis (re-scoring from per-document losses), the non-inferiority margins and the App.
A.5 collapse reading, on tiny synthetic record sets."""

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from experiments.analysis import stats
from experiments.tools import reproduce
from experiments.tools.report import family, margins, sensitivity
from experiments.tools.report.collapse import COLLAPSE_RATIO, ste_collapse

LN2 = math.log(2.0)
NAMES = ["a.py", "dup.py", "b.py"]
TOKENS = np.array([100.0, 50.0, 200.0])


def _seed(bits_per_doc):
  """A finished run's `collect` entry whose documents score `bits_per_doc` bits/unit."""
  nats = np.asarray(bits_per_doc) * TOKENS * LN2
  return {"final": float(nats.sum() / TOKENS.sum() / LN2),
          "per_doc": {"names": list(NAMES), "nats": nats, "tokens": TOKENS.copy(),
                      "step": 600}, "corpus": "c0"}


# Three paired seeds; on dup.py (a near-duplicate of a training file) v2 is far better.
BASE = {0: [2.0, 1.0, 2.2], 1: [2.1, 1.1, 2.0], 2: [1.9, 0.9, 2.1]}
V2 = {0: [1.98, 0.5, 2.19], 1: [2.09, 0.6, 1.99], 2: [1.91, 0.4, 2.08]}


def _results():
  return {"bytes": {
      "baseline": {"config": "c", "seeds": {k: _seed(v) for k, v in BASE.items()}},
      "lngram_r16": {"config": "c", "seeds": {k: _seed(v) for k, v in V2.items()}}}}


CONTRAST = {"baseline": 1.0, "lngram_r16": -1.0}


def _bits(values, keep):
  w = TOKENS[keep]
  return float((np.asarray(values)[keep] * w).sum() / w.sum())


def test_rescoring_without_a_duplicate_gives_the_hand_computed_paired_t():
  results = _results()
  kept = sensitivity.without(results, "bytes", {"dup.py"})
  seeds, d, docs, _ = family.paired_values(kept, "bytes", CONTRAST)
  keep = np.array([True, False, True])
  want = [_bits(BASE[k], keep) - _bits(V2[k], keep) for k in (0, 1, 2)]
  assert seeds == [0, 1, 2] and d == pytest.approx(want, abs=1e-12)
  test = stats.paired_t(d)
  mean, sd = np.mean(want), np.std(want, ddof=1)
  assert test["t"] == pytest.approx(mean / (sd / math.sqrt(3)), rel=1e-9)
  assert test["p"] == pytest.approx(sps.ttest_1samp(want, 0.0).pvalue, rel=1e-9)
  # The per-document arrays follow: two documents, and the bootstrap sees only them.
  delta, tokens = docs
  assert delta.shape == (3, 2) and list(tokens) == [100.0, 200.0]
  # The full set is untouched (a copy), and the duplicate carried most of the gain.
  full = family.paired_values(results, "bytes", CONTRAST)[1]
  assert np.mean(full) > 3 * np.mean(d) > 0
  assert sensitivity.removed_units(results, sensitivity.NearDuplicates(
      "bytes", ("dup.py",), {"dup.py": ("twin.py",)})) == (1, 3, 50, 350)


def test_a_run_without_per_document_losses_cannot_be_rescored():
  results = _results()
  results["bytes"]["baseline"]["seeds"][2]["per_doc"] = None
  kept = sensitivity.without(results, "bytes", {"dup.py"})
  assert kept["bytes"]["baseline"]["seeds"][2]["final"] is None
  assert family.paired_values(kept, "bytes", CONTRAST)[0] == [0, 1]


def test_near_duplicates_are_checked_against_what_the_records_scored(monkeypatch):
  split = {"bytes": {"dup.py": ("twin.py",)}, "tokens": {}, "content": "c0",
           "bytes_val": set(NAMES), "tokens_val": set()}
  monkeypatch.setattr(sensitivity, "_split_twins", lambda: split)
  found = sensitivity.near_duplicates(_results(), "bytes")
  assert found.names == ("dup.py",) and found.twins == {"dup.py": ("twin.py",)} and not found.why
  # Another corpus than the records': refused, not re-scored.
  monkeypatch.setattr(sensitivity, "_split_twins", lambda: {**split, "content": "other"})
  assert "content sha256 differs" in sensitivity.near_duplicates(_results(), "bytes").why
  # The records scored documents outside the validation split recomputed here: refused.
  monkeypatch.setattr(sensitivity, "_split_twins", lambda: {**split, "bytes_val": {"a.py"}})
  assert "outside" in sensitivity.near_duplicates(_results(), "bytes").why
  # Tokens: the recomputed split must be exactly the set the records scored.
  monkeypatch.setattr(sensitivity, "_split_twins", lambda: split)
  results = {"tokens": _results()["bytes"]}
  assert "not the set the records scored" in sensitivity.near_duplicates(results, "tokens").why
  assert sensitivity.near_duplicates({}, "bytes").why


def test_the_token_split_is_prepare_data_s():
  """The token validation split the sensitivity analysis recomputes (prepare-data's rule
  over the exported corpus files) is the set the token records scored."""
  recorded = json.loads((reproduce.RECORDS / "tokens" / "baseline_s0" /
                         "eval_per_doc.json").read_text())["names"]
  assert all(n.startswith(sensitivity.TOKEN_CORPUS_PREFIX) for n in recorded)
  assert {n[len(sensitivity.TOKEN_CORPUS_PREFIX):] for n in recorded} == \
      sensitivity._split_twins()["tokens_val"]


def test_sensitivity_table_keeps_the_family_and_says_what_it_removed(monkeypatch):
  monkeypatch.setattr(sensitivity, "near_duplicates", lambda results, setting: (
      sensitivity.NearDuplicates(setting, ("dup.py",), {"dup.py": ("twin.py",)})
      if setting == "bytes" else sensitivity.NearDuplicates(setting, why="no runs")))
  text = family.sensitivity(_results())
  assert "not a replacement" in text
  assert "bytes: 1 of 3 documents removed, 50 of 350 scored bytes (14.3%): dup.py" in text
  assert f"Holm over the same {len(family.claim_family())} claims" in text
  [row] = [line for line in text.splitlines()
           if line.startswith("| bytes (sensitivity) | Lngram v2 r16 beats the memory-free "
                             "baseline |")]
  keep = np.array([True, False, True])
  d = [_bits(BASE[k], keep) - _bits(V2[k], keep) for k in (0, 1, 2)]
  test = stats.paired_t(d)
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[2] == "3" and cells[4].startswith(f"{test['mean']:+.4f}")
  assert cells[6] == f"{test['p']:.3g}"
  assert cells[8] == f"{test['p']:.3g}"   # the only evaluable claim: Holm is its p


def test_declared_margins():
  """Every claim worded as non-inferiority has a margin; each margin is half the paper's
  relative memory gain at the setting's recorded baseline loss."""
  worded = [(s, c) for s, c, *_ in family.claim_family()] + \
      [(s, c) for s, c, _ in family.CONTROLS]
  ni = [(s, c) for s, c in worded if any(w in c for w in margins.WORDING)]
  assert ni and set(ni) == set(margins.MARGINS)
  for setting, claim in ni:
    m = margins.margin_for(setting, claim)
    baseline = np.mean([json.loads((reproduce.RECORDS / setting / f"baseline_s{k}" /
                                    "eval_per_doc.json").read_text())["bits_per_unit"]
                        for k in range(5)])
    want = 0.5 * (2.8899 - 2.8584) / 2.8899 * baseline
    assert m.value == pytest.approx(want, abs=1e-4) and m.value > 0
  assert margins.margin_for("bytes", "v2 r16 beats PKM") is None
  with pytest.raises(KeyError, match="no declared margin"):
    margins.margin_for("bytes", "v2 matches or beats something new")


def test_a_noninferiority_claim_is_tested_against_the_margin():
  claim = "v2 r16 matches or beats v1 with 80% fewer total parameters"
  m = margins.margin_for("bytes", claim).value
  d = [-0.002, 0.001, -0.001]          # within the margin: non-inferior
  test = family.claim_test("bytes", claim, d)
  assert test["null"] == -m
  assert test["p"] == pytest.approx(sps.ttest_1samp(d, -m).pvalue, rel=1e-10)
  assert stats.verdict(test, test["p"]) == "supported"
  worse = family.claim_test("bytes", claim, [-0.2, -0.21, -0.22])
  assert stats.verdict(worse, worse["p"]) == "reversed"
  assert "(non-inferiority, margin 0.0104 bits/byte)" in family.claim_label("bytes", claim)
  assert family.claim_test("bytes", "v2 r16 beats PKM", d)["null"] == 0.0


def test_ste_collapse_is_read_from_the_loss_ratio():
  def arm(finals):
    return {"config": "c", "seeds": {k: {"final": v, "per_doc": None}
                                     for k, v in enumerate(finals)}}

  results = {"bytes": {"lngram_r16": arm([1.9, 1.9, 1.9]), "baseline": arm([1.91, 1.91, 1.91]),
                       "lngram_ste": arm([1.89, 1.92, 1.9])}}
  head, text = ste_collapse(results)
  assert head == "not reproduced"
  assert text.startswith("not reproduced: no STE run collapsed (final loss STE / one-bit "
                         "0.995, 1.011, 1.000 (seeds 0, 1, 2;")
  assert "paper 2.57 (7.3349 vs 2.8585)" in text
  assert "1 of 3 STE runs above their seed's memory-free baseline (seed 1: 1.9200 vs 1.9100)" \
      in text
  results["bytes"]["lngram_ste"] = arm([1.9 * (COLLAPSE_RATIO + 0.1), 1.9, 1.9 * 3])
  head, text = ste_collapse(results)
  assert head == "partly reproduced" and "2 of 3 STE runs collapsed" in text
  assert ste_collapse({"bytes": {}})[0] == "pending"
