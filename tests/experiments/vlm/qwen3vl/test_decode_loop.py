"""Qwen3-VL through the one compiled decode loop (experiments/models/generate.py; entry
points in experiments/vlm/qwen3vl/generate.py): its greedy tokens are the uncached
twin's, rows stop at their end token without stopping the batch, and the loop compiles
once per shape.

The model and batch are test_prefill's: PVM at layer 1 with its gate open, a row with
an image and a shorter text-only row.
"""

from __future__ import annotations

import importlib

import jax
import numpy as np
from flax import nnx
from test_prefill import _inputs, model  # noqa: F401  (the fixture)

from experiments.vlm.qwen3vl import generate
from experiments.vlm.qwen3vl.generate import greedy_generate, greedy_generate_uncached, sample

# The module (the package `experiments.models` exports the function `generate`).
sampler = importlib.import_module("experiments.models.generate")

N = 6
PAD = 7


def test_cached_loop_equals_the_uncached_twin(model):  # noqa: F811
  inputs = _inputs(model.config)
  np.testing.assert_array_equal(greedy_generate(model, inputs, N),
                                greedy_generate_uncached(model, inputs, N))


def _early_end(tokens_BxN):
  """(end id, step): a token row 0 draws at some step that row 1 never draws."""
  for j, t in enumerate(tokens_BxN[0]):
    if t not in tokens_BxN[1] and t != PAD:
      return int(t), j
  raise AssertionError("no token of row 0 is missing from row 1")


def test_a_row_ends_at_its_end_token_and_the_others_go_on(model):  # noqa: F811
  inputs = _inputs(model.config)
  free = greedy_generate(model, inputs, N)
  eos, j = _early_end(free)
  tokens, logp, lengths = sample(model, inputs, N, greedy=True, return_logp=True,
                                 return_lengths=True, eos_token_ids=[eos], pad_token_id=PAD)
  want = free.copy()
  want[0, j + 1:] = PAD
  np.testing.assert_array_equal(tokens, want)
  np.testing.assert_array_equal(lengths, [j + 1, N])
  assert (logp[0, j + 1:] == 0).all() and (logp[0, :j + 1] < 0).all() and (logp[1] < 0).all()
  # The slow twin stops the same way.
  np.testing.assert_array_equal(
      greedy_generate_uncached(model, inputs, N, eos_token_ids=eos, pad_token_id=PAD), want)


def test_the_loop_exits_when_every_row_has_ended(model):  # noqa: F811
  inputs = _inputs(model.config)
  free = greedy_generate(model, inputs, N)
  ends = np.unique(free[:, 1])   # every row ends at its second token
  tokens, lengths = sample(model, inputs, N, greedy=True, return_lengths=True,
                           eos_token_ids=ends, pad_token_id=PAD)
  first = np.asarray([min(np.flatnonzero(np.isin(row, ends))) for row in free])
  np.testing.assert_array_equal(lengths, first + 1)
  for b, n in enumerate(first + 1):
    np.testing.assert_array_equal(tokens[b, :n], free[b, :n])
    assert (tokens[b, n:] == PAD).all()
  packed = generate.pack_right(inputs)
  logits, cache = model.prefill(packed["input_ids"], pixel_values=packed["pixel_values"],
                                image_grid_thw=packed["image_grid_thw"],
                                attention_mask_BxT=packed["attention_mask"],
                                cache_len=packed["input_ids"].shape[1] + N)
  loop = nnx.jit(sampler.decode_loop,
                 static_argnames=("max_new_tokens", "pad_token_id", "greedy", "return_logp"))
  *_, steps = loop(
      model, generate.last_logits(logits, packed["lengths"]), cache, jax.random.key(0), 1.0,
      generate.end_ids(ends), max_new_tokens=N, pad_token_id=PAD, greedy=True,
      return_logp=False)
  assert int(steps) == int(first.max()) + 1 < N


def test_the_decode_loop_traces_once_per_shape(model, monkeypatch):  # noqa: F811
  traces = []
  inner = sampler.decode_loop

  def counted(*args, **kwargs):
    traces.append(1)
    return inner(*args, **kwargs)

  monkeypatch.setattr(sampler, "decode_loop", counted)
  inputs = _inputs(model.config)
  rng = jax.random.key(3)
  N1 = N + 1   # a shape no other test compiled
  a = sample(model, inputs, N1, rng=rng, temperature=0.7, eos_token_ids=5)
  b = sample(model, inputs, N1, rng=jax.random.key(4), temperature=0.9, eos_token_ids=6)
  assert len(traces) == 1
  assert a.shape == b.shape == (2, N1)


def test_the_one_program_rollout_equals_the_sampler(model):  # noqa: F811
  """`rollout` (the plan's program, from a packed batch) draws what `sample` draws."""
  inputs = _inputs(model.config)
  packed = generate.pack_right(inputs)
  ids, mask = packed["input_ids"], packed["attention_mask"]
  grid = tuple(tuple(int(n) for n in row) for row in packed["image_grid_thw"])
  rng = jax.random.key(5)

  @nnx.jit
  def program(model, ids, pixels, lengths, positions, rng):
    return generate.rollout(model, ids, pixels, lengths, positions, rng, 0.8,
                            generate.end_ids(None), grid_thw=grid,
                            n_visual=model.visual_width(np.asarray(inputs["input_ids"])),
                            max_new_tokens=N, return_logp=True)

  tokens, logp, lengths, _ = program(model, ids, packed["pixel_values"], packed["lengths"],
                                     model.positions(ids, grid, mask), rng)
  want, want_logp = sample(model, inputs, N, rng=rng, temperature=0.8, return_logp=True)
  np.testing.assert_array_equal(tokens, want)
  np.testing.assert_allclose(logp, want_logp, atol=1e-5)
  np.testing.assert_array_equal(lengths, [N, N])
