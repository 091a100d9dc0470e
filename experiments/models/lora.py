"""LoRA on the decoder's projections, through qwix (DESIGN.md §13).

    y = x W + (alpha / rank) · (x A) B        A [contracted dims..., r], B [r, other dims...]

qwix (`LoraProvider`) intercepts the einsum of a target weight inside the module
that owns it and adds the low-rank path; the factors are `nnx.LoRAParam`s named
`<weight>_lora_a` / `<weight>_lora_b` beside the weight (qwix's layout), so
`blocks/<i>/attn/w_q` gets `blocks/<i>/attn/w_q_lora_a` [D, r] and
`w_q_lora_b` [r, Hq, Dh]. B starts at 0: a model with LoRA equals the model
without it until the first update. The factors take the weight's dtype (float64
stays float64) and, when the weight is on a mesh, its sharding (qwix).

`targets` is a regex over weight paths inside the decoder ("blocks/3/attn/w_q");
the supported weights are the attention projections (w_q, w_kv: k and v are one
fused weight, so they share A; w_o) and the dense SwiGLU's (w_gate, w_up, w_down).

Why not `qwix.apply_lora_to_model` on the whole model: in qwix 0.1.8 it wraps one
method of the top module, and the decoder's projections are reached from the
forward, prefill, decode steps and the layer scan's body. We wrap the projection
methods of each target module with qwix's own interceptors instead
(`qwix._src.model._apply_interceptors`), which is what `apply_lora_to_model`
does for its one method, and create the factors by calling those methods once.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
from flax import nnx

from lngram_jax import dataclass_json

_OWNER = "LoRAConfig"
SUFFIXES = ("_lora_a", "_lora_b")
# The projections that can carry LoRA, by module class name, and the methods that
# run their einsums (every mode of the decoder goes through these).
PROJECTIONS = {"Attention": (("w_q", "w_kv", "w_o"), ("qkv", "project_out")),
               "SwiGLU": (("w_gate", "w_up", "w_down"), ("__call__",))}
# PEFT's default for Llama / Qwen2 / Qwen3 is q_proj and v_proj; v is half of our fused
# w_kv, so k gets factors too (DESIGN.md §13).
DEFAULT_TARGETS = r"blocks/\d+/attn/w_(q|kv)"
LORA_STREAM = 0x10A   # folded into the params key: the factors' own draws
ALL_LINEAR = r"blocks/\d+/(attn/w_(q|kv|o)|mlp/w_(gate|up|down))"


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """rank r >= 1; alpha: the scale is alpha / r; dropout: 0 only (below); targets: a
  regex fully matching the weight paths that get factors."""

  rank: int = 8
  alpha: float = 8.0
  dropout: float = 0.0
  targets: str = DEFAULT_TARGETS

  def __post_init__(self):
    dataclass_json.check_positive_int(_OWNER, "rank", self.rank)
    dataclass_json.check_finite(_OWNER, "alpha", self.alpha, above=0.0)
    if self.dropout != 0:
      # qwix draws the dropout mask from a module's rngs, which the trainer's pure-dict
      # step does not advance: every step would drop the same units.
      raise ValueError(f"{_OWNER}: dropout={self.dropout} is not supported (0 only: the "
                       "train step passes no per-step key to qwix's dropout).")
    try:
      re.compile(self.targets)
    except re.error as e:
      raise ValueError(f"{_OWNER}: targets={self.targets!r} is not a regex ({e}).") from None

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def to_dict(self) -> dict:
    return dataclass_json.to_json(self)

  @classmethod
  def from_dict(cls, d: dict) -> LoRAConfig:
    return dataclass_json.from_json(cls, d, owner=_OWNER)


def lora_config(block) -> LoRAConfig | None:
  """The LoRAConfig of a config's `model.lora` block (rank 0 or no block: None)."""
  block = dict(block or {})
  if not int(block.get("rank", 0) or 0):
    return None
  unknown = sorted(set(block) - {f.name for f in dataclasses.fields(LoRAConfig)})
  if unknown:
    raise ValueError(f"model.lora: unknown fields {unknown}.")
  block["targets"] = block.get("targets") or DEFAULT_TARGETS
  block["alpha"] = float(block.get("alpha") or LoRAConfig.alpha)
  return LoRAConfig(**block)


