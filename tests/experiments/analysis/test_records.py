"""Position records: sampling, nuisance / surface features, the model reads, npz round trip."""

import types

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.analysis import records as records_lib
from experiments.analysis.targets import LOCAL_CONCEPTS, extract_targets
from experiments.models import DecoderLM, LMConfig, liven_lngram
from experiments.models.branches import BranchContext
from lngram_jax.config import LngramConfig

LNGRAM = LngramConfig(d_model=32, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=4,
                      kv_heads=2, head_dim=8)
# Memory at layer 0 too: its input is the embedding, not a block output.
CONFIG = LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
                  max_len=32, memory_layers=(0, 1), memory=LNGRAM)
SEQ_LEN = 16
FILES = [
    ("pkg/a.py", b'"""A."""\nimport os\nimport json\n\n\ndef f(x):\n  return os.sep + x\n'),
    ("pkg/broken.py", b"def f(:\n"),
    ("pkg/b.py", b"import os\nclass C:\n  pass\n"),
    ("pkg/c.py", b"import sys, os\n# c\nprint(sys.argv)\n"),
]


def _model(seed=0):
  model = DecoderLM(CONFIG, rngs=nnx.Rngs(seed))
  return liven_lngram(model, key=7 + seed, w_o_std=0.3, conv_std=0.3)


@nnx.jit
def _direct(model, tokens_BxT):
  """Layer inputs, router logits and aux of whole windows, straight from the model."""
  _, aux = model(tokens_BxT, return_aux=True, context=BranchContext(probe=True))
  hidden = {0: model.embed(tokens_BxT), 1: aux["block/0/hidden"]}
  z = {i: model.blocks[i].memory.router_logits(hidden[i]) for i in (0, 1)}
  return hidden, z, {k: v for k, v in aux.items() if k.endswith("/codes")}


@pytest.fixture(scope="module", name="reference")
def reference_fixture():
  return records_lib.collect_records(_model(), FILES, split="reference", seq_len=SEQ_LEN,
                                     max_positions=60, seed=3, progress=False, batch_size=4)


def test_sample_positions_are_seeded_sorted_and_in_range():
  sizes = [5, 0, 7, 3]
  f1, o1 = records_lib.sample_positions(sizes, 8, seed=1)
  f2, o2 = records_lib.sample_positions(sizes, 8, seed=1)
  np.testing.assert_array_equal(f1, f2)
  np.testing.assert_array_equal(o1, o2)
  assert f1.size == 8 and np.all(np.diff(f1 * 100 + o1) > 0)  # distinct, sorted
  assert np.all(o1 < np.asarray(sizes)[f1]) and not np.any(f1 == 1)
  f_all, o_all = records_lib.sample_positions(sizes, None, seed=0)
  assert f_all.tolist() == [0] * 5 + [2] * 7 + [3] * 3
  assert o_all.tolist() == list(range(5)) + list(range(7)) + list(range(3))


def test_position_features_by_hand():
  doc = np.frombuffer(b"ab\n    cd\n\nx", np.uint8)
  offsets = np.array([0, 1, 2, 7, 8, 10, 11], np.int32)
  nuisance, surface = records_lib.position_features([doc], np.zeros(7, np.int32), offsets,
                                                    seq_len=8)
  column = [0, 1, 2, 4, 5, 0, 0]
  line = [0, 0, 0, 1, 1, 2, 3]
  row = [0, 1, 2, 7, 0, 2, 3]
  np.testing.assert_array_equal(nuisance, records_lib.nuisance_strata(column, line, row))
  np.testing.assert_array_equal(surface[:, 0], [ord(c) for c in "ab\ncd\nx"])
  np.testing.assert_array_equal(surface[:, 1], [-1, ord("a"), ord("b"), ord(" "), ord("c"),
                                                ord("\n"), ord("\n")])
  # Buckets: column 4-7 is bucket 2, line 10-99 bucket 1, row 8-31 bucket 1.
  assert records_lib.nuisance_strata([5], [10], [8])[0] == (2 * 4 + 1) * 5 + 1
  assert records_lib.nuisance_strata([10**6], [10**6], [10**6])[0] == records_lib.N_STRATA - 1


def test_split_files_reference_is_a_seeded_training_sample():
  docs = tuple(np.frombuffer(f"x = {i}\n".encode(), np.uint8) for i in range(10))
  corpus = types.SimpleNamespace(train_paths=tuple(f"t{i}.py" for i in range(8)),
                                 train_docs=docs[:8], val_paths=("v0.py", "v1.py"),
                                 val_docs=docs[8:])
  ref, held = records_lib.split_files(corpus, n_reference=3, seed=5)
  assert [f.path for f in held] == ["v0.py", "v1.py"] and held[1].data == b"x = 9\n"
  assert len(ref) == 3 and all(f.path.startswith("t") for f in ref)
  assert ref == records_lib.split_files(corpus, n_reference=3, seed=5)[0]
  assert [f.path for f in ref] == sorted(f.path for f in ref)


