"""The `lngram-exp` Hugging Face commands: their flags and bodies (experiments/cli/ dispatches to `run`).

    lngram-exp import-hf --hf_dir=checkpoints/Qwen3-1.7B --workdir=runs/qwen3
    lngram-exp export-hf --workdir=runs/qwen3_lngram --out=exported/ [--step=N]

writes a run directory (saved config, step-0 checkpoint, tokenizer files)
that `eval`, `sample`, `analyze`, `experiments.restore` and
`--config.init_from=<workdir>` read like any run; `--config.init_from=hf:DIR`
in `train` starts a run from the checkpoint directly. `export-hf` writes a
run's backbone back as a checkpoint `transformers` loads. The library is
`experiments.hf` (DESIGN.md §11); a mistake is a one-line ValueError.
Both write their directory whole or not at all (a kill leaves nothing at
--out / --workdir; a second writer into the same path is refused), and say in
a `warning:` line what they leave out: a branch with no Hugging Face form, a
missing tokenizer, a checkpoint memory import-hf does not read.
Imports nothing heavy at module level: the CLI reads the tables below first.
"""

from __future__ import annotations

import sys

COMMANDS = {
    "import-hf": "a Hugging Face checkpoint (Qwen3, Qwen3-MoE, Llama, Qwen2, Qwen3-VL, "
                 "Qwen3-VL-MoE) as a run directory",
    "export-hf": "an LM run's backbone as a Hugging Face checkpoint in --out",
}
# --out is defined by experiments/cli/commands/data.py, --workdir and --step by
# experiments/cli/flags.py.
FLAGS_OF = {"import-hf": {"hf_dir", "workdir"}, "export-hf": {"workdir", "out", "step"}}
REQUIRED_OF = {"import-hf": ("hf_dir", "workdir"), "export-hf": ("workdir", "out")}
# (absl kind, name, default, lower bound, help), as experiments/cli/flags.py defines its own.
FLAGS = [
    ("string", "hf_dir", None, None, "import-hf: a Hugging Face checkpoint directory "
     "(config.json + safetensors)."),
]


def run(command: str, f, argv: list[str]) -> int:
  """Runs HF command `command` with the parsed flags `f`."""
  del argv
  # the flags in REQUIRED_OF are checked by experiments/cli
  if command == "export-hf":
    return export_hf_command(f.workdir, f.out, step=f.step)
  return import_hf_command(f.hf_dir, f.workdir)


def import_hf_command(hf_dir: str, workdir: str) -> int:
  """Imports the checkpoint and prints what the run directory holds."""
  from experiments.jobs.hf_runs import import_hf

  out = import_hf(hf_dir, workdir)
  c = out["config"]
  print(f"done: {c.n_layers} layers, d_model {c.d_model}, vocabulary {c.vocab_size}, "
        f"{out['params']} arrays ({c.param_dtype.name}) as step 0 of {out['workdir']}; "
        f"kept {', '.join(out['kept']) or 'no tokenizer files'}")
  return 0


def export_hf_command(workdir: str, out: str, *, step: int | None = None) -> int:
  """Exports the run's backbone and prints where it went."""
  from experiments.jobs.hf_runs import export_hf

  done = export_hf(workdir, out, step=step)
  print(f"checkpoint step {done['step']} of {workdir}", file=sys.stderr)
  print(f"done: {done['tensors']} tensors in {len(done['files'])} file(s), config.json in "
        f"{done['out']}")
  return 0
