"""The Lngram v2 paper's 0.6B MoE recipes (Table 4, App. D.3, App. A.5): what they state,
their parameter counts, their schedule, and a smoke run of each through the CLI that
resumes bit for bit."""

from __future__ import annotations

import math
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.configs import load_config
from experiments.models import DecoderLM
from experiments.models.config import lm_config
from experiments.models.counts import TABLE4_PAPER, lm_param_count, table4_comparison
from experiments.trainer.optimizer import learning_rate_schedule

FILES = ("moe06b_baseline.py", "moe06b_lngram_v1.py", "moe06b_lngram_v2.py")
VOCAB = 32768   # the commands' --config.model.vocab_size


def _load(name, arg=""):
  config = load_config(f"experiments/configs/{name}" + (f":{arg}" if arg else ""))
  if "smoke" not in arg:
    config.model.vocab_size = VOCAB
  return config


def test_what_the_paper_states():
  configs = {name: _load(name) for name in FILES}
  for name, c in configs.items():
    lm = lm_config(c)
    assert (lm.n_layers, lm.d_model, lm.n_heads, lm.n_kv_heads) == (24, 768, 12, 2), name
    assert lm.moe_layers == tuple(range(24))
    assert (lm.moe.n_experts, lm.moe.n_shared_experts, lm.moe.top_k) == (8, 1, 2)
    assert c.train.steps == 10000 and c.train.seed == 42 and c.data.seed == 42
    tokens = c.data.batch_size * c.data.seq_len * c.train.steps
    assert c.data.batch_size == 32 and abs(tokens / 1.31e9 - 1) < 0.01
    assert (c.optim.lr, c.optim.schedule_steps, c.optim.warmup_frac) == (3e-4, 61036, 0.01)
    # Every arm: the same backbone, data order, optimiser and seed.
    ref = configs["moe06b_baseline.py"]
    for block in ("data", "optim", "train", "mesh"):
      assert c[block].to_dict() == ref[block].to_dict(), (name, block)
    strip = lambda m: {k: v for k, v in m.to_dict().items()   # noqa: E731
                       if k not in ("memory", "memory_layers")}
    assert strip(c.model) == strip(ref.model)
  v1, v2 = (lm_config(configs[n]) for n in FILES[1:])
  assert v1.memory_layers == v2.memory_layers == (1, 11)   # layers 2 and 12, 1-based
  assert v1.memory.bits == v2.memory.bits == 4 and v1.memory.orders == v2.memory.orders == (2, 3)
  assert (v2.memory.routes, v2.memory.mem_dim, v2.memory.surrogate) == (16, 64, "onebit")
  assert lm_config(configs["moe06b_baseline.py"]).memory_layers == ()


def test_args():
  for arg, routes, surrogate in (("r64", 64, "onebit"), ("r192", 192, "onebit"),
                                 ("r16,ste", 16, "ste"), ("ste", 16, "ste")):
    m = lm_config(_load("moe06b_lngram_v2.py", arg)).memory
    assert (m.routes, m.surrogate) == (routes, surrogate), arg
  assert lm_config(_load("moe06b_lngram_v1.py", "exact")).memory.surrogate == "exact"
  smoke = lm_config(_load("moe06b_lngram_v2.py", "r64,ste,smoke"))
  assert smoke.d_model <= 64 and smoke.memory.routes == 64 and smoke.memory.surrogate == "ste"
  for name, arg in (("moe06b_lngram_v2.py", "r17"), ("moe06b_baseline.py", "r16"),
                    ("moe06b_lngram_v1.py", "r16")):
    with pytest.raises(ValueError, match=f"unknown config arg {arg!r}"):
      _load(name, arg)


def test_parameter_counts_and_table4():
  lms = {name: lm_config(_load(name)) for name in FILES}
  base = lm_param_count(lms["moe06b_baseline.py"])
  # The formula of experiments/models/counts.py, written out for the recipe.
  V, D, L, F = VOCAB, 768, 24, 1024
  per_layer = 2 * D + (D * 768 + 2 * D * 128 + 768 * D) + (D * 8 + 9 * 3 * D * F)
  assert base["total"] == 2 * V * D + D + L * per_layer == 593_154_816
  assert base["active"] == base["total"] - L * 6 * 3 * D * F == 253_416_192
  # The analytic count == what the model builds (shapes only); v2 holds every part but
  # v1's memory, whose count is its arm's own `param_count` (tested with the arm).
  v2 = lms["moe06b_lngram_v2.py"]
  abstract = nnx.eval_shape(lambda: DecoderLM(v2, rngs=nnx.Rngs(0)))
  built = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  assert lm_param_count(v2)["total"] == built
  t = table4_comparison(lms["moe06b_lngram_v1.py"], lms["moe06b_lngram_v2.py"])
  assert t["v1"] == (55_457_280, 15_367_680) and t["v2"] == (9_643_264, 734_464)
  for key in ("total", "active"):   # the paper's 82.6% / 95.2% to its printed digit
    assert round(t["reduction"][key], 3) == TABLE4_PAPER[key], key


def test_schedule_is_the_long_cosine_stopped_at_10000():
  optim = _load("moe06b_baseline.py").optim
  lr = learning_rate_schedule(optim, 10000)
  warmup, total, peak = 610, 61036, 3e-4   # 1% of 61,036
  assert float(lr(warmup)) == pytest.approx(peak)
  for step in (2000, 10000):
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
    want = peak * (0.1 + 0.9 * cosine)
    assert float(lr(step)) == pytest.approx(want, rel=1e-5), step
  assert float(lr(10000)) > 0.8 * peak   # far from the floor: the run stops early


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
  """Each recipe's smoke through the CLI (4 steps, checkpoints at 2 and 4), and the
  same run resumed from its step-2 checkpoint: {name: (full dir, resumed dir)}."""
  from experiments import cli

  out = {}
  for name in FILES:
    root = tmp_path_factory.mktemp(name.removesuffix(".py"))
    full, cut = root / "full", root / "cut"
    args = ["lngram-exp", "train", f"--config=experiments/configs/{name}:smoke",
            "--config.train.progress=false"]
    assert cli.run_main([*args, f"--workdir={full}"]) == 0, name
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "4")   # as if stopped after step 2
    assert cli.run_main([*args, f"--workdir={cut}"]) == 0, name
    out[name] = (full, cut)
  return out


@pytest.mark.parametrize("name", FILES)
def test_smoke_trains_and_resumes_bit_for_bit(smoke_runs, name):
  from experiments.jobs.restore import restore
  from experiments.trainer.checkpoint import run_checkpointer

  full, cut = smoke_runs[name]
  assert run_checkpointer(cut).all_steps() == [2, 4]   # step 4 trained again from step 2
  a, _ = restore(full)
  b, _ = restore(cut)
  assert a.config.moe_layers == (0, 1) and a.config.moe.n_shared_experts == 1
  assert a.config.memory_layers == (() if name == "moe06b_baseline.py" else (1,))
  pa = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(a, nnx.Param)))[0]
  pb = jax.tree.leaves(nnx.to_pure_dict(nnx.state(b, nnx.Param)))
  for (path, x), y in zip(pa, pb, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                  err_msg=jax.tree_util.keystr(path))
