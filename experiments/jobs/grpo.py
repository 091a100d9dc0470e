"""Stage II: Group Relative Policy Optimisation (GRPO) as hooks of the one loop.

For each prompt (image + counting question) G completions are sampled with
the KV + visual caches. With rewards r_{g} (0.1·format + 0.9·accuracy,
`experiments.vlm.emoji.rewards`):

    A_g   = (r_g - mean_g r) / (std_g r + eps)                 group-relative advantage
    ρ_g,t = exp(logπ(o_t) - logπ_old(o_t))
    L     = -mean_g [ (1/|o_g|) Σ_t min(ρ A_g, clip(ρ, 1-ε, 1+ε) A_g) - β·KL_t ]

KL_t = exp(ref - logπ) - (ref - logπ) - 1 (the k3 estimator against a frozen
reference policy); β = 0 by default, as the paper, and then no reference
forward is run. std is the population std of the group. The optimiser is the
one of every run with a constant learning rate (vlm.grpo.lr, no weight decay)
on the trainable mask of vlm.stage.trainable (default lm+branch).
This module holds what does not depend on the model: the advantages, the objective,
`policy_hooks` and `completion_logp` (log π of the completion tokens from the decoder's
hidden states). Each VLM job adds its sampling, scoring and forward:
experiments/jobs/vlm/grpo.py (the tiny VLM), experiments/jobs/qwen3vl/grpo.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.generate import completion_mask


def group_advantages(rewards_PxG, eps: float = 1e-4):
  """(r - mean) / (std + eps) within each group (row) of G completions."""
  r = jnp.asarray(rewards_PxG, jnp.float32)
  return (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + eps)


def completion_logp(lm, hidden_BxLxD, cols_BxN, tokens_BxN, *, mesh=None):
  """log π of every completion token: [B, N] float32 (traceable). Completion token j of
  row b sits at column cols[b, j] of the decoder's sequence; the hidden state (the
  blocks' output) one column before predicts it. `lm.token_nll` gives the log-probability
  without the [B, L, V] logits."""
  rows_B = jnp.arange(cols_BxN.shape[0])[:, None]
  pred_BxNxD = hidden_BxLxD[rows_B, cols_BxN - 1]
  return -lm.token_nll(pred_BxNxD, tokens_BxN, mesh=mesh)


def grpo_objective(logp_BxN, old_logp_BxN, adv_B, mask_BxN, *, clip_eps: float = 0.2,
                   kl_coef: float = 0.0, ref_logp_BxN=None):
  """The GRPO loss (to minimise) of one batch of completions; see the module doc."""
  mask = mask_BxN.astype(jnp.float32)
  ratio = jnp.exp(logp_BxN - old_logp_BxN)
  adv = adv_B[:, None]
  per_tok = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
  if kl_coef:
    d = ref_logp_BxN - logp_BxN
    per_tok = per_tok - kl_coef * (jnp.exp(d) - d - 1)
  per_seq = jnp.sum(per_tok * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
  return -jnp.mean(per_seq)


def policy_hooks(sample, score, token_logp_of, grpo, *, seed: int, eos: int, ref_model=None):
  """(prepare, loss) hooks of Stage II for the one loop, for any policy model.

  `sample(model, batch, rng) -> (batch', tokens_BxN, logp_BxN)` draws the
  group's completions on the host with the current policy (step s draws with
  fold_in(key(seed), s - 1)) and returns what the loss needs besides them;
  `score(tokens_BxN, batch) -> rewards [B]`; `token_logp_of(model, batch')`
  is log π of `batch'["completion"]`, traceable. `prepare` turns the rewards
  into group-relative advantages (rows g·G..g·G+G-1 are one group); `loss` is
  the GRPO objective of those completions under the policy being trained, with
  the sampled log-probs as π_old, and reports the mean reward as train/reward.
  Tokens after a row's first `eos` are masked out.
  """
  key = jax.random.key(seed)
  G = grpo.group_size
  ref_logp = nnx.jit(token_logp_of) if grpo.kl_coef else None

  def prepare(model, batch, step):
    out, tokens_BxN, old_logp_BxN = sample(model, batch, jax.random.fold_in(key, step - 1))
    r = np.asarray(score(tokens_BxN, batch), np.float32)
    adv_B = group_advantages(r.reshape(-1, G)).reshape(-1)
    out = {**out, "completion": tokens_BxN, "old_logp": old_logp_BxN, "adv": adv_B,
           "mask": completion_mask(tokens_BxN, eos), "reward": r}
    if grpo.kl_coef:
      out["ref_logp"] = ref_logp(ref_model, out)
    return out

  def loss(model, batch):
    value = grpo_objective(token_logp_of(model, batch), batch["old_logp"], batch["adv"],
                           batch["mask"], clip_eps=grpo.clip_eps, kl_coef=grpo.kl_coef,
                           ref_logp_BxN=batch.get("ref_logp"))
    return value, {"train/reward": jnp.mean(batch["reward"])}

  return prepare, loss
