"""Tiny VLM, Stage I: SFT of the PVM branch only (backbone and encoder frozen) on counting.

    lngram-exp train --config=experiments/configs/vlm_pvm_sft.py --config.vlm.stage.init_from=runs/vlm_base --workdir=runs/vlm_pvm_sft

Starts from the stage-0 run (`vlm.stage.init_from`); PVM sits beside the FFN
of layers 1 and 3 (strided from layer 1), latent width 64, and reads the raw
projected visual embeddings. Only branch parameters and gates train (AdamW,
LR 1e-4 cosine, warmup 10%). Data: counting questions answered after the
caption as reasoning (k = 1..9 objects sets the output length;
--config.vlm.scenes.filler_per_item=N stretches it). Baselines via args
(experiments/configs/vlm_common.py): "none" (no branch: the LM trains on the
same data), "mlp" (iso-parameter parallel MLP), "hidden" (PVM over processed
hidden states), "l1.2" (layers), "d32" (latent), "peak"/"max_decay"
(+ --config.vlm.branch.visual_mass_from=<run>), "smoke", "sN".
"""

from experiments.configs import vlm_common


def get_config(arg: str = ""):
  c = vlm_common.vlm_base_config()
  c.optim.update(lr=1e-4)
  c.train.update(steps=300)
  c.vlm.stage.update(name="sft", trainable="branch")
  c.vlm.branch.kind = "pvm"
  c.vlm.scenes.update(task="count", train_scene_seed=1, filler_per_item=0)
  return vlm_common.apply_args(c, arg, "vlm_pvm_sft")
