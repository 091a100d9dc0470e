"""experiments/hf/safetensors_io.py on the `safetensors` package: what it writes is read
back bit for bit (bf16 included) by the package's torch loader and by ours; our
memory-mapped views sit where the package's tensors are, so a shard's slice reads
only that slice; every damaged file or index is refused in one line."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from experiments.hf.safetensors_io import (
  INDEX_NAME,
  SINGLE_NAME,
  Checkpoint,
  HFCheckpointError,
  SafetensorsFile,
  write_file,
)

RNG = np.random.default_rng(0)


def _bits(a: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def _mixed() -> dict[str, np.ndarray]:
  """Every dtype we write, a transposed (non-contiguous) view, and empty tensors."""
  f32 = RNG.standard_normal((5, 7)).astype(np.float32)
  return {"bf16": RNG.standard_normal((3, 4, 5)).astype(ml_dtypes.bfloat16),
          "bf16.odd": RNG.standard_normal((3,)).astype(ml_dtypes.bfloat16),
          "f16": RNG.standard_normal((9,)).astype(np.float16),
          "f32.T": f32.T, "f64": RNG.standard_normal((2, 3)),
          "empty": np.zeros((0, 4), np.float32), "empty.bf16": np.zeros((0,), ml_dtypes.bfloat16)}


@pytest.mark.parametrize("fmt", ["pt", "np"])
def test_what_we_write_is_read_back_bit_for_bit(tmp_path, fmt):
  torch_st = pytest.importorskip("safetensors.torch")
  torch = pytest.importorskip("torch")
  tensors, path = _mixed(), tmp_path / SINGLE_NAME
  write_file(path, tensors, {"format": fmt})
  with safe_open(path, framework="np") as f:
    assert f.metadata() == {"format": fmt}
    assert f.get_slice("bf16").get_dtype() == "BF16"
  theirs, ours = torch_st.load_file(path), SafetensorsFile(path)
  assert set(theirs) == set(ours.entries) == set(tensors)
  assert theirs["bf16"].dtype == torch.bfloat16
  for name, want in tensors.items():
    got = theirs[name]
    as_bits = got.view(torch.int16 if got.dtype in (torch.bfloat16, torch.float16) else
                       {4: torch.int32, 8: torch.int64}[got.element_size()])
    np.testing.assert_array_equal(as_bits.numpy().view(_bits(want).dtype), _bits(want),
                                  err_msg=name)
    mine = ours.tensor(name)
    assert mine.dtype == want.dtype and mine.shape == want.shape, name
    np.testing.assert_array_equal(_bits(mine), _bits(want), err_msg=name)


def test_a_file_torch_wrote_and_no_metadata(tmp_path):
  """Our views sit where the package's tensors are, in a file the package's torch writer
  laid out (its own order and alignment), and without metadata."""
  torch = pytest.importorskip("torch")
  torch_st = pytest.importorskip("safetensors.torch")
  path = tmp_path / "t.safetensors"
  torch_st.save_file({"z": torch.randn(3, 5, dtype=torch.bfloat16), "a": torch.randn(7),
                      "m": torch.randn(2, 2, dtype=torch.float64),
                      "e": torch.zeros(0, 3, dtype=torch.float16)}, path)
  ours = SafetensorsFile(path)
  with safe_open(path, framework="np") as f:
    for name in f.keys():
      np.testing.assert_array_equal(_bits(ours.tensor(name)), _bits(f.get_tensor(name)))
  write_file(tmp_path / "plain.safetensors", {"a": np.ones(3, np.float32)})
  with safe_open(tmp_path / "plain.safetensors", framework="np") as f:
    assert not f.metadata()


def test_a_shard_reads_its_slice_from_a_view(tmp_path):
  """A tensor is a memory-mapped view, not a copy: a transpose and a shard's slice of it
  stay views into the file and equal the package's own lazy slice (get_slice)."""
  big = RNG.standard_normal((1024, 768)).astype(ml_dtypes.bfloat16)
  small = RNG.standard_normal((16,)).astype(np.float32)
  write_file(tmp_path / "model-00001-of-00002.safetensors", {"small": small}, {"format": "pt"})
  write_file(tmp_path / "model-00002-of-00002.safetensors", {"big": big}, {"format": "pt"})
  (tmp_path / INDEX_NAME).write_text(json.dumps(
      {"metadata": {}, "weight_map": {"small": "model-00001-of-00002.safetensors",
                                      "big": "model-00002-of-00002.safetensors"}}))
  ckpt = Checkpoint(tmp_path)
  assert ckpt.names() == {"small", "big"} and ckpt.shape("big") == (1024, 768)
  view = ckpt.tensor("big")
  assert isinstance(view, np.memmap) and not view.flags.writeable
  shard = view.T[256:384]   # one device's rows of the transposed parameter
  assert isinstance(shard, np.memmap) and np.shares_memory(shard, view)
  with safe_open(tmp_path / "model-00002-of-00002.safetensors", framework="np") as f:
    lazy = f.get_slice("big")[:, 256:384]
  np.testing.assert_array_equal(_bits(shard), _bits(lazy.T))
  np.testing.assert_array_equal(_bits(shard), _bits(big.T[256:384]))
  np.testing.assert_array_equal(ckpt.tensor("small"), small)


def _write(path, header: dict | list, data: bytes) -> None:
  blob = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def _refused(path, *needles, what="") -> str:
  with pytest.raises(HFCheckpointError) as e:
    SafetensorsFile(path)
  message = str(e.value)
  assert "\n" not in message and str(path) in message, (what, message)
  for needle in needles:
    assert needle in message, (what, message)
  return message


