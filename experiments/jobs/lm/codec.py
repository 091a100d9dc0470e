"""A Hugging Face run's own tokenizer for `sample` and generation, with its EOS ids.

    hf_codec(workdir)   the codec (encode / decode / unit / eos_ids) of a run
                        that keeps the checkpoint's tokenizer.json (import-hf
                        copies it, DESIGN.md §11.3), or None

The tokenizer is read with the `tokenizers` package (no torch, no
transformers) through the token-data codec (experiments/data/tokens/tokenizer.py).
EOS: `eos_token_id` of generation_config.json, else of the source config.json
(`hf_config.json`); an int or a list of ints. A continuation is cut before its
first EOS token (the token itself is not printed).
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.hf.config import HF_CONFIG_COPY
from experiments.hf.safetensors_io import HFCheckpointError

TOKENIZER = "tokenizer.json"


def eos_ids(workdir) -> tuple[int, ...]:
  """The EOS token ids a run's generation stops at (generation_config.json first)."""
  for name in ("generation_config.json", HF_CONFIG_COPY):
    path = Path(workdir) / name
    if not path.is_file():
      continue
    try:
      value = json.loads(path.read_text()).get("eos_token_id")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
      raise HFCheckpointError(f"{path}: not a JSON object ({e}).") from None
    if value is None:
      continue
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
      raise HFCheckpointError(f"{path}: eos_token_id={value!r} is not a token id or a "
                              "list of them.")
    return tuple(values)
  return ()


class HFCodec:
  """Text <-> ids with the run's tokenizer.json; `eos_ids` end a continuation."""

  unit = "tokens"

  def __init__(self, workdir):
    from experiments.data.tokens.tokenizer import Codec
    self._codec = Codec(str(workdir))
    self.eos_ids = eos_ids(workdir)

  def encode(self, text: str):
    ids = self._codec.encode(text)
    if not ids.size:
      raise ValueError(f"--prompt={text!r} encodes to no tokens with the run's {TOKENIZER}.")
    return ids

  def decode(self, ids) -> str:
    return self._codec.decode(cut_at_eos(ids, self.eos_ids))


def cut_at_eos(ids, eos: tuple[int, ...]):
  """`ids` up to (not including) the first EOS id."""
  ids = list(int(i) for i in ids)
  for n, token in enumerate(ids):
    if token in eos:
      return ids[:n]
  return ids


def hf_codec(workdir) -> HFCodec | None:
  """The codec of a run imported from a Hugging Face checkpoint, or None."""
  workdir = Path(workdir)
  if (workdir / TOKENIZER).is_file() and (workdir / HF_CONFIG_COPY).is_file():
    return HFCodec(workdir)
  return None


def run_codec(workdir, saved: dict, model, command: str):
  """The codec text goes through for the LM run in `workdir` (its checkpoint's saved
  config `saved`): a token run's copy of its tokenizer, an imported checkpoint's
  tokenizer.json (HFCodec), or None for bytes. A model whose vocabulary is not the 256
  bytes and whose run holds no tokenizer is refused in one line naming `command`."""
  if saved.get("experiment", {}).get("data", {}).get("kind") == "tokens":
    from experiments.data.tokens.run import run_codec as token_codec
    return token_codec(workdir)   # the run's own copy of its tokenizer
  codec = hf_codec(workdir)   # import-hf: the checkpoint's tokenizer.json and EOS ids
  vocab = int(model.config.vocab_size)
  if codec is None and vocab != 256:
    # Bytes would be read as this vocabulary's ids: a run imported without its tokenizer.
    raise ValueError(f"{workdir} holds no tokenizer.json and its model's vocabulary is "
                     f"{vocab:,} ids, not 256 bytes: copy the checkpoint's tokenizer.json "
                     f"into the run directory to {command} it.")
  return codec
