"""Statistics of the Lngram analyses and of the reproduction's report, in numpy and scipy.

Everything here works on arrays already collected; none of it knows about models.
Distributions (Student's t, the binomial, the beta of Clopper–Pearson) are scipy's. The
analyses of "Lngram v2: Latent N-Gram Memory with Interpretable Discrete Representations"
(§3, App. B, App. C; `lngram-exp analyze`) and the verdicts of the reproduction's report
(`python -m experiments.tools.report`) are built on these.

Ranking and multiple testing (ranking.py, corrections.py):

  average_precision   AP per concept, ties grouped as sklearn's
                      `average_precision_score` groups them (one threshold per
                      distinct score), so KNN share scores (k/K, many ties) are
                      not ranked by an arbitrary order inside a tie.
  bh_adjust           Benjamini–Hochberg adjusted p-values (`p.adjust(p, "BH")`).
  holm                Holm's step-down adjusted p-values (`p.adjust(p, "holm")`), over a
                      pre-declared claim family.

Tests over seeds. Two arms of one setting trained with the same seed share the
backbone's init and the data order (experiments/models/lm.py draws the memory branch
after the backbone), so a claim "arm A has lower validation loss than arm B" is tested
on the per-seed differences d_s = loss_B(s) - loss_A(s) (positive: the claim's direction;
seed_tests.py):

  paired_t            mean, sd, 95% CI and two-sided p of Student's t with n - 1
                      degrees of freedom;
  sign_flip_p         the exact permutation test over seeds: all 2^n sign flips of the
                      d_s (two-sided; its smallest attainable p, `min_flip_p`, is 2 / 2^n,
                      0.0625 at n = 5);
  sign_test_p         the exact binomial sign test (ties dropped);
  t_power             the exact power of a (paired) t-test of n seeds at a true mean
                      difference and sd: the noncentral t of n - 1 degrees of freedom;
  min_detectable_effect
                      the true mean difference a paired t-test of n seeds at this sd
                      detects with the given power (the noncentral t solved exactly; the
                      normal-shift shortcut t_{1-a/2} + t_{power} it replaces is 9-17%
                      smaller at n = 5-3 and α = 0.05/21, where its "80%" is 67-71%);
  noninferiority_t    the one-sided paired t of mean(diffs) > -margin ("matches or beats",
                      "is not worse than": a claim of no loss beyond a declared margin);
  tost                equivalence by two one-sided tests: low < mean(diffs) < high;
  verdict             a claim's verdict, computed from these numbers, never typed.

Counts (counts.py):

  permutation_p       Monte-Carlo p = (1 + #{null >= observed}) / (1 + n), never 0;
                      `permutation_p_interval` bounds the p an infinite number of
                      permutations would give.
  binomial_test       exact two-sided test of k successes in n against a fixed rate
                      p0, with the Clopper–Pearson interval of the rate.

Resampling documents (positions of one document, or the tokens of one validation
document, are not independent; one percentile bootstrap over documents serves both;
bootstrap.py):

  bootstrap_mean_ci   CI of a mean over positions, resampling whole documents.
  doc_bootstrap_ci    CI of the seed-mean difference of two arms' bits per unit,
                      resampling validation DOCUMENTS (one resample for both arms and
                      every seed): the evaluation-set uncertainty the seed tests do not see.
  group_bootstrap_ci  CI of a weighted contrast over evaluation items (e.g. validation
                      scenes), resampled within their groups.

Code use (codes.py):

  code_utilisation    per-route N_eff = exp(H), H / log K, top-code share, dead codes.
"""

from experiments.analysis.stats.bootstrap import (
    Interval,
    bootstrap_mean_ci,
    doc_bootstrap_ci,
    group_bootstrap_ci,
)
from experiments.analysis.stats.codes import code_utilisation, histogram_stats
from experiments.analysis.stats.corrections import bh_adjust, holm
from experiments.analysis.stats.counts import (
    BinomialTest,
    binomial_test,
    clopper_pearson,
    permutation_p,
    permutation_p_interval,
)
from experiments.analysis.stats.ranking import average_precision
from experiments.analysis.stats.seed_tests import (
    ALPHA,
    min_detectable_effect,
    min_flip_p,
    noninferiority_t,
    paired_t,
    sign_flip_p,
    sign_test_p,
    t_power,
    tost,
    verdict,
)

__all__ = [
    "ALPHA", "BinomialTest", "Interval", "average_precision", "bh_adjust", "binomial_test",
    "bootstrap_mean_ci", "clopper_pearson", "code_utilisation", "doc_bootstrap_ci",
    "group_bootstrap_ci", "histogram_stats", "holm", "min_detectable_effect", "min_flip_p",
    "noninferiority_t", "paired_t", "permutation_p", "permutation_p_interval", "sign_flip_p",
    "sign_test_p", "t_power", "tost", "verdict",
]
