"""The previous Lngram section's verdicts beside this design's: which ones changed.

The previous section (experiments/RESULTS.md at commit 961c161, removed; the repository's
history keeps it) tested the same paper on bytes with another design: a d = 128 backbone
whose memory held 5.6x its parameters, 32 KB of validation from two files, unpaired
seeds (n = 3 or 2, some arms 1), and "reproduced" for a gap beyond twice its standard
error with no correction over its claims. Its verdicts are quoted here as it printed them
(history, not results of this design); this design's verdict of each claim that tests the
same comparison is computed from the records (`report.family_verdicts`, and for the ID
and insertion analyses `report_analyses.analysis_claims`), so the tables say at every
regeneration which verdicts changed.
"""

from __future__ import annotations

PREVIOUS_COMMIT = "961c161"

# The previous section's verdict as a category this design's verdicts compare with.
_CATEGORY = {"reproduced": "supported", "reversed": "reversed", "no verdict": "not shown"}

# (the previous section's claim, its verdict category, what it printed, this family's
# bytes claim that tests the comparison, how the contrast differs beyond the design).
PREVIOUS = (
    ("Lngram v2 beats the memory-free baseline", "reproduced",
     "reproduced: 2.0219 ± 0.0083 vs 2.0916 ± 0.0356 (n = 3 each)",
     "Lngram v2 r16 beats the memory-free baseline", ""),
    ("more routes help (r64 over r16)", "reproduced",
     "reproduced: 1.9769 ± 0.0048 vs 2.0219 ± 0.0083 (n = 3 each)",
     "more routes help (r64 over r16)", ""),
    ("v2 matches or beats v1 with far fewer parameters", "reversed",
     "not reproduced (reversed): v1 1.9163 ± 0.0106 vs v2 2.0219 ± 0.0083 (n = 3 each)",
     "v2 r16 beats v1 at matched active parameters",
     "v1 then matched v2's total parameters with 2.9x its active ones; here it matches the "
     "active ones"),
    ("v2 matches or beats v1 with far fewer parameters", "reversed",
     "not reproduced (reversed): v1 1.9163 ± 0.0106 vs v2 2.0219 ± 0.0083 (n = 3 each)",
     "v2 r16 matches or beats v1 with 80% fewer total parameters",
     "v1 then matched v2's total parameters; here v2 has ~80% fewer, the paper's contrast"),
    ("v2 beats PKM", "reversed",
     "not reproduced (reversed): PKM 1.9801 ± 0.0249 vs 2.0219 ± 0.0083 (n = 3 each)",
     "v2 r16 beats PKM", ""),
    ("v2 beats the parameter-matched sparse FFN", "reproduced",
     "reproduced: 2.0219 ± 0.0083 vs 2.1065 ± 0.0267 (n = 3 each)",
     "v2 r16 beats the parameter-matched sparse FFN",
     "the sparse FFN then ended worse than the baseline; the controls say whether it still does"),
    ("v2 vs Engram (text only)", "reversed",
     "not reproduced (reversed): Engram 1.8259 ± 0.0089 vs 2.0219 ± 0.0083 (n = 3 each)",
     "v2 r16 vs Engram", ""),
    ("the counterfactual surrogate beats STE", "no verdict",
     "inconclusive: one-bit 2.0259 ± 0.0063 vs STE 2.0394 ± 0.0230 (n = 2 each)",
     "the counterfactual (one-bit) surrogate beats STE", ""),
    ("the sink helps", "no verdict",
     "inconclusive: 2.0219 ± 0.0083 vs 2.0219 ± 0.0250 without (n = 3 each)",
     "the sink helps", ""),
    ("routes vs width at equal tables", "no verdict",
     "one seed, against the paper: r16 mem128 1.977 vs r64 1.979",
     "at equal table parameters, more routes beat wider entries (r64 over r16 mem128)", ""),
    ("insertion (App. B)", "no verdict",
     "one seed, against the paper: inserted at step 300 ends at 2.103 vs 2.030 from step 0",
     "inserted Lngram (backbone LR x0.05) gains over its continued baseline",
     "then inserted into an immature backbone at the full LR and compared with v2 from "
     "step 0; here from the final baseline at backbone LR x0.05, against that baseline "
     "continued"),
)


