"""Shared defaults of the Lngram v2 paper's 0.6B MoE recipes (a leaf: no `get_config`).

The controlled v1-vs-v2 comparison of "Lngram v2: Latent N-Gram Memory with
Interpretable Discrete Representations" (Table 4, App. D.3) and its STE
ablation (App. A.5) train one DeepSeek-V2-style sparse MoE from scratch.
`moe06b_baseline.py`, `moe06b_lngram_v1.py` and `moe06b_lngram_v2.py` start
from `recipe(arg)` and differ only in the memory slot, so every arm has the
same backbone, data order, optimiser and seed (the seed also draws the same
backbone weights: memory branches are drawn after the backbone).

Stated by the paper (D.3 / A.5): 24 layers, d 768, 12 heads, 2 KV heads, every
MoE layer 8 routed experts + 1 shared expert, top-2; Lngram in the 2nd and
12th layers, read as 1-based (the v1 authors' code puts its default memory at
0-based layers (1, 11)), so memory_layers = (1, 11); 4-bit codes,
2/3-gram tables; 10,000 steps, ~1.31B FineWeb-Edu tokens; global batch 32,
LR 3e-4, 1% warm-up, the cosine schedule of a 61,036-step run stopped at step
10,000, seed 42, BF16. A.5's v2 run (validation loss 2.8585) is Table 4's r16
(2.8584), so A.5's optimiser settings are taken for every arm.

Our choices where the paper is silent (also DESIGN.md §12):
  sequence length 4,096: 32 rows x 4,096 x 10,000 steps = 1,310,720,000 tokens;
  every layer sparse (DeepSeek-V2 keeps its first layer dense; the paper says
    only "each MoE layer"); routed and shared experts of width 1,024 (SwiGLU);
    the softmax router without renormalised top-2 gates (DeepSeek-V2);
    balance loss weight 0.003 (DeepSeek-V2's expert-level α1), no token dropping;
  vocabulary 32,768: a byte-level BPE trained on FineWeb-Edu by
    `lngram-exp train-tokenizer --vocab_size=32768`; untied embeddings;
    total 593.2M parameters (253.4M active per token);
  every block rematerialised in the backward (plain attention keeps [B, H, T, T]
    scores: 3.2 GB per layer at 4 rows of 4,096 per device); RoPE θ 10,000;
  AdamW β (0.9, 0.95), weight decay 0.1 (none on norm scales, the Lngram
    router and tables: the optimiser's groups), clip 1.0, cosine floor 0.1 x
    peak; table LR 4 x (v2's Table 13 ratio); warm-up 1% of 61,036 = 610 steps.
The `smoke` arg keeps the structure (MoE in every layer, a shared expert,
the memory arm, the long-cosine schedule) at widths and steps that
train in seconds on the embedded byte corpus.
"""

from __future__ import annotations

from experiments.configs import base

# Table 4 / App. D.3 / App. A.5, and our stated choices (module docstring).
LAYERS, D_MODEL, HEADS, KV_HEADS, HEAD_DIM = 24, 768, 12, 2, 64
EXPERTS, TOP_K, SHARED, EXPERT_DIM = 8, 2, 1, 1024
VOCAB, SEQ_LEN, BATCH, STEPS, SCHEDULE_STEPS = 32768, 4096, 32, 10000, 61036
MEMORY_LAYERS = (1, 11)   # the paper's 2nd and 12th layers, 0-based
SEED = 42


def moe(**changes) -> dict:
  """The experiment-config form of the backbone's MoEConfig (d_model follows the model)."""
  return dict(n_experts=EXPERTS, top_k=TOP_K, expert_ffn_dim=EXPERT_DIM,
              n_shared_experts=SHARED, shared_ffn_dim=EXPERT_DIM, norm_topk_prob=False,
              router="softmax", balance_coef=0.003, bias_update_rate=0.0,
              dispatch="grouped", capacity_factor=0.0) | changes


def recipe(arg: str, name: str, known: tuple[str, ...] = ()):
  """(config, smoke, args) of the 0.6B recipe; `known`: the caller's own args,
  returned in order for it to apply (anything else is refused, naming `name`)."""
  config = base.base_config()
  parts = [p for p in (arg or "").split(",") if p]
  for part in parts:
    if part != "smoke" and part not in known:
      raise ValueError(f"{name}: unknown config arg {part!r}; use "
                       f"{', '.join((*known, 'smoke'))}.")
  # vocab_size 0 = the data's; the commands pass 32,768 (module docstring) so that the
  # model has the stated size whatever the tokenizer's (smaller) vocabulary.
  config.model.update(d_model=D_MODEL, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS,
                      head_dim=HEAD_DIM, ffn_dim=EXPERT_DIM, max_len=SEQ_LEN,
                      tie_embeddings=False, dtype="bfloat16", param_dtype="float32",
                      remat=True, memory_layers=(), moe_layers=tuple(range(LAYERS)),
                      moe=moe())
  config.data.update(seq_len=SEQ_LEN, batch_size=BATCH, eval_batches=16, seed=SEED)
  config.optim.update(lr=3e-4, table_lr_mult=4.0, weight_decay=0.1, b1=0.9, b2=0.95,
                      warmup_steps=0, warmup_frac=0.01, schedule_steps=SCHEDULE_STEPS,
                      min_lr_ratio=0.1, clip_norm=1.0)
  config.train.update(steps=STEPS, seed=SEED, log_every=50, eval_every=1000,
                      ckpt_every=500, max_to_keep=3)
  smoke = "smoke" in parts
  if smoke:
    # Same structure, seconds on CPU: 2 layers (both MoE, memory in the second), 4
    # experts of width 32 + a shared one, bytes of the embedded corpus, a cosine 6x the run.
    base.smoke(config)   # the shared smoke sizes of data and training
    config.model.update(ffn_dim=32, max_len=64, dtype="float32", remat=False,
                        moe_layers=(0, 1),
                        moe=moe(n_experts=4, expert_ffn_dim=32, shared_ffn_dim=32))
    config.optim.update(schedule_steps=24)
  return config, smoke, [p for p in parts if p != "smoke"]


def memory_layers(smoke: bool) -> tuple[int, ...]:
  # smoke: one memory layer of two, as the byte LM's smoke (base.memory_run), which
  # halves its compile time.
  return (1,) if smoke else MEMORY_LAYERS
