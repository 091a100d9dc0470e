"""A command line's flags, parsed by absl + ml_collections' config_flags, each mistake one line.

`parse_command_line(flag_values, argv)` parses `argv` with `flag_values`
(which holds a `config_flags.DEFINE_config_file("config", ...)` flag) and turns
what absl and config_flags raise into a `UsageError` or a one-line
`ValueError` naming the flag or config field:

  --config=lm_lngram.py        found in experiments/configs when not a path;
                               a missing file -> "config file 'x.py' not found."
  --config.train.stepz=5       "unknown field train.stepz (did you mean train.steps?)"
  --config.train.steps=many    "train.steps='many' is not an int."
  --config.model.memory=...    a block of fields is refused (set its fields one by one)
  --config.x=1 without --config  a usage error

ml_collections 1.0 and 1.1 raise differently for some of these (a block given a
value: 1.0 refuses the type, 1.1 parses a dict literal); the translation below
checks the fields itself where they differ. `config_from_command_line(spec,
[(field, text)])` gives the config such a command line gives (for a notebook
or a test).
"""

from __future__ import annotations

import difflib
import re
import traceback
from pathlib import Path

from absl import flags


class UsageError(Exception):
  """Wrong command line: printed as `usage: ...`, exit status 2."""


_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")
_CONFIG = re.compile(r"^--?config(=|$)")


def field_names(config, prefix: str = "") -> list[str]:
  """Dotted names of every leaf field of a ConfigDict."""
  names = []
  for key, value in config.items():
    name = f"{prefix}{key}"
    names += field_names(value, name + ".") if hasattr(value, "items") else [name]
  return names


def config_spec(argv: list[str]) -> tuple[int | None, str | None]:
  """(index in argv holding the `--config` value, that value) or (None, None)."""
  for i, arg in enumerate(argv):
    match = _CONFIG.match(arg)
    if match and match.group(1):
      return i, arg.split("=", 1)[1]
    if match and i + 1 < len(argv):
      return i + 1, argv[i + 1]
    if match:
      raise UsageError(f"{arg} needs a value: --config=<file.py[:arg]>.")
  return None, None


def override_fields(argv: list[str]) -> list[str]:
  """The config fields `argv` overrides (`--config.a.b=v`, `--config.a.b v`), in order."""
  return [m.group(1) for m in map(_OVERRIDE.match, argv) if m]


def resolve_config_path(spec: str) -> str:
  """`path.py[:arg]` with the path found (as given, else by name in experiments/configs)."""
  from experiments.configs import CONFIG_DIR
  path, colon, arg = spec.partition(":")
  if not Path(path).is_file() and (CONFIG_DIR / Path(path).name).is_file():
    path = str(CONFIG_DIR / Path(path).name)
  if not Path(path).is_file():
    raise FileNotFoundError(f"config file {path!r} not found.")
  return path + colon + arg


def unknown_field_error(config, fields: list[str]) -> ValueError | None:
  """The error for the first of `fields` that `config` lacks or holds as a block."""
  names = field_names(config)
  for field in fields:
    if field in names:
      continue
    node = config
    for part in field.split("."):
      node = node.get(part) if hasattr(node, "get") else None
    if hasattr(node, "items"):
      first = next(iter(node.keys()), "x")
      return ValueError(f"{field} is a block of fields; set them one by one, e.g. "
                        f"--config.{field}.{first}=...")
    close = difflib.get_close_matches(field, names, n=1, cutoff=0.6)
    return ValueError(f"unknown field {field}" + (f" (did you mean {close[0]}?)" if close
                                                   else ""))
  return None


# absl's parser of a field -> what the field's value must be.
_KINDS = {"IntegerParser": "an int", "FloatParser": "a number",
          "BooleanParser": "a bool (true/false)", "TupleParser": "a tuple, e.g. 1,2"}


def _deepest(error: BaseException) -> BaseException:
  while error.__cause__ or error.__context__:
    error = error.__cause__ or error.__context__
  return error


def _value_error(flag_values, argv, index, error: flags.IllegalFlagValueError) -> ValueError:
  """One line for a flag value absl refused, naming the config field and its type."""
  match = re.match(r"flag --([^=]+)=(.*?): ", str(error), re.S)
  name, text = match.groups() if match else ("", "")
  if name == "config":   # the config file's get_config raised: its own message
    inner = _deepest(error)
    return ValueError((str(inner).strip().splitlines() or [type(inner).__name__])[-1])
  field = name[len("config."):] if name.startswith("config.") else None
  if field:
    block = _field_error(argv, index, [field])   # a block given a value, in ml_collections 1.1
    kind = _KINDS.get(type(flag_values[name].parser).__name__) if name in flag_values else None
    if block or kind:
      return block or ValueError(f"{field}={text!r} is not {kind}.")
  return ValueError(" ".join(str(error).split()))


