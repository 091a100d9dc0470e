"""Windows of whole files and the probe forward of the App. B analyses.

Address stability (B.2) and injection (B.3) compare forwards of several
checkpoints, or of one model with Lngram outputs switched off, on the SAME
positions, and n-gram addresses need every previous position of a window. So
they run their own windows of a few files (no packing across files, the last
window right-padded) instead of the sampled position records.

    windows = file_windows(corpus.val_docs, seq_len=128, max_docs=48)
    out = probe(model, windows)          # numpy: layer inputs, block outputs, codes, logits
    off = probe(without_lngram(model), windows)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.branches import BranchContext
from experiments.models.lm import DecoderLM, default_positions
from lngram_jax.addressing import codes_from_logits
from lngram_jax.layer import LngramV2


@dataclasses.dataclass(frozen=True)
class Windows:
  """Rows of seq_len bytes (token ids of a token run), each from one document; `valid`
  False on padding."""

  tokens_NxT: np.ndarray   # int32
  valid_NxT: np.ndarray    # bool
  doc_N: np.ndarray        # int32, index into the documents analysed
  n_docs: int

  @property
  def n_positions(self) -> int:
    return int(self.valid_NxT.sum())


def file_windows(docs, *, seq_len: int, max_docs: int = 48, windows_per_doc: int = 2,
                 seed: int = 0) -> Windows:
  """The first `windows_per_doc` windows of `max_docs` documents drawn with `seed`.

  The paper's App. B uses 48 documents, fixed across checkpoints and interventions.
  Empty documents are never drawn. Documents keep their corpus order.
  """
  nonempty = [i for i, d in enumerate(docs) if len(d) > 0]
  if not nonempty:
    raise ValueError("file_windows: no non-empty document to analyse.")
  rng = np.random.default_rng(seed)
  picked = sorted(rng.choice(len(nonempty), size=min(max_docs, len(nonempty)),
                             replace=False).tolist())
  tokens, valid, doc = [], [], []
  for d, k in enumerate(picked):
    data = np.asarray(docs[nonempty[k]], np.int32)
    for w in range(min(windows_per_doc, -(-data.size // seq_len))):
      piece = data[w * seq_len:(w + 1) * seq_len]
      row = np.zeros(seq_len, np.int32)
      row[:piece.size] = piece
      tokens.append(row)
      valid.append(np.arange(seq_len) < piece.size)
      doc.append(d)
  return Windows(np.stack(tokens), np.stack(valid), np.asarray(doc, np.int32), len(picked))


def lngram_layers(model: DecoderLM) -> tuple[int, ...]:
  """The layers whose memory slot holds Lngram v2; a ValueError if there is none."""
  layers = tuple(i for i, b in enumerate(model.blocks) if isinstance(b.memory, LngramV2))
  if not layers:
    raise ValueError("this model has no Lngram v2 memory layer to analyse.")
  return layers


def without_lngram(model: DecoderLM, layers=None) -> DecoderLM:
  """A copy whose Lngram branches at `layers` (default all) output exactly 0.

  W_O = 0 makes ṽ = 0, so RMSNorm_c(ṽ) = 0, the conv reads zeros and
  Y = ṽ + SiLU(0) = 0 (DESIGN.md §2.6): the backbone runs as if the branch
  were absent, and the router still sees the same layer input.
  """
  layers = lngram_layers(model) if layers is None else tuple(layers)
  off = nnx.clone(model)
  for i in layers:
    memory = off.blocks[i].memory
    memory.w_o[...] = jnp.zeros_like(memory.w_o[...])
  return off


def _block_parts(block, x_BxTxD, tokens_BxT, valid_BxT):
  """(Lngram delta Y, attention residual, MLP residual) of one block in parallel mode.

  Recomputed from the block's parts (the block returns only its output); the
  test checks that x + Y + attn + mlp equals the block's output.
  """
  B, T = x_BxTxD.shape[:2]
  ctx = BranchContext(tokens_BxT=tokens_BxT, valid_BxT=valid_BxT,
                      attn_norm_scale_D=block.attn_norm.scale[...])
  y_BxTxD, _ = block.memory.forward(x_BxTxD, ctx)
  x_BxTxD = x_BxTxD + y_BxTxD.astype(x_BxTxD.dtype)
  attn_BxTxD = block.attn(block.attn_norm(x_BxTxD), default_positions((B, T), None, None),
                          valid=valid_BxT)
  x_BxTxD = x_BxTxD + attn_BxTxD
  mlp_BxTxD = block.mlp(block.mlp_norm(x_BxTxD))
  if block.ffn_branch is not None:
    mlp_BxTxD = mlp_BxTxD + block.ffn_branch.forward(x_BxTxD, ctx)[0].astype(x_BxTxD.dtype)
  return y_BxTxD, attn_BxTxD, mlp_BxTxD


@functools.partial(jax.jit, static_argnums=(0, 4))
def _probe_batch(graphdef, state, tokens_BxT, valid_BxT, parts: bool):
  model = nnx.merge(graphdef, state)
  logits_BxTxV, aux = model(tokens_BxT, valid=valid_BxT, return_aux=True,
                            context=BranchContext(probe=True))
  L = len(model.blocks)
  outputs = [aux[f"block/{i}/hidden"] for i in range(L)]
  inputs = [model.embed(tokens_BxT)] + outputs[:-1]
  out = {"outputs_LxBxTxD": jnp.stack(outputs).astype(jnp.float32),
         "logits_BxTxV": logits_BxTxV}
  for i in lngram_layers(model):
    out[f"input/{i}"] = inputs[i].astype(jnp.float32)
    out[f"codes/{i}"] = aux[f"memory/{i}/codes"]
    if parts:
      y, attn, mlp = _block_parts(model.blocks[i], inputs[i], tokens_BxT, valid_BxT)
      out[f"y/{i}"], out[f"attn/{i}"], out[f"mlp/{i}"] = (
          a.astype(jnp.float32) for a in (y, attn, mlp))
  return out


def probe(model: DecoderLM, windows: Windows, *, batch: int = 16, parts: bool = False) -> dict:
  """numpy arrays of the forward over every window (batches of `batch` rows).

  Keys: `outputs_LxNxTxD` (each block's output), `logits_NxTxV`, and per Lngram
  layer i: `input/i` (its input, the residual stream before the injection),
  `codes/i` [N, T, R]; with `parts` also `y/i` (the Lngram delta), `attn/i`,
  `mlp/i` (that block's attention and MLP residuals).
  """
  graphdef, state = nnx.split(model)
  N = windows.tokens_NxT.shape[0]
  pieces = []
  for s in range(0, N, batch):
    tokens = windows.tokens_NxT[s:s + batch]
    valid = windows.valid_NxT[s:s + batch]
    n = tokens.shape[0]
    if n < batch and N > batch:   # one compiled shape: pad the last batch
      tokens = np.pad(tokens, ((0, batch - n), (0, 0)))
      valid = np.pad(valid, ((0, batch - n), (0, 0)))
    got = _probe_batch(graphdef, state, jnp.asarray(tokens), jnp.asarray(valid), parts)
    pieces.append({k: np.asarray(v)[:, :n] if k.startswith("outputs") else np.asarray(v)[:n]
                   for k, v in got.items()})
  out = {k: np.concatenate([p[k] for p in pieces], axis=1 if k.startswith("outputs") else 0)
         for k in pieces[0]}
  out["outputs_LxNxTxD"] = out.pop("outputs_LxBxTxD")
  out["logits_NxTxV"] = out.pop("logits_BxTxV")
  return out


@functools.partial(jax.jit, static_argnums=(0, 2))
def _router_codes(graphdef, state, layer, h_NxTxD):
  model = nnx.merge(graphdef, state)
  return codes_from_logits(model.blocks[layer].memory.router_logits(h_NxTxD))


def router_codes(model: DecoderLM, layer: int, h_NxTxD: np.ndarray) -> np.ndarray:
  """Codes [N, T, R] that `model`'s router at `layer` gives the layer input h."""
  graphdef, state = nnx.split(model)
  return np.asarray(_router_codes(graphdef, state, layer, jnp.asarray(h_NxTxD)))
