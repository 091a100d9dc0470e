"""Tiny VLM, Stage II: GRPO of LM + PVM (vision frozen) on counting, from the SFT run.

    lngram-exp train --config=experiments/configs/vlm_pvm_grpo.py --config.vlm.stage.init_from=runs/vlm_pvm_sft --workdir=runs/vlm_pvm_grpo

Group size 8, group-relative advantages, clipped ratio (ε = 0.2), KL
coefficient 0, reward 0.1·format + 0.9·accuracy, LR 1e-6 constant
(--config.vlm.grpo.lr=...). Sampling uses the KV + visual caches. The model
args must match the SFT run it starts from ("none", "mlp", "hidden", "dNN",
"lA.B", "smoke", "sN"; experiments/configs/vlm_common.py).
"""

from experiments.configs import vlm_common


def get_config(arg: str = ""):
  c = vlm_common.vlm_base_config()
  c.train.update(steps=20, log_every=1)
  c.vlm.stage.update(name="grpo", trainable="lm+branch")
  c.vlm.branch.kind = "pvm"
  c.vlm.scenes.update(task="count", train_scene_seed=1, filler_per_item=0)
  return vlm_common.apply_args(c, arg, "vlm_pvm_grpo")