def test_records_match_a_direct_forward_of_each_window(reference):
  rec = reference
  assert rec.skipped_files == 1 and rec.files == ["pkg/a.py", "pkg/b.py", "pkg/c.py"]
  assert rec.layers == (0, 1) and rec.bits == 2 and rec.num_positions == 60
  model = _model()
  docs = {path: np.frombuffer(data, np.uint8) for path, data in FILES}
  windows = [(f, o // SEQ_LEN) for f, o in zip(rec.file_ids, rec.offsets, strict=True)]
  unique = sorted(set(windows))
  tokens = np.zeros((len(unique), SEQ_LEN), np.int32)
  for row, (f, w) in enumerate(unique):
    piece = docs[rec.files[f]][w * SEQ_LEN:(w + 1) * SEQ_LEN]
    tokens[row, :piece.size] = piece
  hidden, z_by_layer, aux = _direct(model, jnp.asarray(tokens))
  rows = np.array([unique.index(w) for w in windows])
  cols = rec.offsets % SEQ_LEN
  for layer in (0, 1):
    h = np.asarray(hidden[layer])[rows, cols]
    z = np.asarray(z_by_layer[layer])[rows, cols]
    np.testing.assert_allclose(rec.h[layer], h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rec.z[layer], z.reshape(len(rows), -1), rtol=1e-4, atol=1e-5)
    # Codes are the z > 0 bits, little-endian, per route.
    bits_PxRxM = (rec.z[layer].reshape(len(rows), LNGRAM.routes, LNGRAM.bits) > 0)
    np.testing.assert_array_equal(rec.codes[layer], (bits_PxRxM * [1, 2]).sum(-1))
    np.testing.assert_array_equal(rec.codes[layer],
                                  np.asarray(aux[f"memory/{layer}/codes"])[rows, cols])
  # Layer 0's input is exactly the embedding of the current byte.
  table = np.asarray(model.embed.table[...])
  np.testing.assert_allclose(rec.h[0], table[rec.surface[:, 0]], rtol=1e-6)


def test_targets_and_surface_follow_the_files(reference):
  rec = reference
  docs = [np.frombuffer(dict(FILES)[path], np.uint8) for path in rec.files]
  names, local = rec.targets["local"]
  assert names == list(LOCAL_CONCEPTS)
  for p in range(rec.num_positions):
    f, o = rec.file_ids[p], rec.offsets[p]
    assert rec.surface[p, 0] == docs[f][o]
    want = extract_targets(docs[f].tobytes()).local[o]
    assert local[p].tolist() == [i == want for i in range(len(names))]
  # Document concepts: modules by the number of files importing them, ties by name.
  doc_names, doc = rec.targets["document"]
  assert doc_names == ["os", "json", "sys"]
  np.testing.assert_array_equal(doc[:, 0], True)
  np.testing.assert_array_equal(doc[:, 2], rec.file_ids == 2)


def test_heldout_shares_reference_names_and_positions_do_not_depend_on_the_model(reference):
  held_files = [("h.py", b"import json\nimport re\nx = 1\n")]
  kwargs = dict(split="heldout", seq_len=SEQ_LEN, max_positions=10, seed=0, progress=False,
                concept_names=reference.concept_names())
  held = records_lib.collect_records(_model(), held_files, **kwargs)
  other = records_lib.collect_records(_model(seed=1), held_files, **kwargs)
  assert held.concept_names() == reference.concept_names()
  assert held.targets["document"][1][:, 1].all() and not held.targets["document"][1][:, 0].any()
  np.testing.assert_array_equal(held.offsets, other.offsets)
  np.testing.assert_array_equal(held.nuisance, other.nuisance)
  assert not np.allclose(held.h[1], other.h[1])
  with pytest.raises(ValueError, match="split"):
    records_lib.collect_records(_model(), held_files, **{**kwargs, "split": "test"})


def test_save_load_round_trip(reference, tmp_path):
  path = records_lib.save_records(reference, tmp_path / "rec" / "reference.npz")
  back = records_lib.load_records(path)
  assert (back.split, back.files, back.layers, back.bits, back.skipped_files, back.meta) == (
      reference.split, reference.files, reference.layers, reference.bits,
      reference.skipped_files, reference.meta)
  for name in ("file_ids", "nuisance", "surface", "offsets"):
    np.testing.assert_array_equal(getattr(back, name), getattr(reference, name))
  for layer in reference.layers:
    for name in ("h", "z", "codes"):
      np.testing.assert_array_equal(getattr(back, name)[layer], getattr(reference, name)[layer])
  assert back.concept_names() == reference.concept_names()
  for level, (_, labels) in reference.targets.items():
    np.testing.assert_array_equal(back.targets[level][1], labels)
  sub = records_lib.take(back, np.arange(5))
  assert sub.num_positions == 5 and sub.codes[1].shape == (5, LNGRAM.routes)


def test_a_failed_save_keeps_the_old_records(reference, tmp_path, monkeypatch):
  # The cache is replaced atomically: a write that dies midway leaves the old file whole.
  path = records_lib.save_records(reference, tmp_path / "records_reference.npz")
  old = path.read_bytes()

  def dies_midway(f, **arrays):
    f.write(b"PK\x03\x04 a few bytes of a zip")
    raise OSError("disk full")

  monkeypatch.setattr(records_lib.np, "savez", dies_midway)
  with pytest.raises(OSError, match="disk full"):
    records_lib.save_records(reference, path)
  assert path.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == [path.name]
  monkeypatch.undo()
  assert records_lib.load_records(path).split == reference.split


def _token_doc(path, pieces, ids):
  lengths = np.array([len(p) for p in pieces], np.int64)
  ends = np.cumsum(lengths)
  return records_lib.TokenDoc(path, np.asarray(ids, np.int32), b"".join(pieces),
                              ends - lengths, ends)


def test_token_documents_of_byte_ids_are_read_as_the_byte_files(reference):
  """Token data prepared with "bytes" (a token is its byte) gives the byte run's records."""
  docs = [_token_doc(path, [bytes([b]) for b in data], list(data)) for path, data in FILES]
  tokens = records_lib.collect_records(_model(), docs, split="reference", seq_len=SEQ_LEN,
                                       max_positions=60, seed=3, progress=False, batch_size=4)
  assert reference.meta["unit"] == "byte" and tokens.meta["unit"] == "token"
  assert (tokens.files, tokens.skipped_files) == (reference.files, reference.skipped_files)
  for name in ("file_ids", "offsets", "nuisance", "surface"):
    np.testing.assert_array_equal(getattr(tokens, name), getattr(reference, name))
  assert tokens.concept_names() == reference.concept_names()
  for level, (_, labels) in reference.targets.items():
    np.testing.assert_array_equal(tokens.targets[level][1], labels)
  for layer in reference.layers:
    np.testing.assert_array_equal(tokens.codes[layer], reference.codes[layer])
    np.testing.assert_allclose(tokens.h[layer], reference.h[layer], rtol=1e-6, atol=1e-6)


def test_a_token_s_features_and_targets_come_from_its_bytes():
  """A token run's positions are tokens: the surface is token ids; column, line and the
  labels those of the token's bytes (its first byte, its first labelled byte)."""
  pieces = [b"import", b" os", b"\n\n", b"x", b" =", b" 10", b"\n"]
  ids = [40, 41, 42, 43, 44, 45, 42]
  rec = records_lib.collect_records(_model(), [_token_doc("t.py", pieces, ids)],
                                    split="heldout", seq_len=4, max_positions=None, seed=0,
                                    progress=False, batch_size=4)
  assert rec.offsets.tolist() == list(range(7)) and rec.meta["unit"] == "token"
  assert rec.surface[:, 0].tolist() == ids
  assert rec.surface[:, 1].tolist() == [-1] + ids[:-1]
  column = [0, 6, 9, 0, 1, 3, 6]   # of each token's first byte; "\n\n" ends line 0
  line = [0, 0, 0, 2, 2, 2, 2]
  np.testing.assert_array_equal(rec.nuisance, records_lib.nuisance_strata(
      column, line, np.arange(7) % 4))
  names, local = rec.targets["local"]
  assert [names[i] if row.any() else None for row, i in zip(local, local.argmax(1),
                                                             strict=True)] == [
      "import", "NAME", None, "NAME", "OP", "NUMBER", None]
  names, statement = rec.targets["statement"]
  assert [names[i] for i in statement.argmax(1)] == ["Import"] * 3 + ["Assign"] * 4
  assert rec.targets["document"][0] == ["os"] and rec.targets["document"][1].all()
  # Layer 0 reads the embedding of the current token id.
  np.testing.assert_allclose(rec.h[0], np.asarray(_model().embed.table[...])[ids], rtol=1e-6)
