"""Shared defaults of the VLM experiment configs (vlm_base, vlm_pvm_sft, vlm_pvm_grpo).

Not a config file itself (no `get_config`); a leaf: imports only
ml_collections and `base`. A VLM config is an LM config (`base`: model = the
decoder backbone, optim.lr / weight_decay, data.batch_size, train.steps /
seed / log_every) plus a `vlm` block of groups:

  vlm.stage    which stage, where it starts from, what trains
  vlm.encoder  the ViT patch encoder and the projector's visual positions
  vlm.branch   the branch beside the FFN (kind, layers, PVM / MLP widths)
  vlm.scenes   the emoji scenes and the task
  vlm.eval     greedy evaluation after training
  vlm.grpo     Stage II

The library turns it into a model config: `experiments.vlm.tiny.config.vlm_config`.
"""

from __future__ import annotations

import ml_collections

from experiments.configs import base


def vlm_base_config() -> ml_collections.ConfigDict:
  c = base.base_config()
  c.model.update(max_len=320)
  c.data.update(batch_size=16)
  c.optim.update(lr=3e-3, weight_decay=0.0)
  c.train.update(steps=400, log_every=20)
  c.vlm = dict(
      stage=dict(
          name="pretrain", init_from="", trainable="all",
          # stage 0 only: "STEPS:MAX_OBJECTS,..." phases (experiments/vlm/run.parse_curriculum);
          # when set they replace train.steps; "" = train.steps on the configured scenes.
          # vlm_base sets the recipe; Stages I/II must leave it empty.
          curriculum="",
          # stage 0 only: weight of the per-cell class loss on the encoder's patch features
          # (experiments/vlm/tiny/cell_loss.py); 0 = captions/counting only, the first recipe
          cell_loss_weight=1.0),
      # 48x48 images, one 16x16 patch per grid cell -> 9 visual tokens; visual_pos: a
      # learned LM-side position per visual token (experiments/vlm/model.Projector);
      # False = the first two stage-0 recipes of experiments/RESULTS.md
      encoder=dict(patch_size=16, vit_dim=64, vit_layers=2, vit_heads=2, vit_ffn=128,
                   visual_pos=True),
      # kind: "none" | "pvm" | "mlp"; layers by strategy (pvm_jax.layers.select_layers);
      # mlp_dim 0 = iso-parameter with PVM
      branch=dict(kind="none", layer_strategy="strided", layer_start=1, layer_stride=2,
                  layer_count=2, layers=(), visual_mass_from="", latent_dim=64,
                  pvm_head_dim=32, pvm_source="raw", mlp_dim=0),
      scenes=dict(
          rows=3, cols=3, glyph_size=16, min_objects=1, max_objects=0, scene_seed=0,
          # the draw of the training scenes; -1 = scene_seed. Stage 0 fits its 2000
          # training scenes almost exactly, so Stages I/II train on another draw (seed 1):
          # scenes the base model has not memorised, where its errors leave something to learn
          train_scene_seed=-1,
          data_dir="", task="mix", filler_per_item=0, n_train=2000),
      # 240 new tokens: the longest reference answer of a 3x3 scene is 215 with its end
      # token (9 + 70 + 240 prompt and answer fit max_len 320); 200 cut 9 of the 64
      # validation answers short before `</answer>`, so they counted as wrong
      eval=dict(n=64, max_new_tokens=240),
      grpo=dict(group_size=8, prompts_per_step=2, max_new_tokens=240, lr=1e-6, clip_eps=0.2,
                kl_coef=0.0, temperature=1.0),
  )
  return c


def vlm_smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Seconds on CPU: tiny backbone and encoder, 2x2 scenes, a few steps."""
  base.smoke(c)
  c.model.update(max_len=256)
  c.train.update(steps=3, log_every=1)
  v = c.vlm
  v.encoder.update(vit_dim=16, vit_layers=1, vit_ffn=32, patch_size=8)
  v.branch.update(latent_dim=32, pvm_head_dim=16, layer_start=1, layer_stride=1,
                  layer_count=1)
  v.scenes.update(rows=2, cols=2, glyph_size=8, n_train=8)
  v.eval.update(n=4, max_new_tokens=8)
  v.grpo.update(prompts_per_step=1, group_size=4, max_new_tokens=8)
  if v.stage.curriculum:   # vlm_base: the same two kinds of phase, 3 steps in all
    v.stage.curriculum = "2:1,1:0"
  return c


def apply_args(c: ml_collections.ConfigDict, arg: str, name: str) -> ml_collections.ConfigDict:
  """Comma-separated variant args shared by the configs:

  smoke       the smoke shapes above;
  none        no branch (the base model trained on the same data: its LM trains);
  mlp         the iso-parameter parallel MLP instead of PVM;
  lora        LoRA-SFT instead of PVM: no branch, LoRA factors on every projection of the
              LM at PVM's trainable parameter count (`lora_arm`), the factors alone train;
  hidden      PVM reads the processed hidden states instead of raw visual embeddings;
  dNN         PVM latent width NN (e.g. d32);
  lA.B.C      explicit branch layers A, B, C (e.g. l1.3);
  peak, max_decay  layers by measured visual attention (needs vlm.branch.visual_mass_from,
              a run directory holding attention_decay.json);
  sNN         seed NN (train.seed and the parameter init).
  """
  br, st = c.vlm.branch, c.vlm.stage
  for part in filter(None, (arg or "").split(",")):
    if part == "smoke":
      vlm_smoke(c)
    elif part == "none":
      br.kind = "none"
      st.trainable = "lm" if st.trainable == "branch" else st.trainable
    elif part == "mlp":
      br.kind = "mlp"
    elif part == "lora":
      lora_arm(c)
    elif part == "hidden":
      br.pvm_source = "hidden"
    elif part in ("peak", "max_decay"):
      br.layer_strategy = part
    elif part[0] == "d" and part[1:].isdigit():
      br.latent_dim = int(part[1:])
    elif part[0] == "l" and all(s.isdigit() for s in part[1:].split(".")):
      br.update(layer_strategy="explicit", layers=tuple(int(s) for s in part[1:].split(".")))
    elif part[0] == "s" and part[1:].isdigit():
      c.train.seed = int(part[1:])
    else:
      raise ValueError(f"{name}: unknown config arg {part!r} (see experiments/configs/"
                       "vlm_common.apply_args).")
  return c


# The LoRA-SFT arm's factors: rank 16 on all seven projections of the tiny VLM's LM
# (d 128, 4 layers, 4/2 heads of 32, FFN 384): 16 x 9,216 = 147,456 parameters, 99.7% of
# the two PVM branches' 147,842 (layers 1 and 3, latent 64, gate included; a test checks
# both counts). alpha = 2r, the common LoRA choice (scale 2).
LORA_RANK = 16
ALL_LINEAR = r"blocks/\d+/(attn/w_(q|kv|o)|mlp/w_(gate|up|down))"


def lora_arm(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """LoRA-SFT in place of the branch (the PVM paper's LoRA baseline at this scale)."""
  c.vlm.branch.kind = "none"
  c.vlm.stage.trainable = "lora"
  c.model.lora.update(rank=LORA_RANK, alpha=2.0 * LORA_RANK, dropout=0.0, targets=ALL_LINEAR)
  return c
