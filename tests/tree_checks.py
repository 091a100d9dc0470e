"""Trees compared relative to each tensor's own scale, for `chex.assert_trees_all_close`.

    chex.assert_trees_all_close(*relative_to_reference(got, want), rtol=1e-5, atol=2e-5)

holds every leaf to |got - want| <= 2e-5·max|want| + 1e-5·|want|: gradients of
tensors of very different sizes (a table behind RMSNorm, a router weight) share one
call with one tolerance, each against its own scale.
"""

import jax
import numpy as np


def relative_to_reference(got, want, *, floor: float = np.finfo(np.float64).tiny):
  """(got, want) with each leaf of both divided by max|leaf of want| (float64).

  floor: the smallest divisor. The default makes a reference leaf of zeros demand
  exact zeros (atol·scale = 0, as before the division); a larger floor puts an
  absolute tolerance of atol·floor under every leaf. The trees must have the same
  structure.
  """
  def scale(w):
    w = np.asarray(w, np.float64)
    return max(float(np.max(np.abs(w))) if w.size else 0.0, floor)

  scales = jax.tree.map(scale, want)
  divide = lambda x, s: np.asarray(x, np.float64) / s
  return jax.tree.map(divide, got, scales), jax.tree.map(divide, want, scales)
