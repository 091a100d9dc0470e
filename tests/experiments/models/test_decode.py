"""Cached decoding of the LM: prefill + decode == parallel forward; generate()."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.models import DecoderLM, LMConfig, generate, liven_lngram, sample_logits
from lngram_jax.config import LngramConfig

LNGRAM = LngramConfig(d_model=32, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=4,
                      kv_heads=2, head_dim=8, surrogate="exact")
CONFIG = LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
                  max_len=32, memory_layers=(0, 1), memory=LNGRAM)
T_PROMPT, N_NEW = 8, 5


@pytest.fixture(scope="module")
def model():
  """Lngram layers at 0 and 1 with nonzero W_O and conv, so the branch matters.

  Layer 1's branch reads a residual stream that already went through attention,
  so its decode state depends on the KV cache being right.
  """
  return liven_lngram(DecoderLM(CONFIG, rngs=nnx.Rngs(0)), key=10, w_o_std=0.3, conv_std=0.3)


@nnx.jit
def _forward(model, tokens, segment_ids, valid):
  return model(tokens, segment_ids=segment_ids, valid=valid)


@nnx.jit
def _prefill(model, tokens, lengths, segment_ids):
  return model.prefill(tokens, lengths=lengths, segment_ids=segment_ids,
                       cache_len=T_PROMPT + N_NEW)


_decode_step = nnx.jit(lambda model, tokens, cache: model.decode_step(tokens, cache))


def _continued(tokens, lengths, segment_ids, new_tokens):
  """Each row's prompt directly followed by its new tokens, right-padded to one shape."""
  B = tokens.shape[0]
  S = T_PROMPT + N_NEW
  seq, seg, valid = np.zeros((B, S), np.int32), np.zeros((B, S), np.int32), np.zeros((B, S), bool)
  for b in range(B):
    L = int(lengths[b])
    seq[b, :L], seq[b, L:L + N_NEW] = tokens[b, :L], new_tokens[b]
    seg[b, :L], seg[b, L:] = segment_ids[b, :L], segment_ids[b, L - 1]
    valid[b, :L + N_NEW] = True
  return jnp.asarray(seq), jnp.asarray(seg), jnp.asarray(valid)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_prefill_and_decode_equal_parallel_forward(model, packed):
  """Batched prompts of lengths 3, 8, 6 (row 2 packs two segments), 5 new tokens."""
  tokens = jax.random.randint(jax.random.key(1), (3, T_PROMPT), 0, 256, dtype=jnp.int32)
  new_tokens = jax.random.randint(jax.random.key(2), (3, N_NEW), 0, 256, dtype=jnp.int32)
  lengths = jnp.array([3, 8, 6])
  segment_ids = jnp.zeros((3, T_PROMPT), jnp.int32)
  if packed:
    segment_ids = segment_ids.at[1, 5:].set(1).at[2, 2:].set(1)
  prompt_logits, cache = _prefill(model, tokens, lengths, segment_ids if packed else None)
  step_logits = []
  for i in range(N_NEW):
    logits_BxV, cache = _decode_step(model, new_tokens[:, i:i + 1], cache)
    step_logits.append(logits_BxV)
  np.testing.assert_array_equal(cache.index_B, lengths + N_NEW)

  seq, seg, valid = _continued(tokens, lengths, segment_ids, new_tokens)
  ref = _forward(model, seq, seg, valid)
  for b in range(3):
    L = int(lengths[b])
    np.testing.assert_allclose(prompt_logits[b, :L], ref[b, :L], rtol=1e-5, atol=1e-5)
    for i in range(N_NEW):
      # The logits after feeding new token i predict position L + i + 1.
      np.testing.assert_allclose(step_logits[i][b], ref[b, L + i], rtol=1e-5, atol=1e-5)
  if packed:
    # Positions continue inside the last segment: row 1 = 3 tokens of segment 1.
    np.testing.assert_array_equal(cache.position_B, [3 + N_NEW, 3 + N_NEW, 4 + N_NEW])