# The previous section's analysis rows (one run each: the best-loss r64 seed for the ID
# analyses, seed 0 for insertion): (this design's analysis claim, what it printed).
PREVIOUS_ANALYSES = (
    ("the codes are used, not collapsed (C.1)",
     "reproduced: no collapse (normalised entropy 0.850–0.865), but 2 / 2048 codes dead "
     "(paper 0)"),
    ("the IDs alone carry the semantics: ID-KNN above the permutation null (§3.2)",
     "reproduced: p ≤ 0.05 in 6/6 layer × target settings, above every permutation in 3/6"),
    ("ID-KNN keeps most of the hidden state's excess AP over the nuisance reader (§3.2)",
     "reproduced: ρ > 50% in 6/6 settings"),
    ("single-code associations replicate on held-out files (C.2)",
     "not reproduced: fewer than half replicate (49.01%; paper 65.85%)"),
    ("the full signature beats its best single route (C.3)",
     "reproduced: AP_R > AP_1 in 6/6 settings"),
    ("the joint signature carries more than the single-code marginals (C.3)",
     "inconclusive at this scale: S_dict ρ below ID-KNN ρ in 5/6 settings"),
    ("inserted Lngram has more stable addresses (B.2)",
     "not reproduced (one seed, CIs disjoint): inserted less stable (L1 0.6693 vs 0.8326, "
     "L2 0.6583 vs 0.8267), inserted at step 300 at the full LR"),
    ("inserted Lngram injects more into the backbone (B.3)",
     "one seed: inserted smaller in all 3 measures (against the paper), no spread"),
)


def head(verdict: str) -> str:
  """An analysis verdict's category: its text before the first ':'."""
  return verdict.split(":", 1)[0].strip()


def _moved(before: str, now: str) -> str:
  return "unchanged" if before == now else f"{before} -> {now}"


def change(previous: str, now: str) -> str:
  """'unchanged', 'pending' (this design has no verdict yet) or 'previous -> now'."""
  return "pending" if now == "pending" else _moved(_CATEGORY[previous], now)


def section(verdicts: dict[tuple[str, str], tuple[int, str]]) -> str:
  """The Markdown table of PREVIOUS against `verdicts` ({(setting, claim): (n, verdict)},
  `report.family_verdicts`); the claims it names must be the family's."""
  lines = [f"The previous section's verdicts (commit {PREVIOUS_COMMIT}: d = 128 bytes, memory "
           "5.6x the backbone, 32 KB of validation from two files, unpaired seeds, "
           "\"reproduced\" at a gap beyond 2 s.e. with no correction) beside this design's "
           "(bytes, the summary above). \"reproduced\" reads as supported and an "
           "inconclusive or one-seed reading as not shown.", "",
           "| previous claim | previous verdict | this design's claim (bytes) | n pairs | "
           "verdict now | change | the contrast then |",
           "|---|---|---|---:|---|---|---|"]
  for claim, category, printed, now_claim, then in PREVIOUS:
    if ("bytes", now_claim) not in verdicts:
      raise KeyError(f"the previous section's {claim!r} maps to {now_claim!r}, which is not "
                     "a bytes claim of the family")
    n, verdict = verdicts[("bytes", now_claim)]
    lines.append(f"| {claim} | {printed} | {now_claim} | {n} | {verdict} | "
                 f"{change(category, verdict)} | {then or 'the same contrast'} |")
  return "\n".join(lines)


def analysis_section(rows: list[tuple[str, str, str, str]]) -> str:
  """The Markdown table of PREVIOUS_ANALYSES against this design's analysis rows
  ([(claim, paper, ours, verdict)], `report_analyses.analysis_claims`); a claim missing
  from `rows` raises."""
  now = {claim: verdict for claim, _, _, verdict in rows}
  lines = ["The previous section's ID and insertion analyses (one run each: the best-loss r64 "
           "seed, the seed-0 insertion) beside this design's (every seed; the analysis table "
           "above).", "",
           "| change | claim | previous verdict | verdict now |", "|---|---|---|---|"]
  for claim, printed in PREVIOUS_ANALYSES:
    if claim not in now:
      raise KeyError(f"the previous analysis {claim!r} is not an analysis claim of the report")
    moved = _moved(head(printed), head(now[claim]))
    # The change leads: a row starting with the claim would repeat the analysis table's.
    lines.append(f"| {moved} | {claim} | {printed} | {head(now[claim])} |")
  return "\n".join(lines)
