"""`lngram-exp train`: train (or resume) a run from a config file into --workdir.

    lngram-exp train --config=experiments/configs/lm_lngram.py[:arg] --workdir=runs/x
                     [--config.train.steps=100 ...] [--max_memory=8GiB]
                     [--coordinator=host0:1234 --num_processes=N --process_id=i]

A refused run leaves nothing behind; an interrupted one saves and exits 130.
"""

from __future__ import annotations

COMMANDS = {"train": "train (or resume) a run from a config file into --workdir"}
FLAGS_OF = {"train": {"config", "workdir", "max_memory", "coordinator", "num_processes",
                      "process_id", "lost_process_timeout"}}
REQUIRED_OF = {"train": ("config", "workdir")}
# (absl kind, name, default, lower bound, help); --config and --workdir: experiments/cli/flags.py.
FLAGS = [
    ("string", "max_memory", None, None, "train: refuse a config whose parameters + "
     "optimizer state exceed this, e.g. 8GiB (default: the machine's memory)."),
    ("string", "coordinator", None, None, "train on several hosts: coordinator host:port."),
    ("integer", "num_processes", None, 1, "train on several hosts: the process count."),
    ("integer", "process_id", None, 0, "train on several hosts: this process's index."),
    ("integer", "lost_process_timeout", 120, 5, "train on several hosts: seconds without a "
     "sign of life from a process before every other one stops, naming it."),
]


def run(command: str, f, argv: list[str]) -> int:
  del command, argv
  return train_command(f.config, f.workdir, max_memory=f.max_memory, coordinator=f.coordinator,
                       num_processes=f.num_processes, process_id=f.process_id,
                       lost_process_timeout=f.lost_process_timeout)


def train_command(config, workdir, *, max_memory: str | None = None,
                  coordinator: str | None = None, num_processes: int | None = None,
                  process_id: int | None = None, lost_process_timeout: int = 120) -> int:
  """Trains (or resumes) `config` in `workdir`; a refused run leaves nothing behind."""
  from experiments.cli import preflight
  preflight.check_workdir(workdir, train=True)
  from experiments.trainer.lost_process import LostProcessWatch
  from experiments.trainer.multihost import start_distributed
  # Before jax touches a device (the memory estimate may): jax.distributed requires it.
  watch = None
  if start_distributed(coordinator, num_processes, process_id,
                       lost_timeout_s=lost_process_timeout):
    from experiments.cli.shutdown import end_process_now
    watch = LostProcessWatch(timeout_s=lost_process_timeout, workdir=workdir,
                             command=f"lngram-exp train ... --workdir={workdir}, each with "
                                     "its --process_id", end_process=end_process_now).start()
  try:
    checked = preflight.check_train_config(config, max_memory=max_memory)
    from experiments.jobs import job, run_train
    with preflight.leave_no_trace(workdir):
      result = run_train(config, workdir, checked=checked)
  except Exception as e:
    if watch is not None:   # a lost peer: its one line, not this error (module docstring)
      watch.settle(e)
    raise
  if result["interrupted"]:
    print(f"interrupted after step {result['step']}; checkpoint saved in "
          f"{result['workdir']}. Run the same command again to resume.")
    return 130
  print(f"done: {result['step']} steps, run directory {result['workdir']}")
  print(job(checked.job).summary(checked, result))
  return 0
