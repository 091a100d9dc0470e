"""The Qwen3-VL job's plan hooks (`lngram-exp plan`, experiments/plan; the job's
`planner()`): the PVM-on-Qwen3-VL stages (experiments/configs/qwen3vl_pvm_*.py) from
shapes alone.

    check_mesh(config, sizes)             refuses a mesh the stage cannot run on
    abstract_run(config, mesh)            (AbstractRun, model config, geometry): the
                                          stage's train step, abstract state
    counts(config, run, mc, geo, devices, token_shards)   parameters and FLOPs by
                                          formula, the activation estimate, the rows
    mc = qwen3vl_model(config)            the Qwen3VLConfig, no checkpoint needed
    qwen3vl_param_count(mc)               parameters by part (exact)
    qwen3vl_train_flops(mc, geometry)     FLOPs of one compiled step (formula)

The model: `qwen3vl.hf_dir`'s config.json when given (no tensor is read), else
the released checkpoints' config.json fields below (Qwen/Qwen3-VL-8B-Instruct and
Qwen/Qwen3-VL-4B-Instruct; the widths the PVM paper, arXiv 2605.00814, trains
on), or the smoke model; PVM at `qwen3vl.pvm.layers` as the stage adds it (Stage
II's model is Stage I's, of the same arg: `qwen3vl.init_from` is not read). The
step is the one `experiments.jobs.qwen3vl.task.qwen3vl_task` hands the trainer:
Stage I `sft_loss` over [B, T] conversation rows with the trainable mask
`qwen3vl.stage.trainable`; Stage II the GRPO objective (`qwen3vl_grpo_hooks`)
over prompts_per_step · group_size rows of [prompt | completion], the prompt
being the image's tokens + PROMPT_TEXT text tokens (an assumption: the data
decide it). Sampling the completions (prefill + the decode loop to max_new_tokens) is
not part of the train step: it is planned as a program of its own
(`plan --program=rollout`, experiments/plan/rollout.py, which builds on
`qwen3vl_model`, `geometry` and `abstract_params`).
Images: one per row at `qwen3vl.data.image_size` (fixed), grid [1, H/p, W/p].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from experiments.jobs.abstract import AbstractRun, bytes_per_device
from experiments.models.counts import macs_per_token, param_count, train_flops
from experiments.trainer import optimizer as optim_lib
from experiments.trainer import placement as mesh_lib
from experiments.trainer.state import abstract_train_state

PROMPT_TEXT = 64   # Stage II: text tokens of a prompt besides the image's (assumed)
_TEXT = dict(attention_bias=False, head_dim=128, hidden_act="silu", num_attention_heads=32,
             num_hidden_layers=36, num_key_value_heads=8, rms_norm_eps=1e-06,
             max_position_embeddings=262144, rope_theta=5000000, vocab_size=151936,
             model_type="qwen3_vl_text", dtype="bfloat16",
             rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                           "rope_type": "default"})
_VISION = dict(hidden_act="gelu_pytorch_tanh", in_channels=3, num_heads=16,
               num_position_embeddings=2304, patch_size=16, spatial_merge_size=2,
               temporal_patch_size=2, model_type="qwen3_vl")
_IDS = dict(architectures=["Qwen3VLForConditionalGeneration"], model_type="qwen3_vl",
            image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
            vision_end_token_id=151653)
# The released checkpoints' config.json (the fields the loader reads).
CONFIG_JSON = {
    "8b": {**_IDS, "tie_word_embeddings": False,
           "text_config": {**_TEXT, "hidden_size": 4096, "intermediate_size": 12288},
           "vision_config": {**_VISION, "depth": 27, "hidden_size": 1152,
                             "intermediate_size": 4304, "out_hidden_size": 4096,
                             "deepstack_visual_indexes": [8, 16, 24]}},
    "4b": {**_IDS, "tie_word_embeddings": True,
           "text_config": {**_TEXT, "hidden_size": 2560, "intermediate_size": 9728},
           "vision_config": {**_VISION, "depth": 24, "hidden_size": 1024,
                             "intermediate_size": 4096, "out_hidden_size": 2560,
                             "deepstack_visual_indexes": [5, 11, 17]}},
}


def qwen3vl_model(config):
  """The Qwen3VLConfig (PVM included) a qwen3vl stage config trains, from shapes alone."""
  from experiments.hf.qwen3vl.load import qwen3vl_config
  from experiments.jobs.qwen3vl.task import model_config, with_local_checkpoint
  from experiments.vlm.qwen3vl.pvm import with_pvm, with_remat
  q = with_local_checkpoint(config).qwen3vl
  if q.hf_dir:
    return model_config(q)            # its config.json only
  if q.size == "smoke":
    return model_config(q, _smoke_processor())
  if q.size not in CONFIG_JSON:
    raise ValueError(f"plan: qwen3vl.size={q.size!r} is not one of {tuple(CONFIG_JSON)} "
                     "(or give --config.qwen3vl.hf_dir).")
  mc = with_remat(qwen3vl_config(CONFIG_JSON[q.size], max_len=int(q.max_len) or None), q)
  return with_pvm(mc, q.pvm.layers, int(q.pvm.latent_dim)) if q.pvm.layers else mc


def _smoke_processor():
  """The tiny processor the smoke stage writes into its run (its token ids size the model)."""
  import tempfile
  from pathlib import Path

  from experiments.hf.qwen3vl.processor import Qwen3VLProcessor
  from experiments.hf.qwen3vl.synthetic_processor import write_synthetic_processor_dir
  with tempfile.TemporaryDirectory() as tmp:
    return Qwen3VLProcessor.from_dir(write_synthetic_processor_dir(Path(tmp) / "p"))


def geometry(config, mc) -> dict:
  """Rows, row length, patches and visual tokens of one step of the stage."""
  q, v = config.qwen3vl, mc.vision
  h, w = (int(s) for s in q.data.image_size)
  f = v.patch_size * v.spatial_merge_size
  if h % f or w % f:
    raise ValueError(f"qwen3vl.data.image_size={(h, w)} must be multiples of patch_size·"
                     f"spatial_merge_size = {f}.")
  patches = (h // v.patch_size) * (w // v.patch_size)
  visual = patches // v.spatial_merge_size ** 2
  if q.stage.name == "grpo":
    g = q.grpo
    rows, new = int(g.prompts_per_step) * int(g.group_size), int(g.max_new_tokens)
    seq = visual + 2 + PROMPT_TEXT + new   # <vision_start> image <vision_end>, text, completion
  else:
    rows, new, seq = int(config.data.batch_size), 0, int(config.data.seq_len)
  return {"stage": q.stage.name, "rows": rows, "seq_len": seq, "new_tokens": new,
          "patches_per_row": patches, "visual_per_row": visual,
          "grid": (1, h // v.patch_size, w // v.patch_size),
          # Every row holds one image, so its visual memory holds that image's tokens
          # (experiments.jobs.qwen3vl.sft.visual_per_row): what its attention computes.
          "visual_slots": visual}


def _tower_counts(v) -> dict[str, int]:
  E, F, wide = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
  block = 2 * 2 * E + (E * 3 * E + 3 * E) + (E * E + E) + (E * F + F) + (F * E + E)
  merger = wide * wide + wide + wide * v.out_hidden_size + v.out_hidden_size
  return {"embed": v.patch_dim * E + E + v.num_position_embeddings * E,
          "blocks": v.depth * block, "merger": 2 * E + merger,
          "deepstack": len(v.deepstack_visual_indexes) * (2 * wide + merger)}


def qwen3vl_param_count(mc) -> dict[str, int]:
  """{"total", "text", "vision", "pvm"}: the decoder (models/counts.py param_count), the
  vision tower (patch embedding + bias, position table, blocks of two LayerNorms, qkv,
  proj, fc1, fc2 with biases, the merger and DeepStack mergers: LN, fc1 4E×4E, fc2
  4E×D with biases) and the PVM branches (pvm_jax.module.param_count)."""
  from pvm_jax.module import param_count as pvm_count
  text = param_count(mc.text.replace(ffn_branch_layers=(), ffn_branch=None))["total"]
  vision = sum(_tower_counts(mc.vision).values())
  pvm = (pvm_count(mc.text.ffn_branch)["total"] * len(mc.text.ffn_branch_layers)
         if mc.text.ffn_branch_layers else 0)
  return {"total": text + vision + pvm, "text": text, "vision": vision, "pvm": pvm}


def qwen3vl_train_flops(mc, geo: dict) -> dict[str, float]:
  """FLOPs of one compiled train step by part: 2 per multiply-add forward, 2 more for
  each input gradient and each weight gradient the step computes. The step differentiates
  the trained leaves only (experiments/trainer/step.py), so with a frozen part
  (`geo["trainable_name"]`: "branch" = Stage I, "lm+branch" = Stage II; absent or "all":
  everything trains) only the gradients that reach a trained leaf are counted:
    vision  per patch and block E·3E + E·E + 2·E·F + 2·S·E (attention within its
            frame of S patches: one image of one frame per row), per merged token
            (1 + DeepStack) · (4E·4E + 4E·D), the patch embedding P·E (no input
            gradient: pixels); frozen in both stages: forward only
    text    the decoder's layers (models/counts.py macs_per_token) and its unembedding;
            Stage I: layers up to the lowest branch forward only, the layers above it
            with input gradients but no weight gradients (the attention core: both of its
            backward products), the unembedding with its input gradient only (and its
            forward twice: the chunked loss recomputes the logits in the backward);
            Stage II: models/counts.py train_flops, the unembedding at the completion
            tokens only (the objective reads their log-probabilities); remat adds a
            forward of every block
            that has a backward
    pvm     per token and branch d·L + 2·Hq·dh·L + 3·L·F + L·d + 2·Hq·dh·Nv, per
            visual slot d_v·L + 2·Hkv·dh·L (Nv = visual_slots); the lowest Stage-I branch
            needs no input gradient of its first projection, no branch one of the visual
            slots' first projection (the frozen tower's output)."""
  text, v, rows, T = mc.text, mc.vision, geo["rows"], geo["seq_len"]
  trainable = geo.get("trainable_name", "all")
  backbone = text.replace(ffn_branch_layers=(), ffn_branch=None)
  frozen_tower = trainable in ("branch", "lm+branch")
  if trainable == "branch":
    out = {"text": _frozen_text_flops(backbone, min(text.ffn_branch_layers, default=0),
                                      rows=rows, seq_len=T)}
  else:
    out = {"text": train_flops(backbone, batch=rows, seq_len=T)}
  if geo.get("new_tokens"):   # Stage II: logits at the completion tokens only
    out["text"] -= 8.0 * backbone.d_model * backbone.vocab_size * rows * (T - geo["new_tokens"])
  N = rows * geo["patches_per_row"]
  E, F, wide = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
  S = geo["patches_per_row"]
  per_patch = v.depth * (4 * E * E + 2 * E * F + 2 * S * E)
  mergers = (1 + len(v.deepstack_visual_indexes)) * (wide * wide + wide * v.out_hidden_size)
  tower = 2.0 if frozen_tower else 6.0
  out["vision"] = (tower * (N * per_patch + rows * geo["visual_per_row"] * mergers)
                   + (2.0 if frozen_tower else 4.0) * N * v.patch_dim * E)
  out["pvm"] = 0.0
  if text.ffn_branch_layers:
    c, Nv = text.ffn_branch, geo["visual_slots"]
    L, dh = c.latent_dim, c.head_dim
    per_token = (2 * c.d_model * L + 2 * c.q_heads * dh * L + 3 * L * c.ffn_dim
                 + 2 * c.q_heads * dh * Nv)
    slot_in, slot_kv = c.vis_dim * L, 2 * c.kv_heads * dh * L
    per_slot = (4.0 if frozen_tower else 6.0) * slot_in + 6.0 * slot_kv
    branches = len(text.ffn_branch_layers)
    out["pvm"] = branches * rows * (6.0 * T * per_token + Nv * per_slot)
    if trainable == "branch":   # the lowest branch's input h needs no gradient
      out["pvm"] -= 2.0 * rows * T * c.d_model * L
  out["total"] = sum(out.values())
  return out


def _frozen_text_flops(model, lowest: int, *, rows: int, seq_len: int) -> float:
  """The frozen decoder of Stage I (qwen3vl_train_flops): layers 0..lowest forward only,
  the layers above with input gradients (remat: and a second forward). Per-layer
  multiply-adds come from models/counts.py macs_per_token (the Qwen3-VL decoders are dense, so
  every layer costs the same)."""
  if getattr(model, "moe_layers", ()):
    raise ValueError("Stage-I FLOPs assume a dense decoder; this one has MoE layers")
  macs = macs_per_token(model)
  unembed = model.d_model * model.vocab_size
  L = model.n_layers
  if not 0 <= lowest < L:
    raise ValueError(f"the lowest PVM branch layer {lowest} is outside the decoder's {L} layers")
  layer = (macs["matmul"] - unembed) // L
  core = 2 * seq_len * macs["attention"]   # scores and values, per token
  above = L - 1 - lowest
  rerun = 2 if model.remat else 0
  # The unembedding: forward, its recompute in the chunked loss's backward, and the input
  # gradient (experiments/models/cross_entropy.py).
  per_token = (2 * L * (layer + core) + above * ((2 + rerun) * layer + (4 + rerun) * core)
               + 6 * unembed)
  return float(per_token * rows * seq_len)


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def _batch(geo: dict, mc, mesh) -> dict:
  R, T, N = geo["rows"], geo["seq_len"], geo["new_tokens"]
  i32, f32 = jnp.int32, jnp.float32
  pixels = ((R * geo["patches_per_row"], mc.vision.patch_dim), f32)
  if geo["stage"] == "grpo":
    shapes = {"seq_ids": ((R, T), i32), "seq_mask": ((R, T), jnp.bool_),
              "position_ids": ((R, 3, T), i32), "cols": ((R, N), i32), "pixel_values": pixels,
              "completion": ((R, N), i32), "old_logp": ((R, N), f32), "adv": ((R,), f32),
              "mask": ((R, N), jnp.bool_), "reward": ((R,), f32)}
  else:
    shapes = {"input_ids": ((R, T), i32), "attention_mask": ((R, T), jnp.bool_),
              "loss_mask": ((R, T), jnp.bool_), "position_ids": ((R, 3, T), i32),
              "pixel_values": pixels, "idx": ((R,), i32)}
  return {k: jax.ShapeDtypeStruct(s, d, sharding=mesh_lib.batch_sharding(mesh, len(s),
                                                                         tokens=True))
          for k, (s, d) in shapes.items()}


def _loss(config, geo: dict, mesh):
  import numpy as np
  grid = np.tile(np.asarray([geo["grid"]], np.int64), (geo["rows"], 1))
  if geo["stage"] == "grpo":
    from experiments.jobs.qwen3vl.grpo import qwen3vl_grpo_hooks
    return qwen3vl_grpo_hooks(None, config.qwen3vl.grpo, grid_thw=grid, seed=0, eos=0,
                              images_per_row=1, mesh=mesh)[1]
  from experiments.jobs.qwen3vl.sft import sft_loss
  return sft_loss(grid, images_per_row=1, mesh=mesh)


def check_mesh(config, sizes: dict) -> None:
  """One-line refusals of a mesh the stage cannot run on."""
  mc = qwen3vl_model(config)
  geo = geometry(config, mc)
  if sizes.get("seq", 1) > 1:
    raise ValueError(f"mesh.seq={sizes['seq']}: the Qwen3-VL stages do not split time over "
                     "devices; use data or fsdp.")
  for axis in ("table", "expert"):
    if sizes.get(axis, 1) > 1:
      raise ValueError(f"mesh.{axis}={sizes[axis]}: Qwen3-VL + PVM has no {axis} axis to "
                       "split; use data or fsdp.")
  shards = sizes.get("data", 1) * sizes.get("fsdp", 1)
  if geo["rows"] % shards:
    raise ValueError(f"the step's {geo['rows']} rows must be a multiple of mesh.data × "
                     f"mesh.fsdp = {shards}.")


def _module(mc):
  from experiments.vlm.qwen3vl.model import Qwen3VL
  return nnx.eval_shape(lambda: Qwen3VL(mc, rngs=nnx.Rngs(params=0)))


def abstract_params(mc, mesh):
  """(graphdef, params, rest, the decoder's layer spans) of the abstract Qwen3VL of `mc`:
  parameters as ShapeDtypeStructs under the trainer's placement on `mesh`, the rest
  replicated (the rollout's, experiments/plan/rollout.py: no optimizer state)."""
  module = _module(mc)
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
  param_sh = mesh_lib.Placement(mesh, params).params
  replicated = NamedSharding(mesh, P())
  rest = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                      rest)
  return graphdef, _abstract(params, param_sh), rest, tuple(module.lm.layer_spans)


def abstract_run(config, mesh):
  """(AbstractRun, the Qwen3VLConfig, the stage's geometry with what trains): the state
  `experiments.trainer.state.abstract_train_state` builds, the step its `step_fn`."""
  from experiments.jobs.vlm.loss import trainable_mask
  mc = qwen3vl_model(config)
  geo = geometry(config, mc)
  steps = int(config.train.steps)
  trainable = trainable_mask(config.qwen3vl.stage.trainable)
  train = abstract_train_state(_module(mc), config.optim, steps, mesh, trainable=trainable)
  step = train.step_fn(0, _loss(config, geo, mesh),
                       optim_lib.learning_rate_schedule(config.optim, steps),
                       grad_accum=int(config.train.get("grad_accum", 1)))
  params = train.state["params"]
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  trained = sum(math.prod(x.shape) for p, x in flat
                if trainable is None or trainable(optim_lib.path_str(p)))
  geo = {**geo, "trainable": trained, "trainable_name": config.qwen3vl.stage.trainable}
  run = AbstractRun(mc.text, mesh, train.state, train.rest, _batch(geo, mc, mesh), step,
                    geo["rows"] * geo["seq_len"])
  return run, mc, geo


def counts(config, run, mc, geo, devices: int, token_shards: int) -> dict:
  """Parameters and FLOPs by part (formula), the activation estimate, the step's rows."""
  del config, devices
  parts = qwen3vl_train_flops(mc, geo)
  vl = {**geo, "flops_parts": parts, "layers": mc.text.n_layers,
        "pvm_layers": tuple(mc.text.ffn_branch_layers), "vision_depth": mc.vision.depth}
  return {"counts": qwen3vl_param_count(mc), "batch": geo["rows"],
          "seq_len": geo["seq_len"], "vl": vl, "formula": parts["total"],
          "estimate": memory_estimate(mc, geo, token_shards, run)}


def memory_estimate(mc, geo: dict, token_shards: int, run) -> dict[str, int]:
  """Bytes per device: the parameters and optimizer state as the run's shardings hold
  them, and `activations_estimate`."""
  return {"params": bytes_per_device(run.state["params"]),
          "optimizer": bytes_per_device(run.state["opt_state"]),
          "activations": activations_estimate(mc, geo, token_shards)}


def activations_estimate(mc, geo: dict, token_shards: int) -> int:
  """Bytes per device the step keeps alive at its peak, from first principles:

    decoder  per token: with remat each block's input (d values) for every layer plus one
             block's working set (14·d + 3·ffn values); without, every layer's working
             set. Attention is the flash kernels' (O(T): no [T, T] scores kept).
    loss     three [chunk, V] float32 arrays of the chunked cross entropy (logits, their
             softmax, their gradient), chunk = its default over this device's rows
             (experiments/models/cross_entropy.py).
    tower    frozen in both stages, so forward only: one ViT block's working set
             (14·E + 2·F per patch) and its float32 scores within each frame of S
             patches (heads·S per patch).
    PVM      per branch and token, its float32 scores over the row's visual slots,
             kept for the backward (Hq·Nv)."""
  from experiments.models.cross_entropy import LOGITS_BUDGET
  text, v = mc.text, mc.vision
  act = jnp.dtype(text.dtype).itemsize
  tokens = math.ceil(geo["rows"] * geo["seq_len"] / token_shards)
  patches = math.ceil(geo["rows"] * geo["patches_per_row"] / token_shards)
  block = 14 * text.d_model + 3 * text.ffn_dim
  per_token = ((text.n_layers * text.d_model + block) if text.remat
               else text.n_layers * block) * act
  logits = 3 * min(LOGITS_BUDGET // token_shards, tokens * text.vocab_size * 4)
  tower = patches * ((14 * v.hidden_size + 2 * v.intermediate_size) * act
                     + 4 * v.num_heads * geo["patches_per_row"])
  pvm = 0
  if text.ffn_branch_layers:
    pvm = (4 * len(text.ffn_branch_layers) * tokens * text.ffn_branch.q_heads
           * geo["visual_slots"])
  return tokens * per_token + logits + tower + pvm
