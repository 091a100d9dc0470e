"""Qwen3-VL's compiled prefill with PVM: its logits are the full forward's, cached
greedy decoding equals one causal forward over what it generated, and bad
prompts are refused on the host.

The batch mixes a row with an image and a shorter text-only row, so the PVM
layer's visual memory is ragged (the text row reads no visual token) and the
rows end at different lengths.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.vlm.qwen3vl.generate import greedy_generate
from experiments.vlm.qwen3vl.model import Qwen3VL
from experiments.vlm.qwen3vl.positions import rope_index
from experiments.vlm.qwen3vl.pvm import with_pvm
from experiments.vlm.qwen3vl.random_config import RANDOM_VOCAB, random_qwen3vl_config

GRID = (1, 4, 4)   # 16 patches of 3·2·4·4 values, 4 merged image tokens


@pytest.fixture(scope="module")
def model():
  config = with_pvm(random_qwen3vl_config(), layers=(1,), latent_dim=32)
  model = Qwen3VL(config, rngs=nnx.Rngs(0))
  # λ = 0 at init would hide the branch: open the gate so the visual memory counts.
  model.lm.blocks[1].ffn_branch.gate[...] = jnp.asarray(0.5, jnp.float32)
  return model


def _inputs(config):
  rng = np.random.default_rng(0)
  text = lambda n: list(rng.integers(0, RANDOM_VOCAB - 8, n))
  image_row = ([3, config.vision_start_token_id] + [config.image_token_id] * 4
               + [config.vision_end_token_id] + text(5))
  text_row = text(7)
  ids = np.zeros((2, len(image_row)), np.int64)
  mask = np.zeros_like(ids)
  for b, row in enumerate((image_row, text_row)):
    ids[b, :len(row)], mask[b, :len(row)] = row, 1
  return dict(input_ids=ids, attention_mask=mask,
              pixel_values=rng.normal(size=(16, 96)).astype(np.float32),
              image_grid_thw=np.asarray([GRID], np.int64))


def _forward(model, inputs, ids, mask, positions):
  """The full forward's float32 logits [B, T, V], compiled: the host-built
  positions are passed in."""
  grid = inputs["image_grid_thw"]

  @nnx.jit
  def forward(model, ids, pixels, mask, positions):
    logits, _ = model(ids, pixel_values=pixels, image_grid_thw=grid, attention_mask_BxT=mask,
                      position_ids=positions)
    return logits

  return np.asarray(forward(model, ids, inputs["pixel_values"], mask, positions))


def test_prefill_logits_are_the_forward_logits(model):
  inputs = _inputs(model.config)
  ids, mask = inputs["input_ids"], inputs["attention_mask"]
  positions = model.positions(ids, inputs["image_grid_thw"], mask)
  want = _forward(model, inputs, ids, mask, positions)
  got, _ = model.prefill(ids, pixel_values=inputs["pixel_values"],
                         image_grid_thw=inputs["image_grid_thw"], attention_mask_BxT=mask,
                         cache_len=ids.shape[1] + 4)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=2e-5, rtol=0)
  gate = model.lm.blocks[1].ffn_branch.gate
  open_gate = gate[...]
  gate[...] = jnp.zeros_like(open_gate)
  closed = _forward(model, inputs, ids, mask, positions)
  gate[...] = open_gate
  assert np.abs(want - closed)[real].max() > 1e-3   # the visual memory is read


def test_cached_greedy_decoding_equals_one_causal_forward(model):
  # Causality: the forward over [prompt | generated] predicts at each row's step i what
  # cached step i saw. Generated tokens continue each row's positions after its
  # largest prompt position (rope deltas), as in `greedy_generate_uncached`.
  inputs = _inputs(model.config)
  N = 4
  tokens_BxN = greedy_generate(model, inputs, N)
  ids, mask = inputs["input_ids"], inputs["attention_mask"]
  positions_3xBxT, deltas_B = rope_index(ids, inputs["image_grid_thw"], mask, model.config)
  (B, T), lengths_B = ids.shape, mask.sum(1)
  full_ids, full_mask = np.zeros((B, T + N), np.int64), np.zeros((B, T + N), np.int64)
  full_positions = np.zeros((3, B, T + N), np.int64)
  for b, n in enumerate(lengths_B):
    full_ids[b, :n], full_ids[b, n:n + N] = ids[b, :n], tokens_BxN[b]
    full_mask[b, :n + N] = 1
    full_positions[:, b, :n] = positions_3xBxT[:, b, :n]
    full_positions[:, b, n:n + N] = np.arange(n, n + N) + deltas_B[b]
  logits = _forward(model, inputs, full_ids, full_mask, full_positions)
  for b, n in enumerate(lengths_B):
    np.testing.assert_array_equal(logits[b, n - 1:n + N - 1].argmax(-1), tokens_BxN[b])


def test_bad_prompts_are_refused_before_compiling(model):
  inputs = _inputs(model.config)
  T = inputs["input_ids"].shape[1]
  with pytest.raises(ValueError, match="no pixel_values"):
    model.prefill(inputs["input_ids"], attention_mask_BxT=inputs["attention_mask"],
                  cache_len=T)
  with pytest.raises(ValueError, match="hold 4 image tokens; the images give 16"):
    model.prefill(inputs["input_ids"], pixel_values=np.zeros((64, 96), np.float32),
                  image_grid_thw=np.asarray([(1, 8, 8)]),
                  attention_mask_BxT=inputs["attention_mask"], cache_len=T)
  with pytest.raises(ValueError, match="need image_grid_thw"):
    model.prefill(inputs["input_ids"], pixel_values=inputs["pixel_values"],
                  attention_mask_BxT=inputs["attention_mask"], cache_len=T)
  with pytest.raises(ValueError, match="right-padded"):
    model.prefill(inputs["input_ids"], pixel_values=inputs["pixel_values"],
                  image_grid_thw=inputs["image_grid_thw"],
                  attention_mask_BxT=inputs["attention_mask"][:, ::-1], cache_len=T)
