"""The Table 12 efficiency benchmark: its JSON, its row parsing, and that it times the real decode.

The smoke run is the whole benchmark at tiny shapes (two rows, two prefill
lengths, one round); the equivalence test checks that the timed functions of
the scanned model (cached prefill and greedy decode) are the uncached forward
and the unrolled DecoderLM's, so the timed path computes what the model
computes. The scan option itself: tests/experiments/models/test_lm_scan.py.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.models.lm import layer_spans
from experiments.tools.bench import lm_efficiency as bench
from experiments.tools.bench import scan_lm


@pytest.fixture(scope="module")
def smoke_result(tmp_path_factory):
  path = tmp_path_factory.mktemp("lm_eff") / "lm_efficiency.json"
  logs = []
  # One memory layer here (compile time); the equivalence test below keeps the two.
  bench.main(["--smoke", "--configs", "baseline,r64/m4/KV8", "--lengths", "32",
              "--repeats", "1", "--memory-layers", "1", "--json", str(path)], log=logs.append)
  with open(path) as f:
    return json.load(f), "\n".join(logs)


def test_smoke_json_has_every_field_and_sane_numbers(smoke_result):
  data, log = smoke_result
  for key in ("smoke", "impl", "backbone", "lengths", "decode_batches", "new_tokens", "repeats",
              "target", "platform", "memory_source", "paper", "rows", "summary",
              "layer_decode"):
    assert key in data, key
  assert data["lengths"] == [32] and data["decode_batches"] == [1, 8]
  assert set(data["rows"]) == {"baseline", "r64/m4/KV8"}
  assert set(data["paper"]) == set(bench.CONFIGS)
  for name, row in data["rows"].items():
    assert "error" not in row, row.get("error")
    assert row["skipped"] == [], name
    assert row["params"] > 0 and row["param_bytes"] > 0
    assert (row["memory_params"] > 0) == (name != "baseline")
    for T in ("32",):
      p = row["prefill"][T]
      assert 0 < p["best_ms"] <= p["median_ms"] and p["compile_s"] > 0
      assert len(p["times_s"]) == 1 and p["memory_gib"] > 0
    for B in ("1", "8"):
      d = row["decode"][B]
      assert 0 < d["best_ms_per_token"] <= d["median_ms_per_token"]
      assert d["memory_gib"] > 0
    assert row["decode"]["1"]["weights_gbps"] > 0
  # Overheads are computed from the measured times, not assumed.
  base, lng = data["rows"]["baseline"], data["rows"]["r64/m4/KV8"]
  s = data["summary"]["r64/m4/KV8"]
  assert s["prefill_32_best"] == pytest.approx(
      lng["prefill"]["32"]["best_ms"] / base["prefill"]["32"]["best_ms"] - 1)
  assert s["decode_b8_median"] == pytest.approx(
      lng["decode"]["8"]["median_ms_per_token"] / base["decode"]["8"]["median_ms_per_token"] - 1)
  assert s["verdict"] == {k: s[f"{k}_best"] <= bench.TARGET
                          for k in ("prefill_32", "decode_b1", "decode_b8")}
  assert s["target_met"] == all(s["verdict"].values())
  assert s["paper_prefill_1024"] == pytest.approx(60.49 / 56.99 - 1)
  assert s["paper_decode"] == pytest.approx(52.14 / 48.26 - 1)
  # The Lngram row really holds a (smoke-sized) memory at the two memory layers.
  assert lng["memory_layers"] == [1] and lng["lngram"]["kv_heads"] == 8
  assert data["backbone"]["memory_layers"] == [1]
  ld = data["layer_decode"]
  assert ld["prefill_len"] == 32 and set(ld["batches"]) == {"1", "8"}
  for r in ld["batches"].values():
    assert r["best_ms_per_token"] > 0 and r["target_met"] == (
        r["best_ms_per_token"] <= bench.LAYER_TARGET_MS)
  assert "| r64/m4/KV8 |" in log and "Layer decode" in log


def test_row_names_use_the_lm_lngram_parser_over_the_paper_defaults():
  c = scan_lm.lngram_config("r23/m4/KV8/mem256", 2048)
  assert (c.routes, c.bits, c.kv_heads, c.mem_dim, c.head_dim, c.q_heads) == (
      23, 4, 8, 256, 256, 16)
  c = scan_lm.lngram_config("r16/m5/KV2", 2048)
  assert (c.routes, c.bits, c.kv_heads, c.mem_dim, c.head_dim) == (16, 5, 2, 128, 128)
  # The paper's Table 3 parameter count of r64/m4/KV8 (two layers): 90.203M.
  c = scan_lm.lngram_config("r64/m4/KV8", 2048)
  tables = c.routes * sum(2 ** (c.bits * n) for n in c.orders) * c.mem_dim
  assert 2 * tables == pytest.approx(2 * 64 * (256 + 4096) * 128)
  with pytest.raises(ValueError, match="unknown config arg"):
    scan_lm.lngram_config("r16/q4", 2048)
  # The paper-shape model compiles five block bodies: 3 dense scans, 2 memory blocks.
  assert layer_spans(scan_lm.lm_config("r64/m4/KV8"), scan=True) == (
      (0, 1), (1, 2), (2, 13), (13, 14), (14, 28))


def test_unknown_row_is_refused():
  with pytest.raises(SystemExit):
    bench.parse_args(["--configs", "r64/m4/KV9"])


def test_cached_decode_is_the_uncached_forward_and_scan_is_the_decoder():
  cfg = scan_lm.lm_config("r64/m4/KV8", smoke=True, max_len=32, overrides={
      "dtype": "float32", "n_layers": 7, "memory_layers": (1, 5)})
  scanned, unrolled = (scan_lm.build_lm(cfg, scan=scan) for scan in (True, False))
  assert scanned.layer_spans == ((0, 1), (1, 2), (2, 5), (5, 6), (6, 7))
  T, N = 10, 5
  prompt = jnp.asarray(np.random.default_rng(0).integers(1, 256, (2, T)), jnp.int32)
  outputs = {}
  for name, lm in (("scan", scanned), ("loop", unrolled)):
    model = scan_lm.PureLM(lm)
    params = model.params
    last_BxV, cache = jax.jit(model.prefill, static_argnums=2)(params, prompt, T + N)
    first_B = jnp.argmax(last_BxV, axis=-1).astype(jnp.int32)
    tokens_BxN, logits_NxBxV, _ = jax.jit(model.decode, static_argnums=3)(
        params, cache, first_B, N)
    # The uncached forward over prompt + the fed tokens: the logits at position
    # T-1+i are those of decode step i's input; greedy picks the same tokens.
    fed_BxN = jnp.concatenate([first_B[:, None], tokens_BxN[:, :-1]], axis=1)
    full_BxSxV = jax.jit(model.forward)(params, jnp.concatenate([prompt, fed_BxN], axis=1))
    np.testing.assert_allclose(last_BxV, full_BxSxV[:, T - 1], atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(jnp.swapaxes(logits_NxBxV, 0, 1), full_BxSxV[:, T:],
                               atol=2e-4, rtol=2e-4)
    np.testing.assert_array_equal(tokens_BxN, jnp.argmax(full_BxSxV[:, T:], axis=-1))
    outputs[name] = (tokens_BxN, logits_NxBxV, full_BxSxV)
  # The Lngram branches are there and add a nonzero delta (W_O drawn nonzero).
  assert cfg.memory_layers == (1, 5)
  assert all(bool(jnp.any(unrolled.blocks[i].memory.w_o[...] != 0)) for i in cfg.memory_layers)
  # The scanned model's timed functions compute the unrolled DecoderLM's numbers.
  np.testing.assert_array_equal(outputs["scan"][0], outputs["loop"][0])
  for got, want in zip(outputs["scan"][1:], outputs["loop"][1:], strict=True):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
