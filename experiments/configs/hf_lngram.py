"""Lngram v2 inserted into a pretrained Hugging Face model (the paper's Table 13 recipe).

    lngram-exp train --config=experiments/configs/hf_lngram.py \
        --config.init_from=hf:CHECKPOINT_DIR --config.data.kind=tokens \
        --config.data.path=DATA --config.mesh.fsdp=8 --workdir=runs/hf_lngram

CHECKPOINT_DIR holds a Qwen3 / Llama / Qwen2 `config.json` and safetensors
(DESIGN.md §11); DATA is a `lngram-exp prepare-data` directory made with the
checkpoint's own tokenizer (`--tokenizer=CHECKPOINT_DIR/tokenizer.json`).
`init_from=hf:DIR` must be given: the backbone shape fields below are 0, which
means "from config.json" (a run without it is refused in one line).

Defaults: Table 13's Keye2B column. Memory in layers 2 and 14 of the paper's
1-based numbering (memory_layers (1, 13)); R 121 routes of 4-bit codes, orders
2 and 3, memory width 128, readout 16 query / 16 KV heads of dim 128, sink
route mass 0.5, the one-bit surrogate, a short conv of kernel 4 dilation 3;
the output projection and the conv start at zero, so step 0 computes the
checkpoint's logits. Learning rates: tables 4e-4 -> 1e-5, Lngram's other
parameters 1e-4 -> 2e-6, both without weight decay; the backbone 5e-6 with
weight decay 0.1 (`optim.backbone_lr`, experiments/trainer/optimizer.py);
1,000 linear warm-up steps, then cosine. The paper states the backbone
settings for Keye30B only (Keye2B's are not given); we use those, and cosine
to the same 0.02 of peak as the non-table group (the minimum is not stated).
Batch and sequence length here are a single host's; the paper's global batch
is 32 sequences of 32,768 tokens.

Before anything is allocated, `train` prints the parameter, activation and
optimizer-state memory per device for `plan_devices` devices (default 8).

The arg (comma-separated) picks the arm, as the byte LM's configs do, so the
paper's Table 2 comparison runs on a real backbone:
  pkm | engram | v1 | sparse_ffn | none   the arm in the same layers instead of
                        Lngram v2 (their byte-LM defaults; Engram hashes the
                        real token ids, zero-init; none: the backbone alone)
  smoke                 seconds on CPU against a tiny checkpoint: 8 steps, the
                        memory in layer 2 (1-based) only, a few routes
  keye2b                the backbone shape stated in the config instead of read
                        from config.json, so that `lngram-exp plan` sizes the run
                        without the checkpoint: Qwen3-1.7B's widths (d 2048, 28
                        layers, 16 query / 8 KV heads of dim 128, FFN 6144,
                        vocabulary 151,936, tied embeddings, q/k norms, RoPE
                        theta 1e6), token data. The paper does not print Keye2B's
                        language-model shape; its Lngram count (155.6M, which
                        param_count gives at d 2048) fixes the width, and the
                        Qwen3-1.7B depth and FFN are our assumption. With
                        init_from=hf:DIR, DIR's config.json must agree (a
                        differing field is refused, naming it).
  keye30b               Table 13's Keye30B column on the public model of its class,
                        Qwen3-VL-30B-A3B's text decoder, its shape stated here so
                        that `plan` sizes the run without the checkpoint (below).

Keye30B (`keye30b`). The model's (Qwen3-VL-30B-A3B config.json, text_config, in
LMConfig fields as experiments/hf/qwen3vl/moe.py maps them): d 2048, 48 layers,
32 query / 4 KV heads of dim 128, q/k norms, every layer MoE (decoder_sparse_step
1, no mlp_only_layers) of 128 experts top-8, expert width 768, renormalised top-k
gates, no shared expert, balance weight router_aux_loss_coef 0.001 x 8; dense
width 6144 (unused: no dense layer), vocabulary 151,936, untied embeddings, RMS
eps 1e-6, RoPE theta 5e6. Its interleaved MRoPE (sections 24/20/20) gives every
frequency the same position on text (t = h = w), so the text-only LM uses 1-D
RoPE at that theta. The paper's (Table 13, App. E): Lngram in layers 2 and 24
(1-based: memory_layers (1, 23)), R 256 routes, memory width 256, the streaming
readout over chunks of 64 routes; 32,768 tokens a row, global batch 32, 5,000
steps, BF16; the learning rates above. Our assumptions: Keye2B's other Lngram
fields (4-bit codes, orders 2 and 3, 16/16 readout heads of dim 128, conv 4 /
3), which give 595.6M Lngram parameters (`param_count`; the paper: 595M);
float32 master weights and AdamW moments; every block rematerialised; 1,000
warm-up steps of 5,000; a capacity of 1.25x a balanced share of slots per
receiving device (excess slots dropped and logged; dropless routing sizes each
exchange for all 8 devices' slots: 8 GiB buffers a layer at 32,768 tokens a
device, 178 GiB of temporaries at 4 layers on H800s).
The paper trains on 64 GPUs with PP 4, CP 16, EP 8; this library has no pipeline
stages, and its attention on a `seq` axis is XLA's dense form (64 GiB of scores a
layer at 32,768 tokens), so the planned mesh is expert=8 x fsdp=4 x table=2: EP 8
as the paper, one row per expert x fsdp group, Lngram's routes over table (the
pair of a table axis computes the same rows twice). The experts are also split
over fsdp at rest. Peaks: BENCHMARKS.md "Will the recipes fit": on 64 H800s all
48 layers need 150 GiB a GPU of 59.4 (the MoE exchange's backward buffers, made
at once by XLA:GPU), so the recipe does not fit them yet; v5p chips: 4 and 8
layers compiled, 48 extrapolated (a 48-layer TPU compile did not fit the
planning host's memory). Planned is the decoder-only LM step: the Qwen3-VL
vision tower is not in it (the library's VLM task runs only data/fsdp/table
meshes): 0.54B parameters by our count (27 blocks of width 1152: 0.41B; the merger
and 3 DeepStack mergers: 0.12B), trained in AdamW ~2 GiB a device over fsdp 4,
frozen ~0.3 GiB in bf16, plus its activations per image.
`init_from=hf:DIR` cannot take a Qwen3-VL-MoE checkpoint here: the LM path reads
Qwen3 / Qwen3-MoE / Llama / Qwen2 config.json files only (`qwen3_vl_moe` is
refused in one line; DESIGN.md §11.3), so a run needs a Qwen3-MoE-format export
of the text decoder.

    lngram-exp train --config=experiments/configs/hf_lngram.py:pkm \
        --config.init_from=hf:CHECKPOINT_DIR --workdir=runs/hf_pkm
    lngram-exp train --config=experiments/configs/hf_lngram.py:smoke \
        --config.init_from=hf:CHECKPOINT_DIR --workdir=/tmp/hf_smoke
    lngram-exp plan --config=experiments/configs/hf_lngram.py:keye2b --mesh=fsdp=8
    lngram-exp plan --config=experiments/configs/hf_lngram.py:keye30b \
        --mesh=expert=8,fsdp=4,table=2 --target=h800:8x8
"""

