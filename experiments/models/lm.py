"""The decoder-only LM that runs the one decoder block (experiments/models/block.py) in every mode.

`DecoderLM` embeds token ids, runs its blocks and projects to float32 logits, in
the block's modes: the parallel forward (`__call__`, `forward_embedded`: training
and scoring), `prefill` / `prefill_embedded` (right-padded prompts; returns the
`DecodeCache`) and `decode_step` (one token per row). It draws every backbone
parameter first, then the beside-FFN branches, then the memory branches, then the
LoRA factors (`config.lora`), so one seed gives every arm the same backbone;
`config.remat` recomputes each block in the backward (experiments/models/remat.py).

Packed rows carry `segment_ids`: attention, the Lngram windows and its conv
never cross a segment boundary, and positions restart at every segment.
`valid` marks real tokens (padding reads nothing and the Lngram delta is 0
there). Qwen3-VL (experiments/vlm/qwen3vl/) passes multimodal positions
[3, B, T] (`LMConfig.mrope_section`) and per-layer `layer_adds` (its DeepStack
features) to `forward_embedded` / `prefill_embedded`; the VLMs feed embeddings
(`*_embedded`) and decode through `decode_step`.

`DecoderLM(config, scan=True)` draws the same weights, then stacks each run of
two or more blocks without a branch (and of one FFN kind) into one `Block` whose
parameters carry a leading layer axis, and runs that run as one `jax.lax.scan` in
every mode (experiments/models/layer_scan.py): a program then compiles a few
block bodies instead of n_layers (the Table 12 benchmark,
experiments/tools/bench/lm_efficiency.py). `blocks[k]` covers the layers
`layer_spans[k]`; the cache holds one `LayerCache` per entry, stacked likewise.
Parameter paths differ from the unrolled model's, so checkpoints and the trainer
use `scan=False`. Decode is slower scanned. A scanned span reads each layer's K/V
slice as a scanned input, attends to the new token's key beside it (the block's
"decode_rows" mode, `Attention.decode_rows`) and returns only the token's K/V
rows, written into the stacks after the scan; XLA still materialises each
layer's K/V slice and weights out of the stacks (dynamic slices), which the
unrolled model reads in place. At 28 layers, B 1, a 2,048-token cache on CPU
(d 128, float32) a token takes 1.3-1.9x the unrolled model's time
(`experiments.tools.bench.scan_decode`). Carrying the stacks through the scan
instead copied both whole stacks at every layer: 2.3-2.6x on CPU, 1.8x at the
28 x d 2048 shape on an H200. Prefill is not affected. Time decode, and
generate, with `scan=False`.

Parameter paths (stable; optimiser groups and trainable masks use them):
`embed/table`, `blocks/<i>/{memory,attn_norm,attn,mlp_norm,mlp,ffn_branch}/...`
(Lngram tables at `blocks/<i>/memory/tables/<j>`, its router at
`blocks/<i>/memory/router_w`), `final_norm/scale`, `unembed` when untied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.block import Block, Mode, lm_norm, parallel_block, parallel_block_remat
from experiments.models.branches import BranchContext, make_branch
from experiments.models.cache import DecodeCache, LayerCache
from experiments.models.config import LMConfig
from experiments.models.cross_entropy import chunked_token_nll
from experiments.models.generate import Prompt, last_logits, right_padded_prompt
from experiments.models.layer_scan import layer_spans, scan_blocks, stack_blocks
from experiments.models.layers import Embedding, normal, segment_positions
from experiments.models.lora import LORA_STREAM, apply_lora
from lngram_jax.layer import LngramV2

# Block, Mode and layer_spans live beside this module; importers keep reading them here.
__all__ = ["Block", "DecoderLM", "Mode", "default_positions", "layer_spans", "liven_lngram"]


class DecoderLM(nnx.Module):
  """Decoder-only Transformer LM over token ids, with optional slot branches.

  `scan=True` runs runs of branch-free blocks as one `lax.scan` over stacked
  weights (module docstring); the numbers are those of the unrolled model.
  """

  def __init__(self, config: LMConfig, *, rngs: nnx.Rngs, scan: bool = False):
    c = config
    self.config = config
    self.layer_spans = layer_spans(c, scan)
    self.embed = Embedding(c.vocab_size, c.d_model, dtype=c.dtype,
                           param_dtype=c.param_dtype, init_std=c.init_std, rngs=rngs)
    self.blocks = nnx.List([Block(c, i, rngs=rngs) for i in range(c.n_layers)])
    self.final_norm = lm_norm(c)
    self.unembed = None if c.tie_embeddings else nnx.Param(
        normal(c.init_std)(rngs.params(), (c.d_model, c.vocab_size), c.param_dtype))
    # Beside-FFN branches are drawn after the whole backbone, in layer order: the
    # backbone then draws the same numbers with or without them (a model with a
    # branch starts exactly at the base model of the same seed), and the VLM's
    # PVM / MLP inits equal those of its earlier layout (`branches/<i>`).
    for i in c.ffn_branch_layers:
      self.blocks[i].ffn_branch = nnx.data(make_branch(c.ffn_branch, rngs=rngs))
    # Memory-slot branches likewise, after the beside-FFN ones: a seed then gives
    # every arm of a comparison the same backbone init (paired seeds), and models
    # without memory (the VLM) draw what they drew before. (They were drawn inside
    # Block, before each layer's attention, until 2026-12: runs of that code have
    # other backbone inits for memory arms, DESIGN.md §6.3.)
    for i in c.memory_layers:
      self.blocks[i].memory = nnx.data(make_branch(c.memory, rngs=rngs))
    # LoRA factors last, from a key folded off the params stream (its count not
    # advanced), before any stacking: a scanned span stacks them like its weights.
    if c.lora is not None:
      apply_lora(self, c.lora, key=jax.random.fold_in(rngs.params.key[...], LORA_STREAM))
    if scan:  # stacked after every draw: the same weights as scan=False
      self.blocks = nnx.List([self.blocks[a] if b - a == 1 else stack_blocks(self.blocks[a:b])
                              for a, b in self.layer_spans])

  def output_weights(self):
    """(w, vocab_axis) of the output projection: the tied embedding [V, D] (axis 0) or
    `unembed` [D, V] (axis 1)."""
    if self.unembed is None:
      return self.embed.table[...], 0
    return self.unembed[...], 1

  def token_nll(self, hidden_BxTxD, targets_BxT, *, chunk: int | None = None, mesh=None):
    """Cross entropy in nats [B, T] (float32, or float64) of the logits of `hidden` (the
    blocks' output, before the final norm) against `targets`, without materialising the
    [B, T, V] logits (experiments/models/cross_entropy.py); `mesh`: the step's mesh."""
    w, vocab_axis = self.output_weights()
    x_BxTxD = self.final_norm(hidden_BxTxD).astype(self.config.dtype)
    return chunked_token_nll(x_BxTxD, w, targets_BxT, vocab_axis=vocab_axis, chunk=chunk,
                             mesh=mesh)

  def logits(self, x_BxTxD):
    """Final norm and output projection; float32 logits [B, T, V]."""
    x_BxTxD = self.final_norm(x_BxTxD)
    if self.unembed is None:
      return self.embed.attend(x_BxTxD)
    return jnp.einsum("btd,dv->btv", x_BxTxD, self.unembed[...].astype(self.config.dtype),
                      preferred_element_type=jnp.float32)

  def __call__(self, tokens_BxT, *, segment_ids=None, positions=None, valid=None,
               return_aux=False, context: BranchContext | None = None,
               return_hidden: bool = False):
    """logits_BxTxV (float32); with `return_aux` also a dict of diagnostics. With
    `return_hidden` the blocks' output [B, T, D] (before the final norm) instead of the
    logits: `token_nll` takes it to a loss without the [B, T, V] logits.

    aux keys: `memory/<layer>/<name>` (Lngram: `codes` int32 [B, T, R],
    `route_mass` [B, T, Hq], the mass on real routes, not the sink) and
    `ffn_branch/<layer>/<name>`; with `context.probe` also
    `attn/<layer>/probs` [B, Hq, T, T], `ffn_branch/<layer>/probs` (PVM:
    [B, T, Hq, Nv]) and `block/<layer>/hidden` [B, T, D] (each block's output).
    """
    if tokens_BxT.ndim != 2 or not jnp.issubdtype(tokens_BxT.dtype, jnp.integer):
      raise ValueError(
          f"tokens must be an int [B, T] array; got {tokens_BxT.dtype} {tokens_BxT.shape}.")
    context = (context or BranchContext()).replace(tokens_BxT=tokens_BxT)
    return self.forward_embedded(self.embed(tokens_BxT), segment_ids=segment_ids,
                                 positions=positions, valid=valid, return_aux=return_aux,
                                 context=context, return_hidden=return_hidden)

  def forward_embedded(self, x_BxTxD, *, segment_ids=None, positions=None, valid=None,
                       return_aux=False, context: BranchContext | None = None,
                       layer_adds=(), return_hidden: bool = False):
    """The forward from input embeddings [B, T, d] (a continuous input path).

    `context` carries what branches read besides x (text mask, visual tokens,
    token ids, the probe flag); segment_ids and valid are set from the args.
    positions: [B, T], or [3, B, T] with `config.mrope_section` (multimodal
    RoPE). layer_adds: arrays [B, T, d] added to the outputs of layers 0, 1, ...
    (Qwen3-VL's DeepStack features, zero off the image positions). return_hidden: the
    blocks' output instead of the logits (`__call__`).
    """
    B, T = x_BxTxD.shape[:2]
    if T > self.config.max_len:
      raise ValueError(f"sequence length T={T} exceeds max_len={self.config.max_len}.")
    positions_BxT = default_positions((B, T), segment_ids, positions)
    ctx = (context or BranchContext()).replace(segment_ids_BxT=segment_ids, valid_BxT=valid)
    run = parallel_block_remat if self.config.remat else parallel_block

    def body(block, x_BxTxD, _):
      x_BxTxD, block_aux = run(block, x_BxTxD, ctx, positions_BxT)
      return x_BxTxD, (block_aux, x_BxTxD if ctx.probe else None)

    _check_layer_adds(layer_adds, self.layer_spans)
    aux = {}
    for block, (start, stop) in zip(self.blocks, self.layer_spans, strict=True):
      if stop - start == 1:
        x_BxTxD, (block_aux, hidden) = body(block, x_BxTxD, None)
        if start < len(layer_adds):
          x_BxTxD = x_BxTxD + layer_adds[start].astype(x_BxTxD.dtype)
          hidden = x_BxTxD if ctx.probe else None
        per_layer = [(start, block_aux, hidden)]
      else:  # aux and hidden states come stacked over the span's layers
        x_BxTxD, (block_aux, hidden) = scan_blocks(block, body, x_BxTxD)
        per_layer = [(i, {k: v[i - start] for k, v in block_aux.items()},
                      None if hidden is None else hidden[i - start])
                     for i in range(start, stop)]
      for i, layer_aux, layer_hidden in per_layer:
        for key, value in layer_aux.items():
          slot, name = key.split("/", 1)
          aux[f"{slot}/{i}/{name}"] = value
        if ctx.probe:
          aux[f"block/{i}/hidden"] = layer_hidden
    out = x_BxTxD if return_hidden else self.logits(x_BxTxD)
    return (out, aux) if return_aux else out

  # --- decoding ---------------------------------------------------------------

  def init_cache(self, batch: int, max_len: int, *,
                 context: BranchContext | None = None) -> DecodeCache:
    """An empty cache of `max_len` slots per row (prompt + new tokens)."""
    if max_len < 1:
      raise ValueError(f"init_cache: max_len={max_len} must be >= 1.")
    ctx = context or BranchContext()
    layers = []
    for block, (start, stop) in zip(self.blocks, self.layer_spans, strict=True):
      layer_cache = block.init_cache(batch, max_len, ctx)
      if stop - start > 1:
        layer_cache = jax.tree.map(lambda a, n=stop - start: jnp.zeros((n, *a.shape), a.dtype),
                                   layer_cache)
      layers.append(layer_cache)
    return DecodeCache(
        layers=tuple(layers),
        index_B=jnp.zeros((batch,), jnp.int32),
        position_B=jnp.zeros((batch,), jnp.int32),
        key_ok_BxS=jnp.zeros((batch, max_len), bool))

  def prefill(self, tokens_BxT, *, lengths=None, segment_ids=None, cache_len=None,
              context: BranchContext | None = None):
    """Parallel forward over right-padded prompts; returns (logits_BxTxV, cache).

    lengths: int [B] real tokens per row (default all T). cache_len: slots of
    the returned cache (default config.max_len). Logits at t < lengths[b]
    equal `model(tokens, segment_ids=, valid=t < lengths)`.
    """
    context = (context or BranchContext()).replace(tokens_BxT=tokens_BxT)
    return self.prefill_embedded(self.embed(tokens_BxT), lengths=lengths,
                                 segment_ids=segment_ids, cache_len=cache_len, context=context)

  def prefill_embedded(self, x_BxTxD, *, lengths=None, segment_ids=None, cache_len=None,
                       context: BranchContext | None = None, positions=None, layer_adds=()):
    """`prefill` from input embeddings. The cache continues each row after its
    last real token, in that token's segment, at the position after it.

    positions, layer_adds: as in `forward_embedded`; with [3, B, T] positions
    decoding continues at 1 + the largest position of the row's real tokens
    (transformers' rope deltas), the same for t, h and w.
    """
    B, T = x_BxTxD.shape[:2]
    cache_len = self.config.max_len if cache_len is None else cache_len
    if T > cache_len:
      raise ValueError(f"prefill: prompt length T={T} exceeds cache_len={cache_len}.")
    lengths_B = (jnp.full((B,), T, jnp.int32) if lengths is None
                 else jnp.asarray(lengths, jnp.int32))
    valid_BxT = jnp.arange(T, dtype=jnp.int32)[None, :] < lengths_B[:, None]
    positions_BxT = default_positions((B, T), segment_ids, positions)
    rows_B = jnp.arange(B)
    last_B = jnp.clip(lengths_B - 1, 0, T - 1)
    if positions_BxT.ndim == 3:
      next_B = jnp.where(valid_BxT, positions_BxT.max(0), -1).max(1) + 1
    else:
      next_B = positions_BxT[rows_B, last_B] + 1
    key_ok_BxT = valid_BxT
    if segment_ids is not None:
      key_ok_BxT = key_ok_BxT & (segment_ids == segment_ids[rows_B, last_B][:, None])
    ctx = (context or BranchContext()).replace(
        segment_ids_BxT=segment_ids, valid_BxT=valid_BxT, lengths_B=lengths_B)

    def body(block, x_BxTxD, _):
      return block(x_BxTxD, ctx, mode="prefill", positions_BxT=positions_BxT,
                   cache_len=cache_len)

    _check_layer_adds(layer_adds, self.layer_spans)
    layers = []
    for block, (start, stop) in zip(self.blocks, self.layer_spans, strict=True):
      # A span's caches come out of the scan stacked over its layers.
      x_BxTxD, layer_cache = (body(block, x_BxTxD, None) if stop - start == 1
                              else scan_blocks(block, body, x_BxTxD))
      if stop - start == 1 and start < len(layer_adds):
        x_BxTxD = x_BxTxD + layer_adds[start].astype(x_BxTxD.dtype)
      layers.append(layer_cache)
    cache = DecodeCache(
        layers=tuple(layers),
        index_B=lengths_B,
        position_B=next_B.astype(jnp.int32),
        key_ok_BxS=jnp.pad(key_ok_BxT, ((0, 0), (0, cache_len - T))))
    return self.logits(x_BxTxD), cache

  def decode_step(self, tokens_Bx1, cache: DecodeCache, *,
                  context: BranchContext | None = None):
    """Feeds one token per row; returns (logits_BxV float32, new cache)."""
    B = tokens_Bx1.shape[0]
    if tokens_Bx1.shape != (B, 1):
      raise ValueError(f"decode_step: tokens must be [B, 1]; got {tuple(tokens_Bx1.shape)}.")
    rows_B = jnp.arange(B)
    key_ok_BxS = cache.key_ok_BxS.at[rows_B, cache.index_B].set(True)
    ctx = (context or BranchContext()).replace(tokens_BxT=tokens_Bx1)
    x_Bx1xD = self.embed(tokens_Bx1)

    def step(block, x_Bx1xD, layer_cache):
      return block(x_Bx1xD, ctx, mode="decode", positions_BxT=cache.position_B[:, None],
                   cache=layer_cache, index_B=cache.index_B, key_ok_BxS=key_ok_BxS)

    # The slots a scanned layer reads besides its new token (the new slot cleared).
    old_ok_BxS = key_ok_BxS.at[rows_B, cache.index_B].set(False)

    def body(block, x_Bx1xD, kv):
      # Each layer of a span reads its slice of the stacked K/V cache as a scanned
      # input, leaves it unwritten (the new key is attended beside it) and emits
      # only this token's K/V rows; the stacks are written once, after the scan.
      # Carrying the stacks instead made XLA copy both whole stacks at every
      # layer, and writing the row into the slice made it copy the slice.
      return block(x_Bx1xD, ctx, mode="decode_rows", positions_BxT=cache.position_B[:, None],
                   cache=LayerCache(k_BxSxHkvxDh=kv[0], v_BxSxHkvxDh=kv[1]),
                   key_ok_BxS=old_ok_BxS)

    layers = []
    for block, (start, stop), layer_cache in zip(self.blocks, self.layer_spans, cache.layers,
                                                 strict=True):
      if stop - start == 1:
        x_Bx1xD, layer_cache = step(block, x_Bx1xD, layer_cache)
      else:
        k_LxBxSxHkvxDh, v_LxBxSxHkvxDh = layer_cache.k_BxSxHkvxDh, layer_cache.v_BxSxHkvxDh
        x_Bx1xD, (k_LxBxHkvxDh, v_LxBxHkvxDh) = scan_blocks(block, body, x_Bx1xD,
                                                     (k_LxBxSxHkvxDh, v_LxBxSxHkvxDh))
        layer_cache = LayerCache(
            k_BxSxHkvxDh=k_LxBxSxHkvxDh.at[:, rows_B, cache.index_B].set(k_LxBxHkvxDh),
            v_BxSxHkvxDh=v_LxBxSxHkvxDh.at[:, rows_B, cache.index_B].set(v_LxBxHkvxDh))
      layers.append(layer_cache)
    new_cache = DecodeCache(layers=tuple(layers), index_B=cache.index_B + 1,
                            position_B=cache.position_B + 1, key_ok_BxS=key_ok_BxS)
    return self.logits(x_Bx1xD)[:, 0], new_cache

  # --- the sampler's protocol (experiments/models/generate.py) -------------------

  @property
  def decoder(self) -> DecoderLM:
    """The decoder whose max_len and vocabulary bound sampling: this model."""
    return self

  def sampling_prompt(self, prompt_tokens_BxT, *, prompt_lengths=None, images=None) -> Prompt:
    """A right-padded token prompt (lengths in [1, T]) as `prefill_prompt` reads it."""
    if images is not None:
      raise ValueError("generate: pass images= for a VLM and only for a VLM "
                       f"(got a {type(self).__name__} and images=True).")
    tokens_BxT, lengths_B = right_padded_prompt(prompt_tokens_BxT, prompt_lengths, minimum=1)
    return Prompt(tokens_BxT=tokens_BxT, lengths_B=lengths_B)

  def prefill_prompt(self, prompt: Prompt, *, cache_len: int):
    """(logits_BxV at each row's last prompt token, cache)."""
    logits_BxTxV, cache = self.prefill(prompt.tokens_BxT, lengths=prompt.lengths_B,
                                       cache_len=cache_len)
    return last_logits(logits_BxTxV, prompt.lengths_B), cache

  def prompt_logits(self, prompt: Prompt, tokens_BxS, valid_BxS):
    """The full forward's logits [B, S, V] over `tokens_BxS` (the uncached sampler)."""
    return self(tokens_BxS, valid=valid_BxS)


def _check_layer_adds(layer_adds, spans) -> None:
  """Per-layer additions need those layers unstacked (scan=False)."""
  for start, stop in spans:
    if stop - start > 1 and start < len(layer_adds):
      raise ValueError(f"layer_adds reach layers {start}..{stop - 1}, which scan=True "
                       "stacks; build the model with scan=False.")


def default_positions(batch_time, segment_ids, positions):
  """Explicit positions ([B, T] or multimodal [3, B, T]), else per-segment
  positions, else 0..T-1."""
  B, T = batch_time
  if positions is not None:
    if tuple(positions.shape) not in ((B, T), (3, B, T)):
      raise ValueError(f"positions must have shape {(B, T)} or {(3, B, T)}; got "
                       f"{tuple(positions.shape)}.")
    return positions
  if segment_ids is not None:
    return segment_positions(segment_ids)
  return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))


def liven_lngram(model: DecoderLM, *, key: int, w_o_std: float, conv_std: float) -> DecoderLM:
  """Draws nonzero W_O and conv taps for every Lngram memory branch, in place.

  Both are zero at init (the branch then adds exactly nothing), so tests and
  benchmarks that need the branch to do real work call this; layer i draws
  from jax.random.key(key + i).
  """
  for block, (i, _) in zip(model.blocks, model.layer_spans, strict=True):
    if isinstance(block.memory, LngramV2):
      k1, k2 = jax.random.split(jax.random.key(key + i))
      block.memory.w_o[...] = w_o_std * jax.random.normal(k1, block.memory.w_o.shape)
      block.memory.conv_kernel[...] = conv_std * jax.random.normal(
          k2, block.memory.conv_kernel.shape)
  return model
