"""`lngram-exp`: train, evaluate, sample and analyse the experiments; list their configs.

    lngram-exp train   --config=experiments/configs/lm_lngram.py[:arg] --workdir=runs/x
                       [--config.train.steps=100 --config.data.path=my/texts ...]
    lngram-exp eval    --workdir=runs/x [--step=N]                       (LM runs)
    lngram-exp sample  --workdir=runs/x --prompt='def ' [--max_new_tokens=200 --top_k=20]
    lngram-exp configs
    lngram-exp analyze --workdir=runs/vlm_x [--n=32 --which=attention,accuracy,logit_lens,
                       grounding --max_new_tokens=N]  (VLM runs: attention decay, accuracy by
                       length, LogitLens, grounding probe; JSON + PNG into the run directory)

A config with a `vlm` block (experiments/configs/vlm_*.py) trains a VLM stage;
every run, LM or VLM, goes through the same loop (experiments.train.train),
checkpoints and resumes the same way: rerun the same command after a kill.

Also `python -m experiments ...`. The logic lives in importable libraries
(experiments.train, experiments.checkpoint, experiments.vlm.run); this file
only parses flags.
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

COMMANDS = ("train", "eval", "sample", "configs", "analyze")

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, `path.py[:arg]`; override fields with "
    "--config.<field>=<value>.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics).")
_STEP = flags.DEFINE_integer("step", None, "eval/sample: checkpoint step (default newest).")
_PROMPT = flags.DEFINE_multi_string("prompt", ["def "], "sample: prompt(s), repeatable.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "sample: bytes to generate (default "
                                 "200); analyze: answer length cap (default the run's "
                                 "vlm.eval.max_new_tokens).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "sample: softmax temperature.")
_TOP_K = flags.DEFINE_integer("top_k", None, "sample: keep the k most likely bytes.")
_GREEDY = flags.DEFINE_bool("greedy", False, "sample: argmax decoding.")
_SEED = flags.DEFINE_integer("seed", 0, "sample: PRNG seed.")
_CACHE = flags.DEFINE_bool("cache", True, "sample: KV cache + Lngram decode state.")
_N_ANALYZE = flags.DEFINE_integer("n", 32, "analyze: validation scenes to analyse.")
_WHICH = flags.DEFINE_list("which", ["attention", "accuracy", "logit_lens", "grounding"],
                           "analyze: which analyses.")


def _run(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"usage: lngram-exp {{{','.join(COMMANDS)}}} [flags]; got {argv[1:]}")
  command = argv[1]
  _setup_logging()
  if command == "configs":
    from experiments.configs import config_files, purpose
    for path in config_files():
      print(f"{path.name:<18} {purpose(path)}")
    return 0
  if not _WORKDIR.value:
    raise app.UsageError(f"lngram-exp {command} needs --workdir.")
  if command == "train":
    return _train()
  try:
    return _inspect(command)
  except ValueError as e:   # a VLM run given to an LM command, an unknown analysis
    print(f"lngram-exp {command}: {e}", file=sys.stderr)
    return 2


def _inspect(command):
  if command == "analyze":
    from experiments.vlm.run import analyze
    out = analyze(_WORKDIR.value, which=tuple(_WHICH.value), n=_N_ANALYZE.value,
                  max_new_tokens=_MAX_NEW.value)
    print(f"wrote {sorted(out)} (.json, .png) into {_WORKDIR.value}")
    return 0
  if command == "eval":
    from experiments.train.evaluate import evaluate_run
    metrics = evaluate_run(_WORKDIR.value, step=_STEP.value)
    for key, value in sorted(metrics.items()):
      print(f"{key:<32} {value:.4f}")
    return 0
  from experiments.checkpoint.restore import restore_module
  from experiments.train.evaluate import require_lm, sample_text
  model, saved, _ = restore_module(_WORKDIR.value, _STEP.value)
  require_lm(saved, _WORKDIR.value, "sample")
  texts = sample_text(model, list(_PROMPT.value), max_new_tokens=_MAX_NEW.value or 200,
                      seed=_SEED.value, temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                      greedy=_GREEDY.value, use_cache=_CACHE.value)
  for prompt, text in zip(_PROMPT.value, texts, strict=True):
    print(f"--- {prompt!r}\n{prompt}{text}")
  return 0


def _train():
  if _CONFIG.value is None:
    raise app.UsageError("lngram-exp train needs --config=<file.py[:arg]>.")
  from experiments.train import train
  result = train(_CONFIG.value, _WORKDIR.value)
  if result["interrupted"]:
    print(f"interrupted after step {result['step']}; checkpoint saved in "
          f"{result['workdir']}. Run the same command again to resume.")
    return 130
  print(f"done: {result['step']} steps, run directory {result['workdir']}")
  if "vlm" in _CONFIG.value:
    final = result["final"]
    print(f"VLM {final['stage']}: validation {final['eval']['overall']}")
    return 0
  bpb = result["eval"].get("eval/bits_per_byte")
  print(f"validation bits per byte: {bpb:.4f}")
  return 0


def _setup_logging():
  # Our progress lines at INFO; orbax/absl chatter only from WARNING up.
  logging.getLogger("absl").setLevel(logging.WARNING)
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  ours = logging.getLogger("experiments")
  ours.setLevel(logging.INFO)
  if not ours.handlers:
    handler = logging.StreamHandler(sys.stderr)
    fmt = "%(asctime)s %(message)s"
    if sys.stderr.isatty():
      # Erase the progress bar being redrawn in place; it reappears on the next step.
      fmt = "\r\x1b[K" + fmt
    handler.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    ours.addHandler(handler)
    ours.propagate = False


def main():
  app.run(lambda argv: sys.exit(_run(argv)))


if __name__ == "__main__":
  main()
