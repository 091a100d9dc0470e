"""Tiny VLM, Stage I of the long-answer design: SFT of PVM (backbone frozen) with its own gate LR.

    lngram-exp train --config=experiments/configs/vlm_long_sft.py --config.vlm.stage.init_from=runs/vlm_long/base --config.vlm.scenes.data_dir=runs/vlm_long/base/data --workdir=runs/vlm_long/sft_pvm_s0

The scenes, lengths and 512 validation scenes of vlm_long_base.py; the Stage I
recipe of vlm_pvm_sft.py (only the branch trains, cosine with 10% warmup, a
fresh draw of training scenes) at the paper's branch LR 1e-4, with the gate λ
in its own optimiser group at 30x that (`optim.gate_lr_mult`: 3e-3, the LR at
which the 3x3 runs' gates reached |λ| ≈ 0.6; at 1e-4 they stayed below 0.1 and
the branch barely acted). 600 steps, batch 8. Arms by arg (experiments/configs/
vlm_common.py): "" (PVM), "mlp" (iso-parameter parallel MLP, the same gate
group), "none" (no branch: the LM trains at 1e-4, no gate), "sN" (seed), "smoke".

    lngram-exp train --config=experiments/configs/vlm_long_sft.py:mlp,s1 --config.vlm.stage.init_from=runs/vlm_long/base --config.vlm.scenes.data_dir=runs/vlm_long/base/data --workdir=runs/vlm_long/sft_mlp_s1
"""

from experiments.configs import vlm_common, vlm_long_base

GATE_LR_MULT = 30.0


def get_config(arg: str = ""):
  c = vlm_long_base.long_design(vlm_common.vlm_base_config())
  c.optim.update(lr=1e-4, gate_lr_mult=GATE_LR_MULT)
  c.data.update(batch_size=8)
  c.train.update(steps=600)
  c.vlm.stage.update(name="sft", trainable="branch")
  c.vlm.branch.kind = "pvm"
  c.vlm.scenes.update(task="count", train_scene_seed=1)
  return vlm_long_base.smoke_fits(vlm_common.apply_args(c, arg, "vlm_long_sft"), arg)
