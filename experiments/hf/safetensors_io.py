"""Reading Hugging Face safetensors checkpoints, memory-mapped, without torch.

A safetensors file is an 8-byte little-endian header length N, N bytes of
JSON ({name: {"dtype", "shape", "data_offsets": [begin, end]}, optional
"__metadata__"}), then the raw little-endian tensor bytes; offsets count from
the end of the header. `SafetensorsFile` checks the header against the file
size before any tensor is read, so a truncated or corrupt file is refused in
one line, and returns each tensor as a read-only `np.memmap` view: nothing is
copied until a caller slices or transposes it. bf16 comes from `ml_dtypes`.

A checkpoint directory holds `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`weight_map`: tensor name -> file name).
When it holds both, `model.safetensors` is read and the index ignored (with a
warning), because transformers' `from_pretrained` looks for the single file
first: the same directory must give the same weights in both.
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

# safetensors dtype name -> numpy dtype, for the dtypes a float model holds.
DTYPES = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32),
          "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_MAX_HEADER = 100 * 2**20   # the format's own limit on the JSON header


class HFCheckpointError(ValueError):
  """A Hugging Face checkpoint directory that cannot be read; the message is one line."""


class SafetensorsFile:
  """The header of one safetensors file and memory-mapped access to its tensors."""

  def __init__(self, path):
    self.path = Path(path)
    size = os.path.getsize(self.path)
    with open(self.path, "rb") as f:
      head = f.read(8)
      if len(head) < 8:
        raise HFCheckpointError(f"{self.path}: truncated safetensors file ({size} bytes, "
                                "no header).")
      (n,) = struct.unpack("<Q", head)
      if n > min(_MAX_HEADER, size - 8):
        raise HFCheckpointError(f"{self.path}: corrupt or truncated safetensors file "
                                f"(header of {n} bytes in a file of {size}).")
      try:
        header = json.loads(f.read(n))
      except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFCheckpointError(f"{self.path}: corrupt safetensors header ({e}).") from None
    if not isinstance(header, dict):
      raise HFCheckpointError(f"{self.path}: corrupt safetensors header (not an object).")
    header.pop("__metadata__", None)
    self.data_start = 8 + n
    self.entries = {}
    for name, entry in header.items():
      self.entries[name] = self._checked(name, entry, size - self.data_start)

  def _checked(self, name, entry, data_size):
    try:
      dtype_name, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
      begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
      raise HFCheckpointError(f"{self.path}: corrupt safetensors header entry for "
                              f"{name}.") from None
    if dtype_name not in DTYPES:
      raise HFCheckpointError(f"{self.path}: tensor {name} has dtype {dtype_name}, which "
                              f"this loader cannot hold (supported: {sorted(DTYPES)}).")
    dtype = DTYPES[dtype_name]
    if end > data_size:
      raise HFCheckpointError(f"{self.path}: truncated safetensors file (tensor {name} ends "
                              f"at byte {end} of {data_size} data bytes).")
    if not 0 <= begin <= end or end - begin != int(np.prod(shape)) * dtype.itemsize:
      raise HFCheckpointError(f"{self.path}: corrupt safetensors header (tensor {name}: "
                              f"offsets [{begin}, {end}) do not hold {dtype_name}{list(shape)}).")
    return dtype, shape, begin

  def tensor(self, name) -> np.ndarray:
    """The tensor as a read-only memory-mapped array (a view into the file)."""
    dtype, shape, begin = self.entries[name]
    if not int(np.prod(shape)):
      return np.zeros(shape, dtype)
    return np.memmap(self.path, dtype=dtype.newbyteorder("<"), mode="r",
                     offset=self.data_start + begin, shape=shape)


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
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {str(name): str(file) for name, file in weight_map.items()}
      except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise HFCheckpointError(f"{index}: not a safetensors index ({e!s}).") from None
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
  """Writes `tensors` as one safetensors file (names sorted, offsets 8-byte aligned)."""
  names = {dtype: name for name, dtype in DTYPES.items()}
  header, offset = {}, 0
  for name in sorted(tensors):
    a = tensors[name]
    if a.dtype not in names:
      raise HFCheckpointError(f"tensor {name}: dtype {a.dtype} cannot be written "
                              f"(supported: {sorted(DTYPES)}).")
    size = a.size * a.dtype.itemsize
    header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                    "data_offsets": [offset, offset + size]}
    offset += size
  if metadata:
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name in sorted(tensors):
      f.write(np.ascontiguousarray(tensors[name]).astype(
          tensors[name].dtype.newbyteorder("<"), copy=False).tobytes())
