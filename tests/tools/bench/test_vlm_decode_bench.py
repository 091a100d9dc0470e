"""experiments.tools.bench.vlm_decode: the wide shape's config, the base/PVM pair and a tiny run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.tools.bench import vlm_decode as bench_decode
from pvm_jax.module import param_count

# The wide code path at tiny numbers (float32 so that equalities are exact). The
# widths are those of test_vlm_model.py, so a suite run compiles the eager
# parameter inits once for both files.
TINY_WIDE = dict(d_model=32, n_layers=3, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
                 max_len=64, dtype="float32", image=16, patch=8, vit_dim=16, vit_layers=1,
                 vit_heads=2, vit_ffn=32, latent_dim=32, pvm_head_dim=16, branch_layers=(0, 2))


def test_wide_config_is_the_realistic_shape():
  c = bench_decode.wide_config()
  lm = c.lm
  assert (lm.d_model, lm.n_layers, lm.n_heads, lm.n_kv_heads, lm.head_dim, lm.ffn_dim) == (
      1024, 24, 16, 8, 64, 3072)
  assert lm.dtype == jnp.bfloat16 and lm.param_dtype == jnp.bfloat16
  assert c.n_visual == 256
  assert c.branch == "pvm" and c.branch_layers == (7, 15, 23)
  p = c.pvm
  assert (p.latent_dim, p.head_dim, p.q_heads, p.kv_heads, p.ffn_dim) == (512, 128, 4, 2, 1536)
  assert p.dtype == jnp.bfloat16


def test_parse_overrides_types_and_errors():
  got = bench_decode.parse_overrides(["n_layers=6", "branch_layers=1.3,5", "dtype=float32"])
  assert got == {"n_layers": 6, "branch_layers": (1, 3, 5), "dtype": "float32"}
  c = bench_decode.wide_config(**{**TINY_WIDE, **got})
  assert c.lm.n_layers == 6 and c.branch_layers == (1, 3, 5)
  with pytest.raises(ValueError, match="KEY=VALUE"):
    bench_decode.parse_overrides(["layers=3"])
  with pytest.raises(ValueError, match="unknown fields"):
    bench_decode.wide_config(layers=3)
  with pytest.raises(SystemExit):
    bench_decode.parse_args(["--shape", "wide", "--args", "l3"])


@nnx.jit
def _forward(model, images, tokens):
  return model(images, tokens)


def test_base_and_pvm_share_the_backbone():
  cfg = bench_decode.wide_config(**TINY_WIDE)
  base, pvm = bench_decode.build_models(cfg)
  assert [i for i in range(3) if pvm.branch(i) is not None] == [0, 2]
  assert all(base.branch(i) is None for i in range(3)) and base.config.branch == "none"
  got = dict(nnx.to_flat_state(nnx.state(base, nnx.Param)))
  want = dict(nnx.to_flat_state(nnx.state(pvm, nnx.Param)))
  # The PVM model = the base model's parameters + the branches at lm/blocks/<i>/ffn_branch.
  assert sorted(set(want) - set(got)) == sorted(p for p in want if "ffn_branch" in p)
  for path, g in got.items():
    np.testing.assert_array_equal(g.get_value(), want[path].get_value(), err_msg=str(path))
  for layer in cfg.branch_layers:
    assert float(pvm.branch(layer).gate[...]) == bench_decode.GATE

  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.integers(0, 256, (2, 16, 16, 3)), jnp.uint8)
  tokens = jnp.asarray(rng.integers(1, 256, (2, 5)), jnp.int32)
  logits_base, logits_pvm = base(images, tokens), pvm(images, tokens)
  Nv = cfg.n_visual
  # The branch writes only to text tokens: image positions agree, text ones do not.
  np.testing.assert_allclose(logits_pvm[:, :Nv], logits_base[:, :Nv], rtol=1e-6, atol=1e-6)
  assert float(jnp.max(jnp.abs(logits_pvm[:, Nv:] - logits_base[:, Nv:]))) > 1e-3
  for layer in cfg.branch_layers:  # gate 0: exactly the base model
    pvm.branch(layer).gate[...] = jnp.zeros((), jnp.float32)
  np.testing.assert_allclose(pvm(images, tokens), logits_base, rtol=1e-6, atol=1e-6)


def test_summarize_by_hand():
  # prefill 10 ms; 4 tokens: base 10 + 4·2 = 18 ms, PVM 10 + 4·2.5 = 20 ms (best of two)
  times = {"base": {"prefill": [0.010, 0.012], "generate": [0.018, 0.030]},
           "pvm": {"prefill": [0.010, 0.012], "generate": [0.020, 0.032]}}
  s = bench_decode.summarize(times, batch=2, new_tokens=4)
  assert s["base"]["best"]["decode_ms_per_token"] == pytest.approx(2.0)
  assert s["pvm"]["best"]["decode_ms_per_token"] == pytest.approx(2.5)
  assert s["decode_overhead_best"] == pytest.approx({"ms_per_token": 0.5, "relative": 0.25})
  assert s["pvm"]["median"]["prefill_ms"] == pytest.approx(11.0)
  assert s["base"]["new_tokens_per_s"] == pytest.approx(8 / 0.018)
  assert s["target_met"] is False
  times["pvm"]["generate"] = [0.01815, 0.030]   # +1.9% per token: within +2%
  assert bench_decode.summarize(times, batch=2, new_tokens=4)["target_met"] is True
  times["pvm"]["generate"] = [0.0182, 0.030]    # +2.5%: over it (within the old +3%)
  assert bench_decode.summarize(times, batch=2, new_tokens=4)["target_met"] is False
  times["base"]["generate"] = [0.009, 0.010]  # generate faster than prefill: no ratio
  s = bench_decode.summarize(times, batch=2, new_tokens=4)
  assert s["decode_overhead_best"]["relative"] is None and s["target_met"] is None
  counts = {"branch": 1, "decoder_layer": 2, "branch_to_layer": 0.5, "branches": 1, "lm": 3}
  assert "UNRESOLVED" in bench_decode.report(s, counts, batch=2, new_tokens=4)


@pytest.mark.slow
def test_main_wide_at_tiny_numbers(tmp_path, capsys):
  sets = [f"--set={k}={'.'.join(map(str, v)) if isinstance(v, tuple) else v}"
          for k, v in TINY_WIDE.items()]
  out = tmp_path / "decode.json"
  result = bench_decode.main(["--shape", "wide", *sets, "--new-tokens", "3", "--batch", "2",
                              "--prompt", "4", "--repeats", "2", "--json", str(out)])
  printed = capsys.readouterr().out
  assert "PVM decode overhead" in printed and "one decoder layer" in printed
  saved = json.loads(out.read_text())
  assert saved["config"]["branch_layers"] == [0, 2]
  assert saved["config"]["lm"]["n_layers"] == 3
  cfg = bench_decode.wide_config(**TINY_WIDE)
  counts = saved["params"]
  assert counts["branch"] == param_count(cfg.pvm)["total"]
  # one block: 2 norms + q, kv, o + SwiGLU
  lm = cfg.lm
  d, hq, hkv, dh, f = lm.d_model, lm.n_heads, lm.n_kv_heads, lm.head_dim, lm.ffn_dim
  assert counts["decoder_layer"] == 2 * d + d * hq * dh + d * 2 * hkv * dh + hq * dh * d + 3 * d * f
  assert counts["branches"] == 2
  assert counts["lm"] == 256 * d + d + 3 * counts["decoder_layer"]   # tied embedding, final norm
  for name in ("base", "pvm"):
    assert [len(v) for v in saved["times_s"][name].values()] == [2, 2]
    s = saved["summary"][name]["best"]
    t = saved["times_s"][name]
    assert s["prefill_ms"] == pytest.approx(1e3 * min(t["prefill"]), rel=1e-9)
    assert s["call_ms"] == pytest.approx(1e3 * min(t["generate"]), rel=1e-9)
    assert s["decode_ms_per_token"] == pytest.approx(
        (s["call_ms"] - s["prefill_ms"]) / 3, rel=1e-9)
  overhead = saved["summary"]["decode_overhead_best"]
  base_tok = saved["summary"]["base"]["best"]["decode_ms_per_token"]
  pvm_tok = saved["summary"]["pvm"]["best"]["decode_ms_per_token"]
  assert overhead["ms_per_token"] == pytest.approx(pvm_tok - base_tok)
  if base_tok > 0:  # 3 tokens on a busy CPU may not resolve the decode time
    assert overhead["relative"] == pytest.approx(overhead["ms_per_token"] / base_tok)
    assert result["summary"]["target_met"] == (overhead["relative"] <= 0.02)
  else:
    assert overhead["relative"] is None and result["summary"]["target_met"] is None
  assert jax.tree.leaves(result["times_s"]) == jax.tree.leaves(saved["times_s"])
