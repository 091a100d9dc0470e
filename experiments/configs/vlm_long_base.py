"""Tiny VLM, stage 0 of the long-answer design: 4x4 scenes, 64 visual tokens, answers up to ~890 bytes.

    lngram-exp train --config=experiments/configs/vlm_long_base.py --workdir=runs/vlm_long/base

The design where PVM's premise can bite (PVM paper, arXiv 2605.00814: the
backbone's attention to the image fades as the output grows). In the 3x3
design of vlm_base.py the answers end by ~215 bytes and 4-9% of the
backbone's attention is still on the 9 visual tokens at t = 100
(experiments/RESULTS.md), so the image never leaves its reach. Here:
  * 4x4 grids of 16x16 glyphs (64x64 images), 8x8 patches: 64 visual tokens;
  * k = 1..16 objects and one filler sentence after every item but the last:
    the caption-then-count answer grows to ~890 bytes (quartiles of k as the
    length groups, as before), with the image content it needs unchanged;
  * 4,000 training scenes, 512 validation scenes for every evaluation
    (greedy, up to 900 new tokens), so a length group holds ~128 answers.
Stage 0 keeps vlm_base's curriculum (1-2 objects first, then all counts) and
its backbone (4 layers, d = 128). Stage I is vlm_long_sft.py. Args as in
vlm_base.py ("smoke", "sN"):

    lngram-exp train --config=experiments/configs/vlm_long_base.py:s1 --workdir=runs/vlm_long/base_s1
"""

from experiments.configs import vlm_common

# The longest answer of a 4x4 scene with one filler per item is 890 bytes with its end
# token; 64 visual tokens + a question of <= 70 bytes + 900 new tokens fit 1,088.
MAX_NEW_TOKENS = 900
MAX_LEN = 1088
VAL_SCENES = 512


def long_design(c):
  """The long-answer design on a VLM config (before its args: `smoke` still shrinks it)."""
  c.model.update(max_len=MAX_LEN)
  c.vlm.encoder.update(patch_size=8)
  c.vlm.scenes.update(rows=4, cols=4, glyph_size=16, filler_per_item=1, n_train=4000)
  c.vlm.eval.update(n=VAL_SCENES, max_new_tokens=MAX_NEW_TOKENS)
  c.vlm.grpo.update(max_new_tokens=MAX_NEW_TOKENS)
  return c


def smoke_fits(c, arg: str):
  """`smoke` keeps the filler sentences (its 2x2 answers need max_len 384, not 256) and
  the design's cells of 2x2 patches (4-pixel patches of its 8-pixel glyphs)."""
  if "smoke" in (arg or "").split(","):
    c.model.max_len = 384
    c.vlm.encoder.patch_size = c.vlm.scenes.glyph_size // 2
  return c


def get_config(arg: str = ""):
  c = long_design(vlm_common.vlm_base_config())
  c.vlm.stage.curriculum = "1800:2,2000:0"
  return smoke_fits(vlm_common.apply_args(c, arg, "vlm_long_base"), arg)