def test_every_damaged_file_is_refused_in_one_line(tmp_path):
  path = tmp_path / SINGLE_NAME
  write_file(path, {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                    "b": np.ones(4, ml_dtypes.bfloat16)}, {"format": "pt"})
  data = path.read_bytes()
  body = np.arange(8, dtype="<f4").tobytes()
  f32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
  cases = {
      "empty": (b"", ["truncated", "no header"]),
      "header cut": (data[:5], ["truncated", "no header"]),
      "data cut": (data[:-3], ["truncated"]),
      "bytes after the last tensor": (data + b"xx", ["corrupt"]),
      "header past the end": (struct.pack("<Q", 10**6) + data[8:], ["truncated"]),
      "header too large": (struct.pack("<Q", 2**40) + data[8:], ["corrupt"]),
      "not UTF-8": (data[:8] + b"\xff" * 16 + data[24:], ["corrupt"]),
  }
  for what, (blob, needles) in cases.items():
    path.write_bytes(blob)
    _refused(path, *needles, what=what)
  headers = {
      "not an object": ([1, 2], body, ["corrupt"]),
      "an entry without offsets": ({"a": {"dtype": "F32", "shape": [2]}}, body[:8], ["corrupt"]),
      "offsets that do not hold the shape": (
          {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, body[:8],
          ["corrupt"]),
      "a gap": ({"a": f32, "b": {**f32, "data_offsets": [16, 24]}}, body[:24], ["corrupt", "b"]),
      "an overlap": ({"a": f32, "b": {**f32, "data_offsets": [4, 12]}}, body[:12],
                     ["corrupt", "b"]),
      "a negative offset": ({"a": {**f32, "data_offsets": [-8, 0]}}, b"", ["corrupt"]),
      "a dtype the format lacks": ({"a": {**f32, "dtype": "Q4"}}, body[:8], ["corrupt", "Q4"]),
      "a tensor cut short": ({"a": f32}, body[:4], ["truncated"]),
  }
  for what, (header, tail, needles) in headers.items():
    _write(path, header, tail)
    _refused(path, *needles, what=what)
  # A dtype the format has but a float model cannot hold: named, with what is supported.
  _write(path, {"__metadata__": {"format": "pt"}, "w": {**f32, "dtype": "I32"}}, body[:8])
  _refused(path, "tensor w has dtype I32", "BF16")


def test_a_tensor_named_twice_in_the_header_is_refused(tmp_path):
  """Duplicate JSON keys in a header: the package keeps one, whose bytes then do not tile
  the data, and refuses it."""
  path = tmp_path / SINGLE_NAME
  blob = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
          b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
  path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(8))
  _refused(path, "corrupt")


def _sharded(tmp_path, weight_map_text: str):
  write_file(tmp_path / "s1.safetensors", {"a": np.ones(2, np.float32)})
  write_file(tmp_path / "s2.safetensors", {"b": np.ones(2, np.float32)})
  (tmp_path / INDEX_NAME).write_text('{"metadata": {}, "weight_map": ' + weight_map_text + "}")


def _checkpoint_refused(folder, *needles) -> str:
  with pytest.raises(HFCheckpointError) as e:
    Checkpoint(folder)
  message = str(e.value)
  assert "\n" not in message, message
  for needle in needles:
    assert needle in message, message
  return message


def test_every_damaged_index_is_refused_in_one_line(tmp_path):
  _sharded(tmp_path, '{"a": "s1.safetensors", "b": "s2.safetensors"}')
  assert Checkpoint(tmp_path).names() == {"a", "b"}
  _sharded(tmp_path, '{"a": "s1.safetensors", "b": "s2.safetensors", "a": "s2.safetensors"}')
  _checkpoint_refused(tmp_path, INDEX_NAME, "tensor a is listed twice")
  _sharded(tmp_path, '{"a": "s1.safetensors", "b": "s1.safetensors"}')
  _checkpoint_refused(tmp_path, "s1.safetensors", "tensor b", "is not in the file")
  _sharded(tmp_path, '{"a": "s1.safetensors", "b": "s3.safetensors"}')
  _checkpoint_refused(tmp_path, "s3.safetensors", "missing")
  _sharded(tmp_path, '["a"]')
  _checkpoint_refused(tmp_path, INDEX_NAME, "not a safetensors index")
  (tmp_path / INDEX_NAME).write_text("{")
  _checkpoint_refused(tmp_path, INDEX_NAME, "not a safetensors index")
  _sharded(tmp_path, '{"a": "s1.safetensors", "b": "s2.safetensors"}')
  (tmp_path / "s2.safetensors").write_bytes(b"\0" * 4)
  _checkpoint_refused(tmp_path, "s2.safetensors", "truncated")


def test_what_cannot_be_written(tmp_path):
  with pytest.raises(HFCheckpointError, match="tensor w: dtype int32 cannot be written"):
    write_file(tmp_path / "x.safetensors", {"w": np.zeros(2, np.int32)})
  assert not (tmp_path / "x.safetensors").exists()
  with pytest.raises(OSError) as e:   # the CLI's one-line boundary catches OSError
    write_file(tmp_path / "absent" / "x.safetensors", {"w": np.zeros(2, np.float32)})
  assert "\n" not in str(e.value) and "absent" in str(e.value)
