"""The `lngram-exp` commands, one module each.

Every module holds, for the commands it runs: `COMMANDS` (name -> the line `lngram-exp
--help` prints), `FLAGS_OF` (name -> the flags it takes), `REQUIRED_OF` (the flags it
cannot run without), `FLAGS` (the absl definitions of the flags only it defines) and
`run(command, flags, argv) -> exit status`; and the command's body as a function of plain
arguments (`train_command`, `eval_command`, `sample_checkpoint`, ...) for notebooks and
tests. Module level imports nothing heavy: the CLI reads the tables first. A mistake is a
one-line ValueError (or OSError, CheckpointError) that experiments/cli prints as
`error: ...`.

  train    train or resume a run                  eval     a checkpoint's validation metrics
  sample   continue prompts                       analyze  the analyses of an LM or VLM run
  plan     a run's per-device cost on a mesh      configs  the config files
  data     prepare-data, train-tokenizer          hf       import-hf, export-hf
  lm_eval  lm-eval: lm-evaluation-harness tasks on a run
"""

from __future__ import annotations

from experiments.cli.commands import analyze, configs, data, hf, lm_eval, plan, sample, train
from experiments.cli.commands import eval as eval_

# In the order `lngram-exp --help` lists them.
MODULES = (train, eval_, sample, configs, plan, analyze, data, hf, lm_eval)
