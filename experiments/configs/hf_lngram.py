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

    lngram-exp train --config=experiments/configs/hf_lngram.py:pkm \
        --config.init_from=hf:CHECKPOINT_DIR --workdir=runs/hf_pkm
    lngram-exp train --config=experiments/configs/hf_lngram.py:smoke \
        --config.init_from=hf:CHECKPOINT_DIR --workdir=/tmp/hf_smoke
    lngram-exp plan --config=experiments/configs/hf_lngram.py:keye2b --mesh=fsdp=8
"""

from experiments.configs import base

ARMS = ("pkm", "engram", "v1", "sparse_ffn", "none")
# Qwen3-1.7B's config.json, in LMConfig fields (the `keye2b` arg).
KEYE2B_BACKBONE = dict(d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                       ffn_dim=6144, vocab_size=151936, tie_embeddings=True, qk_norm=True,
                       rope_theta=1e6, norm_eps=1e-6, norm_scale_in_dtype=True)
# Table 13, Keye2B: layers 2 and 14 (1-based).
KEYE2B_LAYERS = (1, 13)


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
  if "keye2b" in parts and "smoke" in parts:
    raise ValueError("hf_lngram: keye2b (the full-size shape) and smoke do not combine.")
  for part in parts:
    if part in ("smoke", "keye2b"):
      continue
    if part not in ARMS:
      raise ValueError(f"hf_lngram: unknown config arg {part!r}; use one of {ARMS}, smoke "
                       "or keye2b.")
    if part == "none":
      config.model.memory_layers = ()
    else:
      config.model.memory = _arm(part)
  if "keye2b" in parts:
    config.model.update(KEYE2B_BACKBONE)
    config.data.kind = "tokens"   # the checkpoint's tokenizer (lngram-exp prepare-data)
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