def parse_command_line(flag_values: flags.FlagValues, argv: list[str]) -> list[str]:
  """Parses `argv` into `flag_values`; returns the arguments that are not flags.

  `argv` must be the list `flag_values`' config flag was defined with (its
  `sys_argv`): config_flags reads the overrides from it. The config path in it
  is resolved in place.
  """
  index, spec = config_spec(argv)
  fields = override_fields(argv)
  if fields and index is None:
    raise UsageError("--config.<field> overrides need --config=<file.py[:arg]>.")
  if index is not None:
    resolved = resolve_config_path(spec)
    argv[index] = (argv[index].split("=", 1)[0] + "=" + resolved
                   if argv[index].startswith("-") else resolved)
  try:
    rest = flag_values(argv)
  except flags.IllegalFlagValueError as e:
    raise _value_error(flag_values, argv, index, e) from e
  except flags.Error as e:   # an unknown flag, overrides before --config, ...
    error = _field_error(argv, index, fields)
    raise (error or ValueError(" ".join(str(e).split()))) from e
  except (AttributeError, KeyError) as e:   # config_flags: a field the config lacks
    error = _field_error(argv, index, fields) or config_file_error(
        e, argv[index] if index is not None else None)
    if error is None:
      raise
    raise error from e
  except Exception as e:   # the config file's own code: a syntax error, an exception
    if (error := config_file_error(e, argv[index] if index is not None else None)) is None:
      raise
    raise error from e
  if index is not None:
    # ml_collections >= 1.1 accepts a dict literal for a block, replacing all its fields.
    blocks = [f for f, v in flag_values["config"].override_values.items() if hasattr(v, "items")]
    if blocks:
      raise _field_error(argv, index, blocks) or ValueError(f"{blocks[0]} is a block")
  return rest


def config_file_error(error: BaseException, spec: str | None) -> ValueError | None:
  """One line for an error raised by the config file itself (a syntax error, an
  exception in its get_config): the file, the line and the error; None when the error
  did not come from that file. `spec`: the --config argument (`[--config=]path[:arg]`)."""
  if not spec:
    return None
  path = Path(spec.split("=", 1)[1] if spec.startswith("-") else spec).resolve()
  path = Path(str(path).partition(":")[0])
  inner = error
  while not isinstance(inner, SyntaxError) and (inner.__cause__ or inner.__context__):
    inner = inner.__cause__ or inner.__context__
  if isinstance(inner, SyntaxError) and inner.filename and Path(inner.filename).resolve() == path:
    return ValueError(f"config file {path}, line {inner.lineno}: {type(inner).__name__}: "
                      f"{inner.msg}.")
  inner = _deepest(error)
  line = None
  for cause in (inner, error):
    frames = traceback.extract_tb(cause.__traceback__)
    line = next((f.lineno for f in reversed(frames) if Path(f.filename).resolve() == path), None)
    if line is not None:
      break
  if line is None:
    return None
  message = (str(inner).strip().splitlines() or [""])[-1]
  return ValueError(f"config file {path}, line {line}: {type(inner).__name__}"
                    f"{': ' + message if message else ''}.")


def config_from_command_line(spec: str, overrides=()):
  """The locked ConfigDict that `--config=<spec> --config.<field>=<text> ...` gives, exactly
  as `lngram-exp train` parses it; `overrides`: [(field, text)]."""
  from ml_collections import config_flags
  argv = ["lngram-exp", f"--config={spec}", *(f"--config.{f}={t}" for f, t in overrides)]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, sys_argv=argv)
  parse_command_line(flag_values, argv)
  return flag_values.config


def given_flags(flag_values: flags.FlagValues) -> list[str]:
  """The flags given on the command line; every config override counts as `config`."""
  names = []
  for name in flag_values:
    if flag_values[name].present:
      name = name.split(".", 1)[0]
      names += [] if name in names else [name]
  return names


def refuse_flags(given: list[str], command: str, takes: set[str],
                 owners: dict[str, set[str]]) -> None:
  """One line for the first flag in `given` that `command` does not take (`--debug` always is)."""
  for name in given:
    if name in takes or name == "debug":
      continue
    others = [owner for owner, names in owners.items() if name in names]
    where = f" (a flag of {', '.join(others)})" if others else ""
    why = ": it uses the config saved with the run" if name == "config" else ""
    raise ValueError(f"{command} does not take --{name}{where}{why}.")


def mentions_config(argv: list[str]) -> bool:
  """Whether `argv` gives `--config` or a `--config.<field>` override."""
  return any(_CONFIG.match(a) or _OVERRIDE.match(a) for a in argv)


def _field_error(argv, index, fields) -> ValueError | None:
  if index is None or not fields:
    return None
  from experiments.configs import load_config
  spec = argv[index].split("=", 1)[1] if argv[index].startswith("-") else argv[index]
  return unknown_field_error(load_config(spec), fields)
