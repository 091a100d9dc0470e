"""Tiny VLM, stage 0: captioning + counting pretraining of encoder, projector and LM (no branch).

    lngram-exp train --config=experiments/configs/vlm_base.py --workdir=runs/vlm_base

The model is a 2-layer ViT over 16x16 patches of 48x48 emoji scenes (9
visual tokens), a projector and a 4-layer byte LM (d = 128); half the
examples are captions, half counting questions with the caption as
reasoning. Training runs the curriculum of `vlm.stage.curriculum` (scenes of
1-2 objects first, then 1-9; override it with e.g.
--config.vlm.stage.curriculum=1800:2,2000:0, or "" to use train.steps).
Args (comma-separated, experiments/configs/vlm_common.py): "" or "smoke"
(seconds), "sN" (seed N):

    lngram-exp train --config=experiments/configs/vlm_base.py:smoke --workdir=/tmp/vlm_smoke
"""

from experiments.configs import vlm_common


def get_config(arg: str = ""):
  c = vlm_common.vlm_base_config()
  # 1800 steps on scenes of 1-2 objects, then 2000 on 1-9: the small scenes teach the
  # LM to read the cell a caption names (experiments/RESULTS.md); train.steps is unused.
  c.vlm.stage.curriculum = "1800:2,2000:0"
  return vlm_common.apply_args(c, arg, "vlm_base")
