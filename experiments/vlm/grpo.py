"""Stage II: Group Relative Policy Optimisation (GRPO) in JAX.

For each prompt (image + counting question) G completions are sampled with
the KV + visual caches. With rewards r_{g} (0.1·format + 0.9·accuracy,
`pvm_jax.data.rewards`):

    A_g   = (r_g - mean_g r) / (std_g r + eps)                 group-relative advantage
    ρ_g,t = exp(logπ(o_t) - logπ_old(o_t))
    L     = -mean_g [ (1/|o_g|) Σ_t min(ρ A_g, clip(ρ, 1-ε, 1+ε) A_g) - β·KL_t ]

KL_t = exp(ref - logπ) - (ref - logπ) - 1 (the k3 estimator against a frozen
reference policy); β = 0 by default, as the paper, and then no reference
forward is run. std is the population std of the group.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.vlm import train as train_lib
from experiments.vlm.data import EOS, decode
from experiments.vlm.generate import completion_mask, generate
from pvm_jax.data.rewards import rewards


def group_advantages(rewards_PxG, eps: float = 1e-4):
  """(r - mean) / (std + eps) within each group (row) of G completions."""
  r = jnp.asarray(rewards_PxG, jnp.float32)
  return (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + eps)


def token_logp(model, images, prompt_BxT, lengths_B, completion_BxN):
  """log π(o_t | image, prompt, o_<t) for every completion token: [B, N] float32.

  Rows are [prompt (right-padded) | completion]; to keep one compiled shape
  the completion is written right after each row's real prompt.
  """
  B, T = prompt_BxT.shape
  N = completion_BxN.shape[1]
  rows_B = jnp.arange(B)
  seq_BxL = jnp.pad(prompt_BxT, ((0, 0), (0, N)))
  cols_BxN = lengths_B[:, None] + jnp.arange(N)[None, :]
  seq_BxL = jnp.where(jnp.arange(T + N)[None, :] < lengths_B[:, None], seq_BxL, 0)
  seq_BxL = seq_BxL.at[rows_B[:, None], cols_BxN].set(completion_BxN)
  valid_BxL = jnp.arange(T + N)[None, :] < (lengths_B + N)[:, None]
  logits_BxSxV = model(images, seq_BxL, valid=valid_BxL)
  Nv = model.config.n_visual
  # Logit at sequence position Nv + j - 1 predicts text token j.
  pred_BxNxV = logits_BxSxV[rows_B[:, None], Nv + cols_BxN - 1]
  logp_BxNxV = jax.nn.log_softmax(pred_BxNxV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp_BxNxV, completion_BxN[..., None], axis=-1)[..., 0]


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


def grpo_train(model, data, *, steps: int, prompts_per_step: int = 2, group_size: int = 8,
               max_new_tokens: int = 64, lr: float = 1e-6, clip_eps: float = 0.2,
               kl_coef: float = 0.0, temperature: float = 1.0, trainable: str = "lm+branch",
               seed: int = 0, log=print):
  """GRPO on `data` (a count-task SceneData) in place; returns per-step mean rewards."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = train_lib.make_optimizer(params, trainable=trainable, schedule=optax.constant_schedule(lr))
  opt_state = tx.init(params)
  ref_params = params if kl_coef else None

  @jax.jit
  def step(params, opt_state, batch, old_logp, adv, mask):
    ref_logp = None
    if kl_coef:
      ref_logp = jax.lax.stop_gradient(token_logp(nnx.merge(graphdef, ref_params, rest),
                                                  *batch))

    def f(p):
      logp = token_logp(nnx.merge(graphdef, p, rest), *batch)
      return grpo_objective(logp, old_logp, adv, mask, clip_eps=clip_eps, kl_coef=kl_coef,
                            ref_logp_BxN=ref_logp)
    loss, grads = jax.value_and_grad(f)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(seed)
  key = jax.random.key(seed)
  history, t0 = [], time.time()
  for i in range(steps):
    idx = np.repeat(rng.choice(len(data), prompts_per_step, replace=False), group_size)
    pb = data.prompt_batch(idx)
    policy = nnx.merge(graphdef, params, rest)
    tokens, old_logp = generate(policy, pb["images"], pb["tokens"], pb["lengths"],
                                max_new_tokens=max_new_tokens, rng=jax.random.fold_in(key, i),
                                temperature=temperature)
    texts = [decode(t) for t in np.asarray(tokens)]
    answers = [data.examples[j]["answer"] for j in idx]
    r = rewards(texts, answers)
    adv = group_advantages(r.reshape(prompts_per_step, group_size)).reshape(-1)
    mask = completion_mask(tokens, EOS)
    batch = (jnp.asarray(pb["images"]), jnp.asarray(pb["tokens"]), jnp.asarray(pb["lengths"]),
             tokens)
    params, opt_state, loss = step(params, opt_state, batch, old_logp, adv, mask)
    history.append(float(r.mean()))
    if log is not None:
      log(f"grpo step {i:4d}  reward {r.mean():.3f}  loss {float(loss):+.4f}  "
          f"{time.time() - t0:.1f}s")
  nnx.update(model, params)
  return history
