"""Reading and writing Hugging Face safetensors checkpoints, without torch.

The `safetensors` package reads and checks each file (`safe_open`: the header's
length, JSON, dtypes and shapes, offsets that tile the data to the file's end)
and writes them (`safetensors.numpy.save_file`, bf16 through `ml_dtypes`). Its
errors become one-line `HFCheckpointError`s naming the file; a dtype a float
model cannot hold is refused here, by name, before any tensor is read.

A tensor is returned as a read-only `np.memmap` view, not through the package's
`get_tensor` (a copy of the whole tensor) or `get_slice` (a slice, but no
transpose or reshape): a loader transposes and reshapes the view
(experiments/hf/names.py) and only then cuts out a device's shard (load.py), so
a shard reads only its own pages of the file. The view's place follows from what
the package has checked: the tensors, in offset order, tile the data without
gaps and end at the file's end, so each begins at the sum of the sizes before it.

A checkpoint directory holds `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`weight_map`: tensor name -> file name).
When it holds both, `model.safetensors` is read and the index ignored (with a
warning), because transformers' `from_pretrained` looks for the single file
first: the same directory must give the same weights in both.
"""

from __future__ import annotations

import collections
import json
import math
import os
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

# safetensors dtype name -> numpy dtype, for the dtypes a float model holds.
DTYPES = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
          "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class HFCheckpointError(ValueError):
  """A Hugging Face checkpoint directory that cannot be read; the message is one line."""


def _reason(error: SafetensorError) -> str:
  text = " ".join(str(error).split())
  return text.split(": ", 1)[1] if text.startswith("Error while ") else text


def _refusal(path: Path, size: int, error: SafetensorError) -> str:
  """The package's refusal of a file, as one line that says truncated or corrupt."""
  reason = _reason(error)
  if size < 8:
    return f"{path}: truncated safetensors file ({size} bytes, no header)."
  if any(word in reason for word in ("JSON", "UTF-8", "offset")):
    return f"{path}: corrupt safetensors header ({reason})."
  # The header's length past the file's end, or tensors that do not end where it ends.
  return f"{path}: corrupt or truncated safetensors file ({reason}; the file has {size} bytes)."


class SafetensorsFile:
  """The header of one safetensors file and memory-mapped access to its tensors."""

  def __init__(self, path):
    self.path = Path(path)
    size = os.path.getsize(self.path)
    try:
      with safe_open(self.path, framework="np") as f:
        layout = [(name, f.get_slice(name)) for name in f.offset_keys()]
        layout = [(name, s.get_dtype(), tuple(s.get_shape())) for name, s in layout]
    except SafetensorError as e:
      raise HFCheckpointError(_refusal(self.path, size, e)) from None
    self.entries = {}   # name -> (dtype, shape, first byte in the data)
    begin = 0
    for name, dtype_name, shape in layout:
      if dtype_name not in DTYPES:
        raise HFCheckpointError(f"{self.path}: tensor {name} has dtype {dtype_name}, which "
                                f"this loader cannot hold (supported: {sorted(DTYPES)}).")
      self.entries[name] = (DTYPES[dtype_name], shape, begin)
      begin += math.prod(shape) * DTYPES[dtype_name].itemsize
    self.data_start = size - begin

  def tensor(self, name) -> np.ndarray:
    """The tensor as a read-only memory-mapped array (a view into the file)."""
    dtype, shape, begin = self.entries[name]
    if not math.prod(shape):
      return np.zeros(shape, dtype)
    return np.memmap(self.path, dtype=dtype.newbyteorder("<"), mode="r",
                     offset=self.data_start + begin, shape=shape)


class _Object(dict):
  """A JSON object that remembers the keys it held more than once."""

  def __init__(self, pairs):
    super().__init__(pairs)
    self.twice = sorted(k for k, n in collections.Counter(k for k, _ in pairs).items() if n > 1)


class Checkpoint:
  """Every tensor of a checkpoint directory, single-file or sharded, by name.

  The single file first, then the index: transformers' order (a directory with
  both reads `model.safetensors` there too).
  """

  def __init__(self, hf_dir):
    self.dir = Path(hf_dir)
    index = self.dir / INDEX_NAME
    if (self.dir / SINGLE_NAME).is_file():
      files = None
      if index.is_file():
        warnings.warn(f"{self.dir} holds both {SINGLE_NAME} and {INDEX_NAME}: reading "
                      f"{SINGLE_NAME}, as transformers does; the index and its shards are "
                      "ignored.", UserWarning, stacklevel=2)
    elif index.is_file():
      try:
        weight_map = json.loads(index.read_text(), object_pairs_hook=_Object)["weight_map"]
        files = {str(name): str(file) for name, file in weight_map.items()}
      except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise HFCheckpointError(f"{index}: not a safetensors index ({e!s}).") from None
      if weight_map.twice:
        raise HFCheckpointError(f"{index}: tensor {weight_map.twice[0]} is listed twice in "
                                "weight_map.")
    else:
      other = sorted(p.name for p in self.dir.glob("*.bin"))
      hint = f" (found {other}: only safetensors are read)" if other else ""
      raise HFCheckpointError(f"{self.dir}: no weights ({SINGLE_NAME} or {INDEX_NAME})"
                              f"{hint}.")
    self._files: dict[str, SafetensorsFile] = {}
    if files is None:
      single = self._open(SINGLE_NAME)
      self.where = {name: SINGLE_NAME for name in single.entries}
    else:
      self.where = files
      for name, file in files.items():
        if name not in self._open(file).entries:
          raise HFCheckpointError(f"{self.dir / file}: tensor {name}, listed in {INDEX_NAME}, "
                                  "is not in the file.")

  def _open(self, file) -> SafetensorsFile:
    if file not in self._files:
      path = self.dir / file
      if not path.is_file():
        raise HFCheckpointError(f"{path}: listed in {INDEX_NAME} but missing.")
      self._files[file] = SafetensorsFile(path)
    return self._files[file]

  def names(self) -> set[str]:
    return set(self.where)

  def shape(self, name) -> tuple[int, ...]:
    return self._open(self.where[name]).entries[name][1]

  def tensor(self, name) -> np.ndarray:
    return self._open(self.where[name]).tensor(name)


def write_file(path, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
  """Writes `tensors` as one safetensors file (`safetensors.numpy.save_file`: offsets
  8-byte aligned, tensors ordered by alignment then name); an OSError when it cannot."""
  names = {dtype: name for name, dtype in DTYPES.items()}
  for name in sorted(tensors):
    if tensors[name].dtype not in names:
      raise HFCheckpointError(f"tensor {name}: dtype {tensors[name].dtype} cannot be written "
                              f"(supported: {sorted(DTYPES)}).")
  # save_file writes each array's buffer as it lies in memory: a transposed view must be
  # made contiguous first, or its bytes are written in the wrong order.
  contiguous = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
  try:
    save_file(contiguous, path,
              metadata={str(k): str(v) for k, v in metadata.items()} if metadata else None)
  except SafetensorError as e:   # an I/O error (no such directory, disk full) in its words
    raise OSError(f"{path}: cannot write the safetensors file ({_reason(e)}).") from None