def is_factor(path: str) -> bool:
  """A LoRA factor's parameter path ('.../w_q_lora_a')."""
  return path.endswith(SUFFIXES)


# Path components of inserted branches (experiments/models/lm.py's slots): they train
# beside the factors in an LM run with LoRA, the backbone being frozen.
BRANCH_SLOTS = ("memory", "ffn_branch")


def lora_trainable(path: str) -> bool:
  """The trainable mask of an LM run with LoRA: the factors and the inserted branches."""
  return is_factor(path) or any(slot in path.split("/") for slot in BRANCH_SLOTS)


# --- qwix: the provider and the wrapped module classes ---------------------------------


@functools.cache
def _provider(config: LoRAConfig):
  """qwix's LoraProvider, adding factors only to the weights a module lists in
  `lora_weights` (set by `apply_lora` from `targets`); cached so that every model of one
  config shares one class per module type (equal graphdefs)."""
  import qwix
  from qwix._src.providers import ptq
  from qwix._src.utils import flax_util

  def targeted(rhs) -> bool:
    module = flax_util.get_current_module()
    weights = getattr(module, "lora_weights", ())
    name = flax_util.find_param(rhs, ptq.WithAux)
    if name is None and any(getattr(module, w).shape == rhs.shape for w in weights):
      # qwix follows a cast weight back to its parameter only under jit; outside it,
      # weights of one shape (w_gate, w_up) are told apart by identity alone, which a
      # dtype cast breaks. Never drop the LoRA path silently.
      raise ValueError(f"LoRA: cannot tell which weight of {type(module).__name__} a "
                       f"{rhs.shape} operand is (a cast weight outside jax.jit); run "
                       "the model under jax.jit.")
    return name in weights

  class TargetedLora(qwix.LoraProvider):
    def einsum(self, einsum_str, *operands, **kwargs):
      if len(operands) == 2 and targeted(operands[1]):
        return super().einsum(einsum_str, *operands, **kwargs)
      return ptq.PtqProvider.einsum(self, einsum_str, *operands, **kwargs)

    def dot_general(self, lhs, rhs, *args, **kwargs):
      if targeted(rhs):
        return super().dot_general(lhs, rhs, *args, **kwargs)
      return ptq.PtqProvider.dot_general(self, lhs, rhs, *args, **kwargs)

  return TargetedLora(module_path=".*", rank=config.rank, alpha=float(config.alpha),
                      dropout=0.0)


@functools.cache
def _lora_class(cls: type, config: LoRAConfig) -> type:
  """`cls` with its projection methods run under qwix's LoRA interception."""
  from qwix._src import model as qwix_model
  provider = _provider(config)
  methods = {name: qwix_model._apply_interceptors(getattr(cls, name), provider,  # noqa: SLF001
                                                  output_transform=lambda out: out)
             for name in PROJECTIONS[cls.__name__][1]}

  def __setattr__(self, name, value):
    # qwix's einsum records `<weight>_lora_einsum_str` on the module at every call, for
    # debugging; inside a loop over the module (the sampler's decode loop) NNX refuses
    # that write from an inner trace. Nothing reads it: it is not kept.
    if not name.endswith("_lora_einsum_str"):
      cls.__setattr__(self, name, value)

  return type(cls.__name__, (cls,), {"_unquantized_type": cls, "__module__": cls.__module__,
                                     "__qualname__": cls.__qualname__,
                                     "__setattr__": __setattr__, **methods})


def _probe(module) -> None:
  """Runs the module's projection methods once on zeros, so qwix creates the factors."""
  name = type(module).__name__
  if name == "SwiGLU":
    module(jnp.zeros((1, 1, module.w_gate.shape[0]), module.dtype))
    return
  D, Hq, Dh = module.w_q.shape
  positions = jnp.zeros((3, 1, 1) if module.mrope_axes else (1, 1), jnp.int32)
  module.qkv(jnp.zeros((1, 1, D), module.dtype), positions)
  module.project_out(jnp.zeros((1, 1, Hq, Dh), module.dtype))


