"""Hugging Face hub ids where a checkpoint or tokenizer directory is taken.

    resolve_checkpoint("checkpoints/Qwen3-0.6B")     that directory, as is
    resolve_checkpoint("Qwen/Qwen3-0.6B")            the hub snapshot's directory in the
                                                     local Hugging Face cache (fetched once)
    resolve_checkpoint("Qwen/Qwen3-0.6B@<rev>")      a branch, tag or commit of it
    resolve_checkpoint(..., what="tokenizer")        the tokenizer files alone

`import-hf --hf_dir=`, `init_from=hf:` and `prepare-data --tokenizer=` (and
`load_hf`, `fill_backbone`, `load_qwen3vl`) take either. An existing local
directory always wins; any other `org/name[@revision]` is a hub id, fetched
with `huggingface_hub.snapshot_download` into its cache, which honours
`HF_HUB_CACHE` / `HF_HOME`, `HF_HUB_OFFLINE` (the cache alone: no request) and
`HF_TOKEN` (gated or private models). Only what this library reads is fetched:
config.json, generation_config.json, the safetensors files and their index, the
tokenizer's and the processor's files — never `*.bin`, `*.pt`, `*.msgpack` or
`*.h5` weights, nor files in sub-folders; for a tokenizer, its files only.
A mistake (not a directory nor an id, an id not cached while offline or the hub
unreachable, no such model or revision) is a one-line HFCheckpointError (a
ValueError).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from experiments.hf.safetensors_io import HFCheckpointError

log = logging.getLogger("experiments")

TOKENIZER_PATTERNS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                      "added_tokens.json", "chat_template.jinja", "chat_template.json",
                      "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model")
CHECKPOINT_PATTERNS = ("config.json", "generation_config.json", "*.safetensors",
                       "*.safetensors.index.json", "lngram_v2_config.json",
                       "preprocessor_config.json", "processor_config.json",
                       "video_preprocessor_config.json") + TOKENIZER_PATTERNS
# The one file each kind cannot do without (checked in a fetched snapshot).
NEEDED = {"checkpoint": "config.json", "tokenizer": "tokenizer.json"}
# Weights of other frameworks, and sub-folders ("original/", "onnx/", ...), are never fetched.
IGNORE_PATTERNS = ("*/*", "*.bin", "*.pt", "*.pth", "*.msgpack", "*.h5", "*.ckpt", "*.gguf")

# The hub's own rule: [A-Za-z0-9_.-], 1..96 characters, not starting or ending with "-" or
# ".", no "--" or "..", no ".git" ending; an id here has an owner: exactly one "/".
_PART = r"(?![-.])[A-Za-z0-9_.\-]{1,96}(?<![-.])"
_HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[^\s@]+))?")
_resolved: dict[tuple, Path] = {}


def parse_hub_id(name: str) -> tuple[str, str | None] | None:
  """(repo_id, revision or None) of `org/name[@revision]`, else None."""
  m = _HUB_ID.fullmatch(str(name))
  if m is None or "--" in m["repo"] or ".." in m["repo"] or m["repo"].endswith(".git"):
    return None
  return m["repo"], m["revision"]


def allow_patterns(what: str = "checkpoint") -> list[str]:
  """The files a hub snapshot of `what` ("checkpoint" or "tokenizer") is fetched with."""
  if what not in NEEDED:
    raise ValueError(f"what={what!r}: 'checkpoint' or 'tokenizer'.")
  return list(CHECKPOINT_PATTERNS if what == "checkpoint" else TOKENIZER_PATTERNS)


def resolve_checkpoint(name_or_dir, *, what: str = "checkpoint") -> Path:
  """The local directory of a checkpoint (or tokenizer) named by a directory or a hub id.

  An existing directory is returned as is; `org/name[@revision]` is fetched (only
  `allow_patterns(what)`) into the Hugging Face cache, or found there, and its
  snapshot directory returned. Anything else: "NAME: not a directory" (one line).
  """
  allow = allow_patterns(what)
  path = Path(str(name_or_dir)).expanduser()
  if path.is_dir():
    return path
  parsed = None if path.exists() else parse_hub_id(str(name_or_dir))
  if parsed is None:
    raise HFCheckpointError(f"{name_or_dir}: not a directory (nor a Hugging Face hub id, "
                            "org/name[@revision]).")
  try:
    import huggingface_hub
    from huggingface_hub import constants
  except ImportError:
    raise HFCheckpointError(f"{name_or_dir}: not a directory; fetching it as a Hugging Face "
                            "hub id needs the huggingface_hub package (pip install "
                            "huggingface_hub).") from None
  repo_id, revision = parsed
  key = (repo_id, revision, what, constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE)
  if key in _resolved and _resolved[key].is_dir():
    return _resolved[key]
  try:
    folder = huggingface_hub.snapshot_download(repo_id, revision=revision,
                                               allow_patterns=allow,
                                               ignore_patterns=list(IGNORE_PATTERNS))
  except Exception as e:   # every hub failure: one line naming the id
    raise HFCheckpointError(_hub_failure(str(name_or_dir), repo_id, revision, what, e)) \
        from None
  folder = Path(folder)
  if not (folder / NEEDED[what]).is_file():
    why = (": not a transformers checkpoint (or only its tokenizer is cached, and the hub "
           "cannot be reached)" if what == "checkpoint"
           else " (the tokenizers package reads that file alone)")
    raise HFCheckpointError(f"{name_or_dir}: the Hugging Face hub snapshot {folder} holds no "
                            f"{NEEDED[what]}{why}.")
  log.info("%s: the Hugging Face hub's %s files in %s", name_or_dir, what, folder)
  _resolved[key] = folder
  return folder


def _first_line(e: Exception) -> str:
  text = " ".join(str(e).split("\n")[0].split())
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _hub_failure(name: str, repo_id: str, revision: str | None, what: str,
                 e: Exception) -> str:
  """The one line of a failed `snapshot_download` of `repo_id`."""
  from huggingface_hub import constants, errors

  at = f" (revision {revision!r})" if revision else ""
  head = f"{name}: not a local directory, and the Hugging Face hub id {repo_id!r}{at}"
  incomplete = getattr(errors, "IncompleteSnapshotError", ())
  if isinstance(e, errors.RevisionNotFoundError):
    return f"{head} has no such revision on the hub."
  if isinstance(e, errors.GatedRepoError):
    return (f"{head} is a gated model: accept its terms on the hub and log in (hf auth login, "
            "or set HF_TOKEN).")
  if isinstance(e, errors.RepositoryNotFoundError) or (
      isinstance(e, errors.HfHubHTTPError) and getattr(e.response, "status_code", None) == 401):
    return (f"{head} is not a model on the hub (or a private one: log in with hf auth login, "
            "or set HF_TOKEN); a misspelt local path?")
  offline = constants.HF_HUB_OFFLINE
  why = ("HF_HUB_OFFLINE is set" if offline
         else f"the hub could not be reached ({_first_line(e.__cause__ or e)})")
  if incomplete and isinstance(e, incomplete):
    return (f"{head} is only partly in the local cache ({constants.HF_HUB_CACHE}) and {why}: "
            f"{_first_line(e)}")
  if isinstance(e, errors.LocalEntryNotFoundError):
    local = "checkpoint directory" if what == "checkpoint" else "tokenizer.json"
    return (f"{head} is not in the local cache ({constants.HF_HUB_CACHE}) and {why}; fetch "
            f"it once with network access, or pass a local {local}.")
  return f"{head} could not be fetched: {_first_line(e)}"