from experiments.configs import base

ARMS = ("pkm", "engram", "v1", "sparse_ffn", "none")
SIZES = ("keye2b", "keye30b")   # the backbone shape stated in the config
# Qwen3-1.7B's config.json, in LMConfig fields (the `keye2b` arg).
KEYE2B_BACKBONE = dict(d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                       ffn_dim=6144, vocab_size=151936, tie_embeddings=True, qk_norm=True,
                       rope_theta=1e6, norm_eps=1e-6, norm_scale_in_dtype=True)
# Table 13, Keye2B: layers 2 and 14 (1-based).
KEYE2B_LAYERS = (1, 13)
# Qwen3-VL-30B-A3B's text_config (the `keye30b` arg; module docstring).
KEYE30B_LAYERS = 48
KEYE30B_BACKBONE = dict(d_model=2048, n_layers=KEYE30B_LAYERS, n_heads=32, n_kv_heads=4,
                        head_dim=128, ffn_dim=6144, vocab_size=151936, tie_embeddings=False,
                        qk_norm=True, rope_theta=5e6, norm_eps=1e-6, norm_scale_in_dtype=True,
                        moe_layers=tuple(range(KEYE30B_LAYERS)),
                        moe=dict(n_experts=128, top_k=8, expert_ffn_dim=768,
                                 n_shared_experts=0, shared_ffn_dim=0, norm_topk_prob=True,
                                 router="softmax", balance_coef=0.001 * 8))
# Table 13, Keye30B: layers 2 and 24 (1-based); R 256, width 256, streaming, chunk 64.
KEYE30B_LAYERS_MEMORY = (1, 23)
KEYE30B_MEMORY = dict(routes=256, mem_dim=256, readout="streaming", route_chunk=64)
KEYE30B_MESH = dict(expert=8, fsdp=4, table=2)
KEYE30B_CAPACITY = 1.25


