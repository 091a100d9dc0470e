"""`lngram-exp sample`: continue prompts with an LM run's checkpoint.

    lngram-exp sample --workdir=runs/x --prompt='def ' [--max_new_tokens=200 --top_k=20]
                      [--greedy] [--seed=0] [--temperature=0.8] [--nocache] [--mesh=data=2]

In a notebook, the same in one call:

    from experiments.cli.commands.sample import sample_checkpoint
    texts, step, note = sample_checkpoint("runs/lm_lngram", ["def "], max_new_tokens=50)

The run is restored (the newest readable step, or `step`), optionally placed on a
device mesh, and the number of new tokens is capped to what the model holds after
the longest prompt (`note` says so when it is).
"""

from __future__ import annotations

import sys

COMMANDS = {"sample": "continue prompts with an LM run's checkpoint"}
FLAGS_OF = {"sample": {"workdir", "step", "mesh", "prompt", "max_new_tokens", "temperature",
                       "top_k", "greedy", "seed", "cache"}}
REQUIRED_OF = {"sample": ("workdir",)}
# (absl kind, name, default, lower bound, help); --workdir, --step, --mesh, --seed and
# --max_new_tokens: experiments/cli/flags.py.
FLAGS = [
    ("multi_string", "prompt", ["def "], None, "sample: prompt(s), repeatable."),
    ("float", "temperature", 0.8, None, "sample: softmax temperature."),
    ("integer", "top_k", None, 1, "sample: keep the k most likely bytes."),
    ("bool", "greedy", False, None, "sample: argmax decoding."),
    ("bool", "cache", True, None, "sample: KV cache + Lngram decode state."),
]


def run(command: str, f, argv: list[str]) -> int:
  del command, argv
  ignored = [name for name in ("temperature", "top_k", "seed") if f[name].present]
  if f.greedy and ignored:
    raise ValueError(f"sample --greedy does not take --{ignored[0]} (argmax decoding "
                     "draws nothing).")
  return sample_command(f.workdir, f.prompt, step=f.step, mesh=f.mesh,
                        max_new_tokens=f.max_new_tokens, seed=f.seed,
                        temperature=f.temperature, top_k=f.top_k, greedy=f.greedy,
                        use_cache=f.cache)


def sample_command(workdir, prompts: list[str], *, step: int | None = None,
                   mesh: str | None = None, max_new_tokens: int | None = None,
                   **sampling) -> int:
  """Prints the continuation of each prompt (`sampling`: seed, temperature, top_k,
  greedy, use_cache of `sample_checkpoint`)."""
  from experiments.cli import preflight
  preflight.check_workdir(workdir, train=False)
  prompts = preflight.check_prompts(list(prompts))   # before the restore
  texts, step, note = sample_checkpoint(
      workdir, prompts, step=step, mesh=preflight.mesh_block(mesh),
      max_new_tokens=200 if max_new_tokens is None else max_new_tokens, **sampling)
  print(f"checkpoint step {step} of {workdir}", file=sys.stderr)
  if note:
    print(f"note: {note}", file=sys.stderr)
  for prompt, text in zip(prompts, texts, strict=True):
    print(f"--- {prompt!r}\n{prompt}{text}")
  return 0


def sample_checkpoint(workdir, prompts: list[str], *, step: int | None = None,
                      mesh: dict | None = None, max_new_tokens: int = 200, seed: int = 0,
                      temperature: float = 0.8, top_k: int | None = None,
                      greedy: bool = False, use_cache: bool = True
                      ) -> tuple[list[str], int, str]:
  """(the continuation of each prompt, the checkpoint step used, a note or "").

  `mesh`: a `mesh` block ({"data": 2, "table": 4}) to sample on a device mesh;
  None: one device. Raises a one-line ValueError for a VLM run, a prompt the
  model cannot hold, or prompts that are empty or not UTF-8 text.
  """
  from experiments.cli.preflight import check_prompts
  from experiments.jobs.lm.evaluate import require_lm
  from experiments.jobs.lm.sample import cap_new_tokens, sample_text
  from experiments.jobs.restore import restore_module
  prompts = check_prompts(list(prompts))
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
  if mesh:
    from experiments.trainer.placement import make_train_mesh
    device_mesh = make_train_mesh(mesh)   # a bad block fails here, before the restore
  model, saved, step = restore_module(workdir, step)
  require_lm(saved, workdir, "sample")
  from experiments.jobs.lm.codec import run_codec
  codec = run_codec(workdir, saved, model, "sample")
  if mesh:
    from experiments.models.layout import placement_rules
    from experiments.trainer.placement import place_model
    place_model(model, device_mesh, rules=placement_rules(model))
  max_new, note = cap_new_tokens(model.config.max_len, prompts, max_new_tokens, codec)
  texts = sample_text(model, prompts, max_new_tokens=max_new, seed=seed,
                      temperature=temperature, top_k=top_k, greedy=greedy,
                      use_cache=use_cache, codec=codec)
  return texts, step, note