def test_decoding_from_an_empty_cache_equals_parallel_forward(model):
  """init_cache + one decode_step per token (no prefill) == the parallel forward."""
  S = T_PROMPT + N_NEW
  tokens = jax.random.randint(jax.random.key(11), (3, S), 0, 256, dtype=jnp.int32)
  cache = model.init_cache(3, S)
  _, prefilled = _prefill(model, tokens[:, :T_PROMPT], jnp.full((3,), T_PROMPT), None)
  assert jax.tree.structure(cache) == jax.tree.structure(prefilled)
  shapes = lambda tree: [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]
  assert shapes(cache) == shapes(prefilled)
  step_logits = []
  for t in range(S):
    logits_BxV, cache = _decode_step(model, tokens[:, t:t + 1], cache)
    step_logits.append(logits_BxV)
  ref = _forward(model, tokens, None, None)
  np.testing.assert_allclose(jnp.stack(step_logits, 1), ref, rtol=1e-5, atol=1e-5)


def _greedy_reference(model, tokens, lengths, n_new):
  """Repeated full forwards, one row at a time, argmax at the last real token."""
  out = []
  for b in range(tokens.shape[0]):
    seq = list(np.asarray(tokens[b, : int(lengths[b])]))
    for _ in range(n_new):
      logits = _forward(model, jnp.asarray(seq + [0] * (T_PROMPT + n_new - len(seq)))[None],
                        None, None)
      seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    out.append(seq[int(lengths[b]):])
  return np.array(out)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no_cache"])
def test_generate_greedy_equals_argmax_of_full_forwards(model, use_cache):
  tokens = jax.random.randint(jax.random.key(3), (2, T_PROMPT), 0, 256, dtype=jnp.int32)
  lengths = jnp.array([T_PROMPT, 4])
  got = generate(model, tokens, prompt_lengths=lengths, max_new_tokens=N_NEW,
                 rng=jax.random.key(0), greedy=True, use_cache=use_cache)
  assert got.shape == (2, N_NEW) and got.dtype == jnp.int32
  np.testing.assert_array_equal(got, _greedy_reference(model, tokens, lengths, N_NEW))


def test_sampling_same_tokens_with_and_without_cache_and_inside_top_k(model):
  """Same rng, same draws on both paths; every draw is among the model's top 3."""
  tokens = jax.random.randint(jax.random.key(4), (2, T_PROMPT), 0, 256, dtype=jnp.int32)
  lengths = jnp.array([5, 8])
  kwargs = dict(prompt_lengths=lengths, max_new_tokens=N_NEW, rng=jax.random.key(7),
                temperature=5.0, top_k=3)
  got = generate(model, tokens, use_cache=True, **kwargs)
  np.testing.assert_array_equal(got, generate(model, tokens, use_cache=False, **kwargs))
  seq, seg, valid = _continued(tokens, lengths, jnp.zeros_like(tokens), got)
  ref = _forward(model, seq, seg, valid)
  for b in range(2):
    L = int(lengths[b])
    for i in range(N_NEW):
      assert int(got[b, i]) in np.asarray(jax.lax.top_k(ref[b, L - 1 + i], 3)[1])
  # A high temperature over 3 candidates does not collapse onto the argmax.
  argmax = np.asarray(jnp.argmax(ref, -1))
  assert any(int(got[b, i]) != argmax[b, int(lengths[b]) - 1 + i]
             for b in range(2) for i in range(N_NEW))


def test_top_k_never_samples_outside_the_top_k():
  logits_BxV = jax.random.normal(jax.random.key(5), (512, 256)) * 3.0
  # Ties at the k-th value: many equal logits must not widen the candidate set.
  logits_BxV = logits_BxV.at[:8, :].set(0.0).at[:8, 3].set(1.0)
  k = 4
  sample = jax.jit(sample_logits, static_argnames=("top_k", "greedy"))
  tokens_B = sample(logits_BxV, jax.random.key(6), temperature=2.0, top_k=k)
  top_BxK = np.asarray(jax.lax.top_k(logits_BxV, k)[1])
  assert all(int(t) in top_BxK[b] for b, t in enumerate(tokens_B))
  assert len(set(np.asarray(tokens_B[8:] == top_BxK[8:, 0]).tolist())) == 2  # not just argmax
  greedy_B = sample(logits_BxV, jax.random.key(6), greedy=True)
  np.testing.assert_array_equal(greedy_B, jnp.argmax(logits_BxV, -1))


