"""Qwen3-VL: the vision tower + the repository's one decoder (`DecoderLM`) with multimodal RoPE.

    v_MxD, deepstack = visual(pixel_values_NxP, image_grid_thw)
    x_BxTxD = embed(input_ids), with v scattered into the image-token positions
              (reading order over the batch: transformers' masked_scatter)
    logits  = lm.forward_embedded(x, positions = rope_index(...) [3, B, T],
                                  valid = attention_mask,
                                  layer_adds = deepstack[k] at the image positions,
                                  added to the output of LM layer k)

The beside-FFN slot (PVM) reads the merged visual embeddings v, before any
DeepStack add, per row as `visual_BxNvxD` (a row's image tokens in order,
zero-padded to the batch's most), with the text mask = not an image token;
the memory slot (Lngram, the arms) sees the decoder's x as in the LM.
Parameter paths: `visual/...` (experiments/vlm/qwen3vl/vision.py), `lm/...`.
Mirrors transformers' `Qwen3VLForConditionalGeneration` (images; no video).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.branches import BranchContext
from experiments.models.generate import Prompt, last_logits
from experiments.models.lm import DecoderLM
from experiments.vlm.qwen3vl.config import Qwen3VLConfig
from experiments.vlm.qwen3vl.positions import rope_index
from experiments.vlm.qwen3vl.vision import VisionTower

_TOWER_STREAM = 1   # fold_in constant of the vision tower's key (see Qwen3VL.__init__)


def _host(a):
  """A numpy copy of a concrete array, or None under a trace."""
  try:
    return None if a is None else np.asarray(a)
  except Exception:  # a tracer: shapes only
    return None


class Qwen3VL(nnx.Module):
  """See the module docstring. `lm` is a `DecoderLM` of `config.text`."""

  def __init__(self, config: Qwen3VLConfig, *, rngs: nnx.Rngs):
    self.config = config
    # The decoder is drawn first: with the same seed it is the DecoderLM of config.text.
    # The tower draws from a key folded off the stream's current one, not from the
    # stream after the decoder: branches in the decoder (PVM, Lngram) then leave the
    # tower's init unchanged, so a seed gives every arm the same backbone.
    tower_key = jax.random.fold_in(rngs.params.key[...], _TOWER_STREAM)
    self.lm = DecoderLM(config.text, rngs=rngs)
    self.visual = VisionTower(config.vision, rngs=nnx.Rngs(params=tower_key))

  def check_image_tokens(self, input_ids_BxT: np.ndarray, image_grid_thw) -> None:
    """Raise unless the ids hold exactly the merged visual tokens the images give
    (none without images): prod(grid) / spatial_merge_size² per image."""
    held = int((np.asarray(input_ids_BxT) == self.config.image_token_id).sum())
    if image_grid_thw is None:
      if held:
        raise ValueError("input_ids hold image tokens but no pixel_values were given.")
      return
    merge = self.config.vision.spatial_merge_size
    given = int(np.asarray(image_grid_thw).prod(1).sum()) // merge ** 2
    if held != given:
      raise ValueError(f"input_ids hold {held} image tokens; the images give {given} "
                       "(image_grid_thw).")

  def embed_inputs(self, input_ids_BxT, pixel_values=None, image_grid_thw=None):
    """(x_BxTxD, layer_adds, image_mask_BxT, v_MxD): the decoder's input embeddings,
    the DeepStack additions [B, T, D] per layer and the merged visual tokens."""
    c = self.config
    ids_BxT = jnp.asarray(input_ids_BxT)
    x_BxTxD = self.lm.embed(ids_BxT)
    image_BxT = ids_BxT == c.image_token_id
    if pixel_values is None:
      host = _host(input_ids_BxT)
      if host is not None:
        self.check_image_tokens(host, None)
      return x_BxTxD, (), image_BxT, None
    if image_grid_thw is None:
      raise ValueError("pixel_values need image_grid_thw.")
    host = _host(input_ids_BxT)
    if host is not None:
      self.check_image_tokens(host, image_grid_thw)
    v_MxD, deepstack = self.visual(jnp.asarray(pixel_values), np.asarray(image_grid_thw))
    M = v_MxD.shape[0]
    # The k-th image token of the batch (reading order) takes visual token k.
    order_BxT = jnp.clip(jnp.cumsum(image_BxT.ravel()) - 1, 0, M - 1).reshape(image_BxT.shape)

    def scatter(values_MxD, base_BxTxD):
      return jnp.where(image_BxT[..., None], values_MxD[order_BxT].astype(base_BxTxD.dtype),
                       base_BxTxD)

    x_BxTxD = scatter(v_MxD, x_BxTxD)
    zeros_BxTxD = jnp.zeros_like(x_BxTxD)
    layer_adds = tuple(scatter(d_MxD, zeros_BxTxD) for d_MxD in deepstack)
    return x_BxTxD, layer_adds, image_BxT, v_MxD

  def context(self, input_ids_BxT, image_BxT, v_MxD, n_visual: int | None = None
              ) -> BranchContext:
    """What the slot branches read: token ids, the text mask, each row's visual tokens.

    n_visual: the width of `visual_BxNvxD`; by default the most image tokens of a
    row when the ids are concrete, else min(T, M) (a row holds at most all M
    visual tokens of the batch, and T tokens)."""
    ctx = BranchContext(tokens_BxT=jnp.asarray(input_ids_BxT), text_mask_BxT=~image_BxT)
    if not self.config.text.ffn_branch_layers:
      return ctx
    B, T = image_BxT.shape
    host = _host(input_ids_BxT)
    n_max = (n_visual if n_visual is not None
             else min(T, max(1, 0 if v_MxD is None else v_MxD.shape[0])) if host is None
             else self.visual_width(host))
    if v_MxD is None:
      visual_BxNvxD = jnp.zeros((B, n_max, self.config.text.d_model), self.config.text.dtype)
      real_BxNv = jnp.zeros((B, n_max), bool)
    else:
      # Row b's image tokens first (stable order), then the rest: a per-row gather.
      first_BxT = jnp.argsort(~image_BxT, axis=1, stable=True)[:, :n_max]
      order_BxT = jnp.clip(jnp.cumsum(image_BxT.ravel()) - 1, 0,
                           v_MxD.shape[0] - 1).reshape(B, T)
      take_BxNv = jnp.take_along_axis(order_BxT, first_BxT, axis=1)
      real_BxNv = jnp.take_along_axis(image_BxT, first_BxT, axis=1)
      visual_BxNvxD = jnp.where(real_BxNv[..., None], v_MxD[take_BxNv], 0).astype(
          self.config.text.dtype)
    return ctx.replace(visual_BxNvxD=visual_BxNvxD, visual_valid_BxNv=real_BxNv)

  def visual_width(self, input_ids_BxT: np.ndarray) -> int:
    """The most image tokens of a row (at least 1): the width of a concrete batch's
    `visual_BxNvxD`."""
    return max(1, int((np.asarray(input_ids_BxT) == self.config.image_token_id).sum(1).max()))

  def positions(self, input_ids_BxT, image_grid_thw=None, attention_mask_BxT=None,
                mm_token_type_ids=None):
    """Multimodal position ids int32 [3, B, T] (`positions.rope_index`)."""
    position_3xBxT, _ = rope_index(input_ids_BxT, image_grid_thw, attention_mask_BxT,
                                   self.config, mm_token_type_ids=mm_token_type_ids)
    return jnp.asarray(position_3xBxT, jnp.int32)

  def __call__(self, input_ids_BxT, *, pixel_values=None, image_grid_thw=None,
               attention_mask_BxT=None, mm_token_type_ids=None, position_ids=None,
               return_aux=False, return_hidden=False, n_visual: int | None = None,
               mesh=None):
    """(logits_BxTxV float32, aux). Padding (attention_mask 0) may sit on either side.

    input_ids / image_grid_thw / mm_token_type_ids are read on the host to
    build the positions unless `position_ids` [3, B, T] are given. return_hidden: the
    decoder's output [B, T, D] before its final norm instead of the logits (the loss
    takes it to `self.lm.token_nll`). n_visual: the visual slots a row's PVM memory
    holds (`context`; a batch whose rows hold the same image count passes that
    count's tokens, so each row attends to its own image only). mesh: the training
    mesh the step runs on (`BranchContext.mesh`: attention then runs its kernel per
    batch shard).
    """
    if position_ids is None:
      position_ids = self.positions(input_ids_BxT, image_grid_thw, attention_mask_BxT,
                                    mm_token_type_ids)
    x_BxTxD, layer_adds, image_BxT, v_MxD = self.embed_inputs(input_ids_BxT, pixel_values,
                                                              image_grid_thw)
    valid_BxT = None if attention_mask_BxT is None else jnp.asarray(attention_mask_BxT,
                                                                    bool)
    context = self.context(input_ids_BxT, image_BxT, v_MxD, n_visual=n_visual)
    if mesh is not None:
      context = context.replace(mesh=mesh)
    return self.lm.forward_embedded(
        x_BxTxD, positions=jnp.asarray(position_ids, jnp.int32), valid=valid_BxT,
        context=context, layer_adds=layer_adds, return_aux=True, return_hidden=return_hidden)

  # --- decoding -----------------------------------------------------------------

  def prefill(self, input_ids_BxT, *, pixel_values=None, image_grid_thw=None,
              attention_mask_BxT=None, mm_token_type_ids=None, cache_len: int):
    """(logits_BxTxV, cache) over right-padded prompts (`pack_right` packs any
    padding): the vision tower runs once; the cache holds every layer's K/V,
    the PVM layers' visual K/V, and each row's next position (rope deltas)."""
    prompt = self.right_padded_prompt(
        input_ids_BxT, pixel_values=pixel_values, image_grid_thw=image_grid_thw,
        attention_mask_BxT=attention_mask_BxT, mm_token_type_ids=mm_token_type_ids)
    static = dict(prompt.static)
    return _prefill(self, prompt.tokens_BxT, prompt.inputs["pixel_values"], prompt.lengths_B,
                    prompt.inputs["positions"], grid_thw=static["grid_thw"],
                    cache_len=cache_len, n_visual=static["n_visual"])

  def right_padded_prompt(self, input_ids_BxT, *, pixel_values=None, image_grid_thw=None,
                          attention_mask_BxT=None, mm_token_type_ids=None) -> Prompt:
    """The prefill's `Prompt` of right-padded rows, built on the host: the checks, the
    multimodal positions [3, B, T] (inputs "positions", with "pixel_values") and the
    static image grids and visual width."""
    ids = np.asarray(input_ids_BxT)
    B, T = ids.shape
    mask_BxT = (np.ones((B, T), bool) if attention_mask_BxT is None
                else np.asarray(attention_mask_BxT).astype(bool))
    lengths_B = mask_BxT.sum(1)
    if (mask_BxT != (np.arange(T)[None] < lengths_B[:, None])).any():
      raise ValueError("prefill: rows must be right-padded (experiments.vlm.qwen3vl.generate."
                       "pack_right).")
    if pixel_values is not None and image_grid_thw is None:
      raise ValueError("pixel_values need image_grid_thw.")
    grid_thw = (None if pixel_values is None
                else tuple(tuple(int(n) for n in row) for row in np.asarray(image_grid_thw)))
    self.check_image_tokens(ids, grid_thw)
    position_3xBxT = self.positions(ids, image_grid_thw, mask_BxT, mm_token_type_ids)
    return Prompt(
        tokens_BxT=jnp.asarray(ids), lengths_B=jnp.asarray(lengths_B, jnp.int32),
        inputs={"pixel_values": None if pixel_values is None else jnp.asarray(pixel_values),
                "positions": position_3xBxT},
        static=(("grid_thw", grid_thw), ("n_visual", self.visual_width(ids)), ("mesh", None)))

  def decode_step(self, tokens_Bx1, cache):
    """One text token per row (t = h = w = the cache's next position); returns
    (logits_BxV float32, next cache)."""
    ctx = BranchContext(text_mask_BxT=jnp.ones(tokens_Bx1.shape, bool))
    return self.lm.decode_step(tokens_Bx1, cache, context=ctx)

  # --- the sampler's protocol (experiments/models/generate.py) -------------------

  @property
  def decoder(self) -> DecoderLM:
    """The decoder whose max_len and vocabulary bound sampling."""
    return self.lm

  def sampling_prompt(self, inputs: dict, *, prompt_lengths=None, images=None) -> Prompt:
    """A processor's batch (numpy; rows padded on either side) as `prefill_prompt`
    reads it: each row packed to the right (`pack_right`), then `right_padded_prompt`."""
    if prompt_lengths is not None or images is not None:
      raise ValueError("generate: Qwen3-VL samples from its processor's batch (input_ids, "
                       "attention_mask, pixel_values, image_grid_thw); pass no "
                       "prompt_lengths= or images=.")
    packed = pack_right(inputs)
    return self.right_padded_prompt(
        packed["input_ids"], pixel_values=packed.get("pixel_values"),
        image_grid_thw=packed.get("image_grid_thw"),
        attention_mask_BxT=packed["attention_mask"],
        mm_token_type_ids=packed.get("mm_token_type_ids"))

  def prefill_prompt(self, prompt: Prompt, *, cache_len: int):
    """(logits_BxV at each row's last prompt token, cache), traceable."""
    static = dict(prompt.static)
    logits_BxTxV, cache = prefill_packed(
        self, prompt.tokens_BxT, prompt.inputs["pixel_values"], prompt.lengths_B,
        prompt.inputs["positions"], grid_thw=static["grid_thw"], cache_len=cache_len,
        n_visual=static["n_visual"], mesh=static["mesh"])
    return last_logits(logits_BxTxV, prompt.lengths_B), cache

  def prompt_logits(self, prompt: Prompt, tokens_BxS, valid_BxS):
    raise ValueError("generate: Qwen3-VL decodes with its cache only; the uncached "
                     "reference is experiments.vlm.qwen3vl.generate.greedy_generate_uncached.")


def pack_right(inputs: dict) -> dict:
  """The dict with each row's real tokens moved to the front (padding after them):
  `input_ids`, `attention_mask`, `mm_token_type_ids` (when present) rearranged,
  plus `lengths` int32 [B]. pixel_values and image_grid_thw stay as they are.
  Positions count real tokens only, so packing changes none."""
  ids_BxT = np.asarray(inputs["input_ids"])
  B, T = ids_BxT.shape
  mask_BxT = np.asarray(inputs.get("attention_mask", np.ones((B, T)))).astype(bool)
  order_BxT = np.argsort(~mask_BxT, axis=1, kind="stable")
  out = dict(inputs)
  out["input_ids"] = np.where(np.sort(~mask_BxT, axis=1), 0,
                              np.take_along_axis(ids_BxT, order_BxT, axis=1))
  out["attention_mask"] = np.take_along_axis(mask_BxT, order_BxT, axis=1).astype(np.int64)
  if inputs.get("mm_token_type_ids") is not None:
    types = np.asarray(inputs["mm_token_type_ids"])
    out["mm_token_type_ids"] = np.take_along_axis(types, order_BxT, axis=1) * out[
        "attention_mask"]
  out["lengths"] = mask_BxT.sum(1).astype(np.int32)
  return out


def prefill_packed(model, ids_BxT, pixel_values, lengths_B, position_3xBxT, *, grid_thw,
                   cache_len, n_visual, mesh=None):
  """`Qwen3VL.prefill` after its host work, traceable: (logits_BxTxV, cache). `mesh`:
  the step's mesh in the branch context, so that attention runs its kernel per batch
  shard (a Pallas call is not partitioned by XLA)."""
  x_BxTxD, layer_adds, image_BxT, v_MxD = model.embed_inputs(
      ids_BxT, pixel_values, None if grid_thw is None else np.asarray(grid_thw))
  context = model.context(ids_BxT, image_BxT, v_MxD, n_visual=n_visual)
  return model.lm.prefill_embedded(
      x_BxTxD, lengths=lengths_B, cache_len=cache_len,
      context=context if mesh is None else context.replace(mesh=mesh),
      positions=position_3xBxT, layer_adds=layer_adds)


@nnx.jit(static_argnames=("grid_thw", "cache_len", "n_visual"))
def _prefill(model, ids_BxT, pixel_values, lengths_B, position_3xBxT, *, grid_thw, cache_len,
             n_visual):
  """`prefill_packed` as one compiled program: the image grids (a shape of the vision
  tower), the cache length and the visual width are static, so each distinct prompt
  shape compiles once."""
  return prefill_packed(model, ids_BxT, pixel_values, lengths_B, position_3xBxT,
                        grid_thw=grid_thw, cache_len=cache_len, n_visual=n_visual)
