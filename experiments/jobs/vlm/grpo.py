"""The tiny VLM's Stage II (GRPO): sampling with the KV + visual caches, the scenes'
rewards, and log π of the completions; the objective and the loop's hooks are
experiments/jobs/grpo.py's."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from experiments.jobs.grpo import completion_logp, policy_hooks
from experiments.models.generate import generate
from experiments.vlm.emoji.rewards import rewards
from experiments.vlm.tiny.data import EOS, decode


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
  hidden_BxSxD = model(images, seq_BxL, valid=valid_BxL, return_hidden=True)
  # The sequence is [Nv visual | text]: text column c sits at Nv + c.
  return completion_logp(model.lm, hidden_BxSxD, model.config.n_visual + cols_BxN,
                         completion_BxN)


def grpo_hooks(data, grpo, *, seed: int, ref_model=None):
  """(prepare, loss) hooks of the tiny VLM's Stage II (`policy_hooks`).

  Sampling runs with the KV + visual caches; rewards compare the decoded
  completions with the scenes' answers. `batch` comes from a SceneSampler in
  "prompts" mode (rows idx, grouped).
  """

  def sample(model, batch, rng):
    images = jnp.asarray(batch["images"])
    prompt_BxT, lengths_B = jnp.asarray(batch["tokens"]), jnp.asarray(batch["lengths"])
    tokens_BxN, old_logp_BxN = generate(
        model, prompt_BxT, prompt_lengths=lengths_B, images=images,
        max_new_tokens=grpo.max_new_tokens, rng=rng, temperature=grpo.temperature,
        return_logp=True)
    return {"images": images, "prompt": prompt_BxT, "lengths": lengths_B}, tokens_BxN, \
        old_logp_BxN

  def score(tokens_BxN, batch):
    texts = [decode(t) for t in np.asarray(tokens_BxN)]
    return rewards(texts, [data.examples[j]["answer"] for j in batch["idx"]])

  def token_logp_of(model, batch):
    return token_logp(model, batch["images"], batch["prompt"], batch["lengths"],
                      batch["completion"])

  return policy_hooks(sample, score, token_logp_of, grpo, seed=seed, eos=EOS,
                      ref_model=ref_model)
