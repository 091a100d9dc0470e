"""Branches for the decoder block's two slots, their protocol and their registry.

A block has a *memory slot* (the branch's delta is added to the residual
stream before attention: Lngram v2, paper §2.4) and a *beside-FFN slot*
(x = x + FFN(norm(x)) + branch(x), the branch reading the post-attention
residual x: PVM, paper §4, or the iso-parameter MLP). Every branch
implements, over the block's input x and a `BranchContext`:

    forward(x_BxTxD, ctx)               -> (y_BxTxD, aux dict)   parallel mode
    prefill(x_BxTxD, ctx)               -> (y_BxTxD, state)      right-padded prompt
    decode_step(x_Bx1xD, state, ctx)    -> (y_Bx1xD, state)      one token per row
    init_decode_state(batch, ctx)       -> state                 an empty history

so the block runs all three modes without knowing which branch it holds, and
cached decoding works for each. A memory-slot branch may also implement the
evaluation metrics protocol (`metric_sums`, `summarise_metrics`:
experiments/jobs/metrics.py); Lngram v2 does, below. A branch class subclasses the layer it wraps
(`LngramMemory(LngramV2)`, `PVMBranch(PVM)`): parameter paths stay those of
the layer (`blocks/<i>/memory/tables/<j>`, `blocks/<i>/ffn_branch/gate`).

The registry (`KINDS`) maps a branch config to its kind name, its module class
and its slot, and serialises configs with a "kind" key; a new arm (PKM,
Engram, ...) is one `register(...)` call here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import Mesh

from experiments.models import layout, memory_stats
from experiments.models.layers import SwiGLU
from lngram_jax import checks, dataclass_json
from lngram_jax.config import LngramConfig
from lngram_jax.decode import init_decode_state, lngram_decode_step, prefill_decode_state
from lngram_jax.layer import LngramV2
from lngram_jax.norms import rms_norm
from lngram_jax.sharding import sharded_layer_apply
from pvm_jax.branch import VisualCache
from pvm_jax.config import PVMConfig
from pvm_jax.module import PVM

Slot = Literal["memory", "ffn"]
SOURCES = ("raw", "hidden")


@struct.dataclass
class BranchContext:
  """What a branch may read besides x; every field optional.

  tokens_BxT: token ids (None where the input is embedded, e.g. image tokens).
  segment_ids_BxT, valid_BxT: packing and padding, as for the LM forward.
  lengths_B: real tokens per row (prefill).
  text_mask_BxT: 1 on text positions, 0 on image positions (None: all text).
  visual_BxNvxD: the projected visual embeddings that enter the LM.
  visual_valid_BxNv: bool, False on visual padding (rows whose images give
    fewer visual tokens than the batch's most); None: every token is real.
  attn_norm_scale_D: the block's pre-attention RMSNorm weight [D] (set by the
    block for its memory slot: Lngram v1's router reads input_layernorm(h)
    with the layer's own norm weights).
  probe: analyses only: branches add their attention probabilities to aux and
    the block its attention probabilities (static, so it picks a program).
  mesh: the device mesh the forward is traced on (static): on more than one
    device Lngram v2 runs its sharded, route-parallel form (experiments/models/
    layout.py); None: the ordinary forward.
  """

  tokens_BxT: jax.Array | None = None
  segment_ids_BxT: jax.Array | None = None
  valid_BxT: jax.Array | None = None
  lengths_B: jax.Array | None = None
  text_mask_BxT: jax.Array | None = None
  visual_BxNvxD: jax.Array | None = None
  visual_valid_BxNv: jax.Array | None = None
  attn_norm_scale_D: jax.Array | None = None
  probe: bool = struct.field(pytree_node=False, default=False)
  mesh: Mesh | None = struct.field(pytree_node=False, default=None)


class Branch(Protocol):
  """The protocol every slot branch implements (see the module docstring)."""

  def forward(self, x_BxTxD, ctx: BranchContext) -> tuple[jax.Array, dict]: ...

  def prefill(self, x_BxTxD, ctx: BranchContext) -> tuple[jax.Array, Any]: ...

  def decode_step(self, x_Bx1xD, state, ctx: BranchContext) -> tuple[jax.Array, Any]: ...

  def init_decode_state(self, batch: int, ctx: BranchContext) -> Any: ...


# --- memory slot --------------------------------------------------------------


class LngramMemory(LngramV2):
  """Lngram v2 in the memory slot; decode state = `lngram_jax.decode` state."""

  def forward(self, x_BxTxD, ctx):
    kwargs = dict(segment_ids=ctx.segment_ids_BxT, valid=ctx.valid_BxT, return_aux=True)
    mesh = layout.sharded(ctx.mesh)
    if mesh is None:
      y_BxTxD, aux = self(x_BxTxD, **kwargs)
    else:   # traced on a training mesh: the route-parallel sharded form
      y_BxTxD, aux = sharded_layer_apply(self, x_BxTxD, mesh=mesh,
                                         sharding=layout.LNGRAM_SHARDING, **kwargs)
    return y_BxTxD, {"codes": aux["codes"], "route_mass": aux["route_mass"]}

  # --- evaluation metrics (the protocol of experiments/jobs/metrics.py) ---------------

  def metric_sums(self, aux, valid_BxT, segment_ids_BxT=None):
    """Per-batch sums (in jit): route mass and tokens, each route's code histogram,
    and per order an indicator of the table rows some valid window read (`_max`:
    merged by maximum)."""
    c = self.config
    ok_BxT = (jnp.ones(aux["codes"].shape[:2], bool) if valid_BxT is None
              else valid_BxT.astype(bool))
    w_BxT = ok_BxT.astype(jnp.float32)
    mass_BxT = aux["route_mass"].astype(jnp.float32).mean(-1)
    sums = {"mass_sum": (mass_BxT * w_BxT).sum(), "tokens": w_BxT.sum(),
            "codes": memory_stats.code_histogram(aux["codes"], ok_BxT, c.codes_per_route)}
    for n in c.orders:
      sums[f"rows/{n}_max"] = memory_stats.rows_touched(
          aux["codes"], segment_ids_BxT, ok_BxT, order=n, bits=c.bits)
    return sums

  @staticmethod
  def summarise_metrics(sums):
    """route_mass (mean probability on real routes), sink_mass (the rest),
    effective_codes (exp entropy of each route's codes, averaged over routes: C
    when every code is used equally, 1 when one is), dead_code_frac (share of
    (route, code) pairs never emitted), rows_touched/<n> (share of the order-n
    table's rows some valid window read)."""
    tokens = max(float(sums["tokens"]), 1.0)
    mass = float(sums["mass_sum"]) / tokens
    counts_RxC = np.asarray(sums["codes"])
    out = {"route_mass": mass, "sink_mass": 1.0 - mass,
           "effective_codes": float(memory_stats.effective_codes(counts_RxC).mean()),
           "dead_code_frac": float((counts_RxC == 0).mean())}
    for key in sorted(k for k in sums if k.startswith("rows/")):
      n = key.removeprefix("rows/").removesuffix("_max")
      out[f"rows_touched/{n}"] = float(np.asarray(sums[key]).mean())
    return out

  def prefill(self, x_BxTxD, ctx):
    return prefill_decode_state(self, x_BxTxD, lengths=ctx.lengths_B,
                                segment_ids=ctx.segment_ids_BxT, valid=ctx.valid_BxT)

  def decode_step(self, x_Bx1xD, state, ctx):
    return lngram_decode_step(self, x_Bx1xD, state)

  def init_decode_state(self, batch, ctx):
    # The state keeps the branch's own dtype (it may differ from the backbone's).
    return init_decode_state(self.config, batch)


# --- beside-FFN slot ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PVMBranchConfig(PVMConfig):
  """A `PVMConfig` plus what the branch reads as its visual memory.

  source: "raw" (the projected visual embeddings that enter the LM, the
    paper's design) or "hidden" (the baseline reading the block's own
    post-attention x at the image positions).
  """

  source: str = "raw"

  def __post_init__(self):
    super().__post_init__()
    if self.source not in SOURCES:
      raise ValueError(f"PVMBranchConfig: source={self.source!r} is not one of {SOURCES}.")


class PVMBranch(PVM):
  """PVM beside the FFN; its decode state is the `VisualCache` of the image.

  The cache is built once (at prefill) from ctx.visual_BxNvxD ("raw") or
  from x at the first Nv positions ("hidden"; the VLM puts the image first),
  then reused by every decode step.
  """

  def __init__(self, config: PVMConfig, *, rngs: nnx.Rngs):
    super().__init__(config, rngs=rngs)
    self.source = getattr(config, "source", "raw")

  def _cache(self, x_BxTxD, ctx) -> VisualCache:
    if ctx.visual_BxNvxD is None:
      raise ValueError("PVMBranch: the context has no visual_BxNvxD (the image tokens).")
    if self.source == "raw":
      return self.visual_cache(ctx.visual_BxNvxD, ctx.visual_valid_BxNv)
    return self.visual_cache(x_BxTxD[:, :ctx.visual_BxNvxD.shape[1]])

  def forward(self, x_BxTxD, ctx):
    y_BxTxD, p_BxTxHqxNv = self(x_BxTxD, cache=self._cache(x_BxTxD, ctx),
                                text_mask=ctx.text_mask_BxT, return_probs=True)
    return y_BxTxD, ({"probs": p_BxTxHqxNv} if ctx.probe else {})

  def prefill(self, x_BxTxD, ctx):
    cache = self._cache(x_BxTxD, ctx)
    return self(x_BxTxD, cache=cache, text_mask=ctx.text_mask_BxT), cache

  def decode_step(self, x_Bx1xD, state, ctx):
    return self(x_Bx1xD, cache=state, text_mask=ctx.text_mask_BxT), state

  def init_decode_state(self, batch, ctx):
    """A placeholder of the real cache's shapes, every visual token invalid:
    only a prefill over [image | prompt] gives the branch something to read."""
    if ctx.visual_BxNvxD is None:
      raise ValueError("PVMBranch.init_decode_state: the context needs visual_BxNvxD "
                       "(its Nv sizes the cache).")
    c = self.config
    Nv = ctx.visual_BxNvxD.shape[1]
    zeros = jnp.zeros((batch, Nv, c.kv_heads, c.head_dim), c.dtype)
    return VisualCache(k=zeros, v=zeros, valid=jnp.zeros((batch, Nv), bool))


@dataclasses.dataclass(frozen=True)
class ParallelMLPConfig:
  """The iso-parameter baseline of PVM: hidden_dim F of a parallel SwiGLU."""

  d_model: int
  hidden_dim: int
  init_std: float = 0.02
  eps: float = 1e-6

  def __post_init__(self):
    for name in ("d_model", "hidden_dim"):
      dataclass_json.check_positive_int("ParallelMLPConfig", name, getattr(self, name))
    if not self.init_std > 0 or not self.eps > 0:
      raise ValueError(f"ParallelMLPConfig: init_std={self.init_std} and eps={self.eps} "
                       "must be > 0.")


class ParallelMLP(nnx.Module):
  """Iso-parameter baseline: y = λ · RMSNorm_affine-free(SwiGLU(x)) · text_mask.

  Same gate, output norm and text mask as PVM, but no cross-attention: it sees
  the text position's own hidden state only, so it has no decode state.
  """

  def __init__(self, config: ParallelMLPConfig, *, rngs: nnx.Rngs):
    self.config = c = config
    self.mlp = SwiGLU(c.d_model, c.hidden_dim, dtype=jnp.float32, param_dtype=jnp.float32,
                      init_std=c.init_std, out_std=c.init_std, rngs=rngs)
    self.gate = nnx.Param(jnp.zeros((), jnp.float32))

  def __call__(self, x_BxTxD, text_mask_BxT=None):
    if text_mask_BxT is None:
      return self.gate[...] * rms_norm(self.mlp(x_BxTxD), eps=self.config.eps)
    # As PVM: bool or 0/1, and image positions compute from zeros (a select).
    text_BxTx1 = checks.check_valid("text_mask", text_mask_BxT, x_BxTxD.shape[:2])[..., None]
    x_BxTxD = jnp.where(text_BxTx1, x_BxTxD, 0).astype(x_BxTxD.dtype)
    y_BxTxD = self.gate[...] * rms_norm(self.mlp(x_BxTxD), eps=self.config.eps)
    return jnp.where(text_BxTx1, y_BxTxD, 0)

  def forward(self, x_BxTxD, ctx):
    return self(x_BxTxD, ctx.text_mask_BxT), {}

  def prefill(self, x_BxTxD, ctx):
    return self(x_BxTxD, ctx.text_mask_BxT), None

  def decode_step(self, x_Bx1xD, state, ctx):
    return self(x_Bx1xD, ctx.text_mask_BxT), state

  def init_decode_state(self, batch, ctx):
    return None


# --- registry -----------------------------------------------------------------


def _from_json(cls) -> Callable[[dict], Any]:
  """The JSON reader of a plain config class (lngram_jax.dataclass_json)."""
  return functools.partial(dataclass_json.from_json, cls)


@dataclasses.dataclass(frozen=True)
class Kind:
  """One registered branch: its config class(es), module class and slot."""

  name: str
  slot: Slot
  accepts: tuple[type, ...]          # config classes of this kind (isinstance)
  module: type
  to_dict: Callable[[Any], dict]
  from_dict: Callable[[dict], Any]


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> None:
  KINDS[kind.name] = kind


register(Kind("lngram", "memory", (LngramConfig,), LngramMemory,
              lambda c: c.to_dict(), LngramConfig.from_dict))
register(Kind("pvm", "ffn", (PVMConfig,), PVMBranch,
              lambda c: c.to_dict(), PVMBranchConfig.from_dict))
register(Kind("mlp", "ffn", (ParallelMLPConfig,), ParallelMLP,
              dataclass_json.to_json, _from_json(ParallelMLPConfig)))


def kind_of(config) -> Kind:
  for kind in KINDS.values():
    if isinstance(config, kind.accepts):
      return kind
  raise ValueError(f"no registered branch takes a {type(config).__name__} "
                   f"(known kinds: {sorted(KINDS)}).")


def config_to_dict(config) -> dict:
  """A JSON-ready dict of a branch config, with its "kind"."""
  kind = kind_of(config)
  return {"kind": kind.name, **kind.to_dict(config)}


def config_from_dict(d: dict):
  d = dict(d)
  name = d.pop("kind", None)
  if name not in KINDS:
    raise ValueError(f"branch config kind={name!r} is not one of {sorted(KINDS)}.")
  return KINDS[name].from_dict(d)


def canonical(config):
  """The config as its kind rebuilds it (a PVMConfig becomes a PVMBranchConfig),
  so a JSON round trip gives back an equal config."""
  return None if config is None else config_from_dict(config_to_dict(config))


def make_branch(config, *, rngs: nnx.Rngs) -> Branch:
  return kind_of(config).module(config, rngs=rngs)


def arm_kind(module) -> Kind:
  """The registry entry of a comparison arm (experiments/models/arms/<name>.py).

  An arm module defines NAME (the kind), SLOT ("memory"), CONFIG (a frozen
  dataclass whose first field is d_model) and MODULE (the branch class).
  """
  return Kind(module.NAME, module.SLOT, (module.CONFIG,), module.MODULE,
              dataclass_json.to_json, _from_json(module.CONFIG))


# --- the comparison arms of the Lngram paper ------------------------------------
# Imported last: an arm module defines its config and module without this file.
from experiments.models.arms import engram, lngram_v1, pkm, sparse_ffn  # noqa: E402

for _arm in (pkm, engram, lngram_v1, sparse_ffn):
  register(arm_kind(_arm))