def test_generate_rejects_bad_arguments(model):
  tokens = jnp.zeros((1, T_PROMPT), jnp.int32)
  with pytest.raises(ValueError, match="exceeds max_len=32"):
    generate(model, tokens, max_new_tokens=30, rng=jax.random.key(0))
  with pytest.raises(ValueError, match="top_k=0"):
    generate(model, tokens, max_new_tokens=2, rng=jax.random.key(0), top_k=0)
  with pytest.raises(ValueError, match="temperature=0"):
    generate(model, tokens, max_new_tokens=2, rng=jax.random.key(0), temperature=0.0)


@pytest.mark.parametrize("lengths, error, match", [
    ([20, 20], ValueError, rf"lengths=\[20, 20\] must be in \[1, T={T_PROMPT}\]"),
    ([0, 3], ValueError, rf"lengths=\[0, 3\] must be in \[1, T={T_PROMPT}\]"),
    ([-2, 3], ValueError, "must be in"),
    ([2.5, 3.0], TypeError, "must be integers"),
    ([3], ValueError, r"prompt_lengths must have shape \(2,\)"),
])
def test_generate_refuses_impossible_prompt_lengths(model, lengths, error, match):
  """A length past the prompt read its last token from a clipped position: the
  continuation was silently wrong. Every row must have a real last token."""
  tokens = jnp.zeros((2, T_PROMPT), jnp.int32)
  with pytest.raises(error, match=match):
    generate(model, tokens, prompt_lengths=lengths, max_new_tokens=2, rng=jax.random.key(0))


def test_generate_returns_logp_of_the_drawn_tokens(model):
  """logp[i] = log_softmax(logits at the step that drew token i)[token i], both paths."""
  tokens = jax.random.randint(jax.random.key(8), (2, T_PROMPT), 0, 256, dtype=jnp.int32)
  lengths = jnp.array([6, 8])
  kwargs = dict(prompt_lengths=lengths, max_new_tokens=N_NEW, rng=jax.random.key(9),
                temperature=2.0, return_logp=True)
  got, logp = generate(model, tokens, **kwargs)
  got2, logp2 = generate(model, tokens, use_cache=False, **kwargs)
  np.testing.assert_array_equal(got, got2)
  np.testing.assert_allclose(logp, logp2, rtol=1e-5, atol=1e-5)
  seq, seg, valid = _continued(tokens, lengths, jnp.zeros_like(tokens), got)
  ref = jax.nn.log_softmax(_forward(model, seq, seg, valid), axis=-1)
  for b in range(2):
    L = int(lengths[b])
    want = [float(ref[b, L - 1 + i, int(got[b, i])]) for i in range(N_NEW)]
    np.testing.assert_allclose(logp[b], want, rtol=1e-5, atol=1e-5)
  assert logp.dtype == jnp.float32 and bool((logp < 0).all())


def test_rows_stop_at_their_end_token_in_both_paths(model):
  """With eos_token_ids a row keeps its end token, then emits the pad (log-probability
  0); the other rows go on; both paths agree, and the lengths count the end token."""
  tokens = jax.random.randint(jax.random.key(8), (2, T_PROMPT), 0, 256, dtype=jnp.int32)
  kwargs = dict(prompt_lengths=jnp.array([6, 8]), max_new_tokens=N_NEW, rng=jax.random.key(9),
                temperature=2.0, return_logp=True, return_lengths=True)
  free, free_logp, free_lengths = generate(model, tokens, **kwargs)
  np.testing.assert_array_equal(free_lengths, [N_NEW, N_NEW])
  end = int(free[0, 1])
  ends_B = [min(int(np.flatnonzero(np.asarray(row) == end)[0]) + 1, N_NEW)
            if end in np.asarray(row) else N_NEW for row in free]
  for use_cache in (True, False):
    got, logp, lengths = generate(model, tokens, eos_token_ids=end, pad_token_id=255,
                                  use_cache=use_cache, **kwargs)
    np.testing.assert_array_equal(lengths, ends_B)
    for b, n in enumerate(ends_B):
      np.testing.assert_array_equal(got[b, :n], free[b, :n])
      np.testing.assert_allclose(logp[b, :n], free_logp[b, :n], rtol=1e-5, atol=1e-5)
      assert (got[b, n:] == 255).all() and (logp[b, n:] == 0).all()


def test_completion_mask_stops_after_the_first_eos():
  from experiments.models import completion_mask
  tokens = jnp.array([[5, 0, 7, 0], [1, 2, 3, 4], [0, 9, 9, 9]])
  np.testing.assert_array_equal(completion_mask(tokens, eos=0),
                                [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
