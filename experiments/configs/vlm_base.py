"""Tiny VLM, stage 0: captioning + counting pretraining of encoder, projector and LM (no branch).

    lngram-exp train --config=experiments/configs/vlm_base.py --workdir=runs/vlm_base

Also `python -m experiments.vlm train --config=experiments/configs/vlm_base.py
--workdir=runs/vlm_base`. The model is a 2-layer ViT over 16x16 patches of
48x48 emoji scenes (9 visual tokens), a projector and a 4-layer byte LM
(d = 128); half the examples are captions, half counting questions with the
caption as reasoning. Args (comma-separated, experiments/vlm/configs_common.py):
"" or "smoke" (seconds), "sN" (seed N):

    lngram-exp train --config=experiments/configs/vlm_base.py:smoke --workdir=/tmp/vlm_smoke
"""

from experiments.vlm import configs_common


def get_config(arg: str = ""):
  c = configs_common.vlm_base_config()
  return configs_common.apply_args(c, arg, "vlm_base")
