"""Cross entropy of the output projection without the full float32 logits.

    nll_BxT = chunked_token_nll(x_BxTxD, w, targets_BxT, vocab_axis=0)   w: [V, D] (tied)
    nll_BxT = chunked_token_nll(x_BxTxD, w, targets_BxT, vocab_axis=1)   w: [D, V]
    nll_BxT = token_nll_reference(x_BxTxD, w, targets_BxT, vocab_axis=...)   the twin

nll[b, t] = logsumexp_v(x[b, t]·w_v) - x[b, t]·w_{target[b, t]}, in float32 (float64
for float64 inputs): what `optax.softmax_cross_entropy_with_integer_labels` gives on
the logits x·w, which the reference materialises. At a 151,936-token vocabulary the
float32 logits of one 4,096-token row are 2.5 GB, and their gradient as much again:
the chunked form never holds more than one chunk of them. It walks the time axis in
chunks of `chunk` positions (every row at once, so a batch split over devices stays
split: each device computes its rows' chunk) under a `jax.custom_vjp`:

  forward   per chunk: logits [B, chunk, V] in float32, their log-sum-exp and the
            target's logit; keeps only lse [B, T] for the backward;
  backward  per chunk: the logits again, p = exp(logits - lse),
            dlogits = g·(p - onehot(target)); dx = dlogits·wᵀ, and dw accumulated
            over the chunks in float32 (float64), cast to w's dtype once at the end;
            dw only when w is differentiated (a frozen unembedding, VLM Stage I,
            gets none: `symbolic_zeros` tells the forward which inputs are).

`chunk` defaults to the fewest equal chunks whose logits, over the whole (global)
batch, fit `LOGITS_BUDGET` bytes (per device: the budget divided by the devices the
batch is split over); T is padded to a multiple of it. Targets outside [0, V) are the caller's to mask (they give
nll = lse, as a target logit of 0 would, and no one-hot gradient).

On a mesh (`mesh`), w is gathered whole onto every device once, before the chunks:
an fsdp-split w left to XLA was gathered again inside every chunk (the TPU
compiler's plan of Qwen3-VL-8B Stage I moved 105 GiB per chip and step that way);
its gradient is reduce-scattered back to w's shards once, after them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

LOGITS_BUDGET = 1 << 30   # bytes of float32 logits of one chunk over the whole batch


def _acc(dtype):
  return jnp.promote_types(dtype, jnp.float32)


def _logits(x_BxCxD, w, vocab_axis: int, acc):
  spec = "bcd,vd->bcv" if vocab_axis == 0 else "bcd,dv->bcv"
  return jnp.einsum(spec, x_BxCxD, w.astype(x_BxCxD.dtype), preferred_element_type=acc)


def token_nll_reference(x_BxTxD, w, targets_BxT, *, vocab_axis: int):
  """The twin: nll from the full logits [B, T, V] (float32 or wider)."""
  logits_BxTxV = _logits(x_BxTxD, w, vocab_axis, _acc(x_BxTxD.dtype))
  return jax.nn.logsumexp(logits_BxTxV, axis=-1) - _target_logit(logits_BxTxV, targets_BxT)


def default_chunk(batch: int, time: int, vocab: int, budget: int = LOGITS_BUDGET) -> int:
  """Positions per chunk: as few chunks as keep a chunk's [batch, chunk, vocab] float32
  logits within `budget`, of equal length, so that padding T to a multiple adds less
  than one position per chunk (lengths above 8 rounded up to a multiple of 8)."""
  cap = max(1, budget // max(1, batch * vocab * 4))
  if cap >= time:
    return time
  cap = cap // 8 * 8 if cap >= 8 else cap   # chunks of whole 8-row tiles when they fit
  chunks = -(-time // cap)
  chunk = -(-time // chunks)
  return chunk if chunk <= 8 else -(-chunk // 8) * 8


def chunked_token_nll(x_BxTxD, w, targets_BxT, *, vocab_axis: int, chunk: int | None = None,
                      mesh=None):
  """nll_BxT of the logits x·w without materialising them (module docstring).

  Args:
    x_BxTxD: final hidden states (after the final norm), activation dtype.
    w: the output projection, [V, D] (vocab_axis=0, a tied embedding) or [D, V].
    targets_BxT: int target ids.
    vocab_axis: which axis of `w` is the vocabulary.
    chunk: positions per chunk (None: `default_chunk`); T is padded to a multiple.
    mesh: the device mesh the step is traced on (module docstring), or None.
  """
  if vocab_axis not in (0, 1) or w.ndim != 2:
    raise ValueError(f"chunked_token_nll: w must be 2-D with vocab_axis 0 or 1; got "
                     f"{w.shape}, {vocab_axis=}.")
  if x_BxTxD.ndim != 3 or targets_BxT.shape != x_BxTxD.shape[:2]:
    raise ValueError(f"chunked_token_nll: x {x_BxTxD.shape} must be [B, T, D] and targets "
                     f"{targets_BxT.shape} [B, T].")
  if x_BxTxD.shape[-1] != w.shape[1 - vocab_axis]:
    raise ValueError(f"chunked_token_nll: x width {x_BxTxD.shape[-1]} does not match w "
                     f"{w.shape} (vocab_axis={vocab_axis}).")
  B, T, _ = x_BxTxD.shape
  V = w.shape[vocab_axis]
  chunk = default_chunk(B, T, V) if chunk is None else int(chunk)
  if chunk < 1:
    raise ValueError(f"chunked_token_nll: chunk={chunk} must be >= 1.")
  pad = -T % chunk
  if pad:   # padded positions compute a throwaway nll against target 0
    x_BxTxD = jnp.pad(x_BxTxD, ((0, 0), (0, pad), (0, 0)))
    targets_BxT = jnp.pad(targets_BxT, ((0, 0), (0, pad)))
  if mesh is not None and mesh.size > 1:
    from jax.sharding import NamedSharding, PartitionSpec
    w = jax.lax.with_sharding_constraint(w, NamedSharding(mesh, PartitionSpec()))
  nll_BxT = _chunked_nll(x_BxTxD, w, targets_BxT.astype(jnp.int32), vocab_axis, chunk)
  return nll_BxT[:, :T]


def _chunks(a, chunk: int):
  """[B, T, ...] -> [T/chunk, B, chunk, ...]: the scan's leading axis over time chunks."""
  B, T = a.shape[:2]
  return jnp.moveaxis(a.reshape(B, T // chunk, chunk, *a.shape[2:]), 1, 0)


def _unchunk(a):
  n, B, chunk = a.shape[:3]
  return jnp.moveaxis(a, 0, 1).reshape(B, n * chunk, *a.shape[3:])


def _target_logit(logits_BxCxV, targets_BxC):
  """The target's logit, 0 for a target outside [0, V)."""
  V = logits_BxCxV.shape[-1]
  in_vocab = (targets_BxC >= 0) & (targets_BxC < V)
  picked = jnp.take_along_axis(logits_BxCxV, jnp.clip(targets_BxC, 0, V - 1)[..., None],
                               axis=-1)[..., 0]
  return jnp.where(in_vocab, picked, 0)


def _forward(x_BxTxD, w, targets_BxT, vocab_axis, chunk):
  acc = _acc(x_BxTxD.dtype)

  def step(_, xs):
    x_BxCxD, targets_BxC = xs
    logits_BxCxV = _logits(x_BxCxD, w, vocab_axis, acc)
    lse_BxC = jax.nn.logsumexp(logits_BxCxV, axis=-1)
    picked_BxC = _target_logit(logits_BxCxV, targets_BxC)
    return None, (lse_BxC - picked_BxC, lse_BxC)

  _, (nll, lse) = jax.lax.scan(step, None, (_chunks(x_BxTxD, chunk), _chunks(targets_BxT, chunk)))
  return _unchunk(nll), _unchunk(lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunked_nll(x_BxTxD, w, targets_BxT, vocab_axis, chunk):
  return _forward(x_BxTxD, w, targets_BxT, vocab_axis, chunk)[0]


def _chunked_nll_fwd(x_BxTxD, w, targets_BxT, vocab_axis, chunk):
  # symbolic_zeros: the inputs come as CustomVJPPrimal(value, perturbed).
  x, wv, targets = x_BxTxD.value, w.value, targets_BxT.value
  nll_BxT, lse_BxT = _forward(x, wv, targets, vocab_axis, chunk)
  # Whether w needs a gradient rides in the residuals' structure: None or ().
  return nll_BxT, (x, wv, targets, lse_BxT, None if w.perturbed else ())


def _chunked_nll_bwd(vocab_axis, chunk, residuals, g_BxT):
  x_BxTxD, w, targets_BxT, lse_BxT, w_flag = residuals
  if isinstance(g_BxT, jax.custom_derivatives.SymbolicZero):
    return None, None, None
  with_dw = w_flag is None
  acc = _acc(x_BxTxD.dtype)
  w_cast = w.astype(x_BxTxD.dtype)
  dw_spec = "bcd,bcv->vd" if vocab_axis == 0 else "bcd,bcv->dv"
  dx_spec = "bcv,vd->bcd" if vocab_axis == 0 else "bcv,dv->bcd"

  def step(dw, xs):
    x_BxCxD, targets_BxC, lse_BxC, g_BxC = xs
    logits_BxCxV = _logits(x_BxCxD, w, vocab_axis, acc)
    p_BxCxV = jnp.exp(logits_BxCxV - lse_BxC[..., None])
    V = logits_BxCxV.shape[-1]
    onehot_BxCxV = jax.nn.one_hot(targets_BxC, V, dtype=acc)   # zero rows outside [0, V)
    dlogits_BxCxV = (g_BxC.astype(acc)[..., None] * (p_BxCxV - onehot_BxCxV))
    dx_BxCxD = jnp.einsum(dx_spec, dlogits_BxCxV.astype(x_BxCxD.dtype), w_cast,
                          preferred_element_type=acc).astype(x_BxCxD.dtype)
    if with_dw:
      dw = dw + jnp.einsum(dw_spec, x_BxCxD, dlogits_BxCxV.astype(x_BxCxD.dtype),
                           preferred_element_type=acc)
    return dw, dx_BxCxD

  dw0 = jnp.zeros(w.shape, acc) if with_dw else None
  dw, dx = jax.lax.scan(step, dw0, (_chunks(x_BxTxD, chunk), _chunks(targets_BxT, chunk),
                                    _chunks(lse_BxT, chunk), _chunks(g_BxT, chunk)))
  return _unchunk(dx), (dw.astype(w.dtype) if with_dw else None), None


_chunked_nll.defvjp(_chunked_nll_fwd, _chunked_nll_bwd, symbolic_zeros=True)
