"""Stage II on Qwen3-VL: group sampling with images, sequence inputs, token log-probs.

    sample_completions(model, batch, grid_thw, ...)  (tokens_BxN, logp_BxN), cached decode
    sequence_inputs(batch, tokens_BxN, config, grid_thw)  [prompt | completion] rows
    token_logp(model, seq, grid_thw)                 log π of every completion token [B, N]
    qwen3vl_grpo_hooks(data, grpo, ...)              (prepare, loss) for the one loop

The GRPO objective, advantages and hooks are every job's (experiments/jobs/grpo.py);
what is Qwen3-VL's is here. Sampling
prefills [image | prompt] once (the vision tower runs once; every PVM layer
keeps the K/V of its visual memory in the cache) and then feeds one token per
row: step i draws with fold_in(rng, i) at `temperature`, its log-probability
taken under the untempered logits (π_old). The loss recomputes log π over the
whole [prompt | completion] row in one forward; its position ids are built on
the host with transformers' rope index (completion tokens are text, so they
continue each row's positions), so the forward traces with static shapes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from experiments.jobs.grpo import completion_logp, policy_hooks
from experiments.vlm.emoji.rewards import rewards
from experiments.vlm.qwen3vl.generate import sample
from experiments.vlm.qwen3vl.positions import rope_index


def sample_completions(model, batch: dict, grid_thw, *, max_new_tokens: int, rng,
                       temperature: float = 1.0, eos: int | None = None):
  """(tokens int32 [B, N], log π_old float32 [B, N]) continuing each right-packed prompt
  (the one sampler, experiments/models/generate.py, through Qwen3-VL's `sample`).

  batch: input_ids / attention_mask [B, Tp] (real tokens first), lengths [B],
  pixel_values [n, P]; grid_thw [images, 3]. eos: a row ends at this token (kept);
  its later tokens are `eos` again with log-probability 0 (the loss masks everything
  after a row's first eos), and sampling ends when every row has ended. None: every
  row runs to max_new_tokens.
  """
  inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "pixel_values": batch["pixel_values"], "image_grid_thw": grid_thw}
  return sample(model, inputs, max_new_tokens, rng=rng, temperature=temperature,
                return_logp=True, eos_token_ids=eos,
                pad_token_id=0 if eos is None else eos)


def sequence_inputs(batch: dict, tokens_BxN, config, grid_thw) -> dict:
  """[prompt | completion | padding] rows for the loss's one forward (host numpy):
  seq_ids, seq_mask [B, L]; position_ids [B, 3, L]; cols [B, N] (where completion
  token j sits); pixel_values as given."""
  ids_BxT = np.asarray(batch["input_ids"])
  lengths_B = np.asarray(batch["lengths"], np.int64)
  tokens_BxN = np.asarray(tokens_BxN)
  B, T = ids_BxT.shape
  N = tokens_BxN.shape[1]
  L = T + N
  seq = np.zeros((B, L), np.int32)
  seq[:, :T] = np.where(np.arange(T)[None] < lengths_B[:, None], ids_BxT, 0)
  cols_BxN = lengths_B[:, None] + np.arange(N)[None]
  seq[np.arange(B)[:, None], cols_BxN] = tokens_BxN
  mask = np.arange(L)[None] < (lengths_B + N)[:, None]
  position_3xBxL, _ = rope_index(seq, grid_thw, mask, config)
  return {"seq_ids": seq, "seq_mask": mask,
          "position_ids": np.ascontiguousarray(position_3xBxL.transpose(1, 0, 2)),
          "cols": cols_BxN.astype(np.int32), "pixel_values": np.asarray(batch["pixel_values"])}


def token_logp(model, seq: dict, grid_thw, *, images_per_row=None, mesh=None):
  """log π(o_j | image, prompt, o_<j) of every completion token: [B, N] float32 (traceable).

  From the decoder's hidden states at the columns before each completion token, by
  `DecoderLM.token_nll` (no [B, L, V] logits); `images_per_row`, `mesh`: as
  `experiments.jobs.qwen3vl.sft.sft_loss`."""
  from experiments.jobs.qwen3vl.sft import forward_rows
  hidden_BxLxD = forward_rows(model, seq["seq_ids"], seq["seq_mask"], seq["position_ids"],
                              seq["pixel_values"], grid_thw, images_per_row=images_per_row,
                              mesh=mesh, return_hidden=True)
  tokens_BxN = jnp.take_along_axis(seq["seq_ids"], seq["cols"], axis=1)
  return completion_logp(model.lm, hidden_BxLxD, seq["cols"], tokens_BxN, mesh=mesh)


def qwen3vl_grpo_hooks(data, grpo, *, grid_thw, seed: int, eos: int, ref_model=None,
                       images_per_row: int | None = None, mesh=None):
  """(prepare, loss) of Stage II on Qwen3-VL over `data` (ConversationData with answers).

  `batch` comes from a ConversationSampler in "prompts" mode. Rewards:
  0.1·format + 0.9·accuracy of "<answer>N</answer>" against the row's answer
  (experiments.vlm.emoji.rewards), the completion decoded without special tokens.
  """
  grid_thw = np.asarray(grid_thw)

  def sample(model, batch, rng):
    tokens_BxN, logp_BxN = sample_completions(
        model, batch, grid_thw, max_new_tokens=grpo.max_new_tokens, rng=rng,
        temperature=grpo.temperature, eos=eos)
    return sequence_inputs(batch, tokens_BxN, model.config, grid_thw), tokens_BxN, logp_BxN

  def score(tokens_BxN, batch):
    texts = [data.processor.decode(list(t), skip_special_tokens=True) for t in tokens_BxN]
    answers = [data.rows[int(j)].get("answer") for j in batch["idx"]]
    if any(a is None for a in answers):
      raise ValueError(f"{data.path}: Stage II needs an integer 'answer' on every row "
                       "(verifiable rewards); a row has none.")
    return rewards(texts, answers)

  def token_logp_of(model, batch):
    return token_logp(model, batch, grid_thw, images_per_row=images_per_row, mesh=mesh)

  return policy_hooks(sample, score, token_logp_of, grpo, seed=seed, eos=eos,
                      ref_model=ref_model)
