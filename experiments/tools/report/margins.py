"""The declared margins of the report's non-inferiority claims.

A claim that one arm "matches or beats" another, or "is not worse than" it, is not shown
by failing to find a difference (a superiority test that says "not shown" says nothing
about it): it is tested as non-inferiority, Δ > −margin, with Δ the claim's contrast in
bits per unit (> 0 its direction) and the margin fixed before the test is read
(`experiments.analysis.stats.paired_t(d, null=-margin)`: two-sided against −margin, i.e.
the one-sided non-inferiority test at α/2, as the superiority claims spend α/2 in their
direction; "reversed" then reads "worse by more than the margin").

The margin, for every such claim here: half of what the memory buys in the paper, in this
setting's units. The paper's Lngram v2 r16 lowers the memory-free baseline's validation
loss by 1.09% (Table 4: 2.8899 -> 2.8584); half of that at this setting's memory-free
baseline loss (bytes 1.9131 bits/byte, tokens 5.7346 bits/token, the mean over its five
recorded seeds) is 0.0104 bits/byte and 0.0313 bits/token. Half, as in the 50% rule of
non-inferiority trials: an arm that loses more than half of the comparator's effect over
no treatment is not "as good". The paper's own v1-vs-v2 gap (2.8609 vs 2.8584, 0.09%) is
far inside it.

Declared in Reproductions v3, AFTER the runs these claims compare were recorded and their
two-sided tests printed: read them as declared post hoc. The figures live with the claim
families' declarations (`experiments.tools.reproduce.design.NONINFERIORITY`), pinned by
their digest (`MARGINS_DECLARED`) as a family is.
"""

from __future__ import annotations

import dataclasses

from experiments.tools.reproduce.design import NONINFERIORITY

PAPER_BASELINE, PAPER_V2_R16 = NONINFERIORITY.paper_baseline, NONINFERIORITY.paper_v2_r16
PAPER_RELATIVE_GAIN = (PAPER_BASELINE - PAPER_V2_R16) / PAPER_BASELINE   # 1.09%
SHARE = NONINFERIORITY.share
BASELINE_BITS = dict(NONINFERIORITY.baseline_bits)
UNITS = {"bytes": "bits/byte", "tokens": "bits/token"}


@dataclasses.dataclass(frozen=True)
class Margin:
  value: float     # in the setting's bits per unit
  unit: str
  reason: str


def _half_the_paper_s_gain(setting: str) -> Margin:
  value = round(SHARE * PAPER_RELATIVE_GAIN * BASELINE_BITS[setting], 4)
  return Margin(value, UNITS[setting],
                f"half the paper's memory gain ({100 * PAPER_RELATIVE_GAIN:.2f}% of the "
                f"baseline's loss, Table 4) at this setting's baseline "
                f"({BASELINE_BITS[setting]:.4f} {UNITS[setting]})")


# (setting, claim text as the report words it) -> its margin.
MARGINS = {(setting, claim): _half_the_paper_s_gain(setting)
           for setting, claim in NONINFERIORITY.claims}
# Words that make a claim one of non-inferiority: every claim so worded needs a margin.
WORDING = ("matches or beats", "not worse", "no worse", "at least as good")


def margin_for(setting: str, claim: str) -> Margin | None:
  """The declared margin of a non-inferiority claim, None for a superiority claim; a
  claim worded as non-inferiority without a declared margin raises."""
  found = MARGINS.get((setting, claim))
  if found is None and any(w in claim for w in WORDING):
    raise KeyError(f"{setting}: {claim!r} is worded as non-inferiority but has no declared "
                   "margin (experiments/tools/reproduce/design.py NONINFERIORITY)")
  return found
