"""The `lngram-exp` Hugging Face commands: their flags and bodies (experiments/cli/ dispatches to `run`).

    lngram-exp import-hf --hf_dir=checkpoints/Qwen3-1.7B --workdir=runs/qwen3
    lngram-exp export-hf --workdir=runs/qwen3_lngram --out=exported/ [--step=N] [--adapter]
    lngram-exp import-hf --hf_dir=checkpoints/Qwen3-1.7B --adapter=my_lora/ --workdir=runs/q

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
FLAGS_OF = {"import-hf": {"hf_dir", "workdir", "adapter"},
            "export-hf": {"workdir", "out", "step", "adapter"}}
REQUIRED_OF = {"import-hf": ("hf_dir", "workdir"), "export-hf": ("workdir", "out")}
# A shared flag's text in this command's --help (--out is defined with prepare-data's).
FLAG_HELP = {"export-hf": {"out": "the new Hugging Face checkpoint directory (config.json, "
                                  "safetensors, tokenizer files), written whole or not at all."}}
def adapter_flag(name, default, text, flag_values):
  """--adapter: a string flag that also takes absl's bare boolean form (`--adapter`, read as
  "true"), so export-hf's switch and import-hf's directory are one flag."""
  from absl import flags
  flag = flags.Flag(flags.ArgumentParser(), flags.ArgumentSerializer(), name, default, text,
                    boolean=True)
  flags.DEFINE_flag(flag, flag_values=flag_values)


# (absl kind, name, default, lower bound, help), as experiments/cli/flags.py defines its own.
FLAGS = [
    ("string", "hf_dir", None, None, "import-hf: a Hugging Face checkpoint directory "
     "(config.json + safetensors), or a hub id (org/name[@revision]: fetched once into the "
     "hub's cache; HF_HUB_OFFLINE=1 reads the cache alone)."),
    # A bare `--adapter` (export-hf: write the PEFT adapter) or `--adapter=DIR` (import-hf:
    # the PEFT adapter to put on the base): one flag, read as absl reads a boolean's bare form.
    (adapter_flag, "adapter", None, None, "export-hf: write the run's LoRA factors as a PEFT "
     "adapter (adapter_config.json + adapter_model.safetensors) instead of merged weights; "
     "import-hf: a PEFT LoRA adapter directory to load onto the checkpoint."),
]


def run(command: str, f, argv: list[str]) -> int:
  """Runs HF command `command` with the parsed flags `f`."""
  del argv
  # the flags in REQUIRED_OF are checked by experiments/cli
  adapter = f.adapter
  if command == "export-hf":
    if adapter not in (None, "true", "false"):
      raise ValueError(f"export-hf --adapter takes no value (got {adapter!r}): it writes the "
                       "run's LoRA factors as a PEFT adapter.")
    return export_hf_command(f.workdir, f.out, step=f.step, adapter=adapter == "true")
  if adapter in ("true", "false"):
    raise ValueError("import-hf --adapter needs a directory: --adapter=DIR (a PEFT adapter).")
  return import_hf_command(f.hf_dir, f.workdir, adapter=adapter)


def import_hf_command(hf_dir: str, workdir: str, adapter: str | None = None) -> int:
  """Imports the checkpoint (with a PEFT adapter's factors) and prints what the run holds."""
  from experiments.jobs.hf_runs import import_hf

  out = import_hf(hf_dir, workdir, adapter=adapter)
  c = out["config"]
  print(f"done: {c.n_layers} layers, d_model {c.d_model}, vocabulary {c.vocab_size}, "
        f"{out['params']} arrays ({c.param_dtype.name}) as step 0 of {out['workdir']}; "
        f"kept {', '.join(out['kept']) or 'no tokenizer files'}")
  return 0


def export_hf_command(workdir: str, out: str, *, step: int | None = None,
                      adapter: bool = False) -> int:
  """Exports the run's backbone (merged with its LoRA factors, or `adapter`: the factors
  as a PEFT adapter) and prints where it went."""
  from experiments.jobs.hf_runs import export_hf

  done = export_hf(workdir, out, step=step, adapter=adapter)
  print(f"checkpoint step {done['step']} of {workdir}", file=sys.stderr)
  print(f"done: {done['tensors']} tensors in {len(done['files'])} file(s), config.json in "
        f"{done['out']}")
  return 0