def target_paths(model, targets: str) -> dict[tuple, tuple[str, ...]]:
  """{module path: weights} of the supported projections `targets` selects; one line
  for a regex that selects nothing or a parameter no LoRA can reach."""
  pattern = re.compile(targets)
  chosen, unsupported = {}, []
  for path, module in nnx.iter_modules(model):
    kind = PROJECTIONS.get(type(module).__name__)
    prefix = "/".join(map(str, path))
    weights = kind[0] if kind else ()
    for name, value in vars(module).items():
      if not isinstance(value, nnx.Param) or isinstance(value, nnx.LoRAParam):
        continue
      if pattern.fullmatch(f"{prefix}/{name}"):
        if name in weights:
          chosen[tuple(path)] = chosen.get(tuple(path), ()) + (name,)
        else:
          unsupported.append(f"{prefix}/{name}")
  if unsupported:
    raise ValueError(f"lora.targets={targets!r} selects {unsupported[0]}, which is not an "
                     "attention or dense-MLP projection (LoRA reaches w_q, w_kv, w_o, "
                     "w_gate, w_up, w_down).")
  if not chosen:
    raise ValueError(f"lora.targets={targets!r} selects no weight of the decoder (paths "
                     "look like 'blocks/0/attn/w_q', 'blocks/0/mlp/w_down').")
  return chosen


def apply_lora(model, config: LoRAConfig, *, key) -> None:
  """Adds LoRA factors (B = 0) to the targets of `model` (a DecoderLM), in place.

  `key`: the factors' A init (qwix: he_uniform), drawn from a key of its own so that
  every other parameter keeps the draws of the model without LoRA.
  """
  rngs = nnx.Rngs(params=key)
  for path, weights in target_paths(model, config.targets).items():
    module = model
    for part in path:
      module = module[part] if isinstance(part, int) else getattr(module, part)
    module.__class__ = _lora_class(type(module), config)
    # What qwix reads from a module: its path, whether to collect quant stats (never:
    # LoRA only), the rngs of the factors' init (unset after it, as qwix does).
    module.qwix_path = path
    module.disable_quant_stats_update = True
    module.lora_weights = weights
    module.qwix_rngs = rngs
    _probe(module)
    module.qwix_rngs = None


def merged_params(params: dict, scale: float) -> dict:
  """The pure-dict `params` with every factor pair folded into its weight
  (W + scale · A B, A's dims first: our projections contract their leading dims) and
  the factors removed: the parameters of the same model without LoRA."""
  out = {}
  for name, value in params.items():
    if isinstance(value, dict):
      out[name] = merged_params(value, scale)
    elif not is_factor(name):
      a, b = params.get(name + "_lora_a"), params.get(name + "_lora_b")
      out[name] = value if a is None else merge_weight(value, a, b, scale)
  return out


def merge_weight(w, a, b, scale: float):
  """W + scale · A B for A [contracted..., r], B [r, rest...] with W [contracted..., rest...]."""
  r = a.shape[-1]
  if tuple(w.shape) != tuple(a.shape[:-1]) + tuple(b.shape[1:]):
    raise ValueError(f"LoRA factors {a.shape} x {b.shape} do not compose weight {w.shape}.")
  dtype = jnp.promote_types(w.dtype, jnp.float32)   # bf16 weights: the product in float32
  delta = jnp.reshape(a, (-1, r)).astype(dtype) @ jnp.reshape(b, (r, -1)).astype(dtype)
  return (w + scale * jnp.reshape(delta, w.shape).astype(w.dtype)).astype(w.dtype)


def lora_param_count(params) -> int:
  """Elements of the LoRA factors in a pure-dict (or abstract) parameter tree."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  return sum(int(x.size) for path, x in leaves if is_factor(str(path[-1].key)))