def _lngram():
  return dict(kind="lngram", routes=121, bits=4, orders=(2, 3), mem_dim=128, q_heads=16,
              kv_heads=16, head_dim=128, sink_mass=0.5, surrogate="onebit",
              conv_kernel=4, conv_dilation=3, readout="absorbed")


def _arm(name):
  """The arm's byte-LM defaults (experiments/configs/lm_<arm>.py), for any width."""
  if name == "pkm":
    return dict(kind="pkm", heads=4, key_dim=32, num_keys=128, topk=32, value_dim=0,
                gated=False, query_norm="rms", key_norm=False, zero_init=True)
  if name == "engram":
    # vocab_size 0: the checkpoint's (Engram hashes token ids, not bytes).
    return dict(kind="engram", orders=(2, 3), heads=4, head_dim=24, table_base=11587,
                vocab_size=0, case_fold=False, hash_seed=0, conv_kernel=4, zero_init=True)
  if name == "v1":
    return dict(kind="lngram_v1", bits=4, orders=(2, 3), mem_dim=16, surrogate="onebit",
                eps=1e-6)
  return dict(kind="sparse_ffn", experts=51, expert_dim=116, shared_dim=0, balance_coef=0.01,
              init_std=0.02, out_init_std=0.0, eps=1e-6, dispatch="tiled", tile=32)


def get_config(arg: str = ""):
  config = base.base_config()
  # 0 = config.json's (experiments/hf/backbone.py); the family options come from it too.
  config.model.update(d_model=0, n_layers=0, n_heads=0, n_kv_heads=0, head_dim=0, ffn_dim=0,
                      vocab_size=0, max_len=4096, dtype="bfloat16", param_dtype="float32",
                      memory_layers=KEYE2B_LAYERS, memory=_lngram())
  config.data.update(seq_len=1024, batch_size=8, eval_batches=16)
  config.optim.update(lr=1e-4, table_lr_mult=4.0, table_min_lr_ratio=0.025,
                      min_lr_ratio=0.02, weight_decay=0.1, warmup_steps=1000,
                      backbone_lr=5e-6, backbone_min_lr_ratio=0.02)
  config.train.update(steps=10000, eval_every=1000, ckpt_every=1000, log_every=50)
  config.plan_devices = 8
  parts = [p for p in (arg or "").split(",") if p]
  shapes = [p for p in parts if p in (*SIZES, "smoke")]
  if len(shapes) > 1:
    raise ValueError(f"hf_lngram: {' and '.join(shapes)} do not combine (one shape at a "
                     "time).")
  for part in parts:
    if part == "smoke" or part in SIZES:
      continue
    if part not in ARMS:
      raise ValueError(f"hf_lngram: unknown config arg {part!r}; use one of {ARMS}, smoke, "
                       f"{' or '.join(SIZES)}.")
    if part == "none":
      config.model.memory_layers = ()
    else:
      config.model.memory = _arm(part)
  if "keye2b" in parts:
    config.model.update(KEYE2B_BACKBONE)
    config.data.kind = "tokens"   # the checkpoint's tokenizer (lngram-exp prepare-data)
  if "keye30b" in parts:
    _keye30b(config, lngram=config.model.memory.get("kind") == "lngram")
  if "smoke" in parts:
    config.model.update(max_len=128, dtype="float32", memory_layers=(
        () if "none" in parts else (1,)))
    if config.model.memory and config.model.memory.kind == "lngram":
      config.model.memory.update(routes=4, bits=2, mem_dim=8, q_heads=2, kv_heads=1,
                                 head_dim=16)
    config.data.update(max_files=12, seq_len=32, batch_size=4, eval_batches=2)
    config.optim.update(warmup_steps=2)
    config.train.update(steps=8, log_every=1, eval_every=4, ckpt_every=2, max_to_keep=2)
    config.plan_devices = 1
  return config


def _keye30b(config, *, lngram: bool) -> None:
  """Table 13's Keye30B on Qwen3-VL-30B-A3B's text decoder (module docstring)."""
  config.model.update(KEYE30B_BACKBONE, remat=True, max_len=32768,
                      memory_layers=KEYE30B_LAYERS_MEMORY
                      if config.model.memory_layers else ())
  # Ours: a receiver takes at most 1.25x a balanced share of slots (the rest dropped,
  # logged); dropless would size every exchange for all 8 devices' slots (module docstring).
  config.model.moe.capacity_factor = KEYE30B_CAPACITY
  if lngram:
    config.model.memory.update(KEYE30B_MEMORY)
  config.data.update(kind="tokens", seq_len=32768, batch_size=32)
  config.train.update(steps=5000, eval_every=500, ckpt_every=500)
  config.mesh.update(KEYE30B_MESH)
  config.plan_devices = 64
