"""`lngram-exp configs`: every config file with the first line of its docstring."""

from __future__ import annotations

COMMANDS = {"configs": "list the config files with their purpose"}
FLAGS_OF = {"configs": set()}
REQUIRED_OF = {}
FLAGS = []


def run(command: str, f, argv: list[str]) -> int:
  del command, f, argv
  return configs_command()


def configs_command() -> int:
  """Prints every config file with the first line of its docstring."""
  from experiments.configs import config_files, purpose
  files = config_files()
  width = max((len(p.name) for p in files), default=0)   # the longest name, then two spaces
  for path in files:
    print(f"{path.name:<{width}}  {purpose(path)}")
  return 0
