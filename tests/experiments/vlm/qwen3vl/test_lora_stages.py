"""LoRA-SFT and LoRA-SFT+GRPO on the `smoke` Qwen3-VL through the CLI (the PVM paper's LoRA rows).

Stage I: a 2-step run and one stopped after step 1 (SIGTERM) and resumed by the same
command agree bit for bit; only the decoder's LoRA factors moved (every other
parameter is the initial model's, bit for bit) and the optimiser holds moments for the
factors alone. Stage II starts from it, stops, resumes, and again trains the factors
alone. The plan line counts the factors.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from test_stages import _params, _stopped_then_resumed, _train

from experiments.configs import load_config

SFT = "experiments/configs/qwen3vl_lora_sft.py:smoke"
GRPO = "experiments/configs/qwen3vl_lora_grpo.py:smoke"


def _factor(key: str) -> bool:
  return key.endswith(("_lora_a", "_lora_b"))


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
  """The runs' directory, both runs' parameters and the reference run restored (once)."""
  from experiments.jobs.restore import restore
  root = tmp_path_factory.mktemp("qwen3vl_lora")
  assert _train(SFT, root / "a") == 0
  _stopped_then_resumed(SFT, root / "b")
  model, config = restore(root / "a")
  return {"root": root, "a": _params(root / "a"), "b": _params(root / "b"), "model": model,
          "config": config}


def test_lora_sft_resumes_bit_exactly_and_trains_only_the_factors(stage1):
  a, b = stage1["a"], stage1["b"]
  assert set(a) == set(b)
  for key in a:
    assert a[key].tobytes() == b[key].tobytes(), key
  from experiments.jobs.init_from import flat_params
  from experiments.vlm.qwen3vl.model import Qwen3VL
  model, config = stage1["model"], stage1["config"]
  assert model.config.text.ffn_branch_layers == () and model.config.text.lora.rank == 8
  init = {k: np.asarray(v) for k, v in flat_params(nnx.state(
      Qwen3VL(model.config, rngs=nnx.Rngs(config.train.seed)), nnx.Param)).items()}
  factors = [k for k in a if _factor(k)]
  assert factors and all(k.startswith("lm/blocks/") and "/attn/w_" in k for k in factors)
  for key in a:
    if not _factor(key):
      assert a[key].tobytes() == init[key].tobytes(), key
  assert any(np.any(a[k]) for k in factors if k.endswith("_lora_b"))   # B left 0: trains


def test_the_optimiser_holds_moments_for_the_factors_alone(stage1):
  from experiments.jobs.vlm.loss import trainable_mask
  from experiments.trainer import optimizer as optim_lib
  params = nnx.to_pure_dict(nnx.state(stage1["model"], nnx.Param))
  tx = optim_lib.make_optimizer(stage1["config"].optim, params, 2,
                                trainable=trainable_mask("lora"))
  moments = sum(int(x.size) for x in jax.tree.leaves(jax.eval_shape(tx.init, params))
                if len(x.shape) > 0)
  factors = sum(v.size for k, v in stage1["a"].items() if _factor(k))
  assert moments == 2 * factors   # Adam's mu and nu of the factors, nothing else


def test_lora_grpo_from_lora_sft_resumes_and_trains_only_the_factors(stage1, tmp_path):
  _stopped_then_resumed(GRPO, tmp_path / "b", init_from=stage1["root"] / "a")
  start, b = stage1["a"], _params(tmp_path / "b")
  moved = [k for k in b if b[k].tobytes() != start[k].tobytes()]
  assert all(_factor(k) for k in moved)


def test_plan_line_counts_the_factors():
  from experiments.jobs.qwen3vl.task import plan_line
  config = load_config(SFT)
  config.qwen3vl.lora.rank = 512   # large enough to show in the line's MB figures
  line = plan_line(config, 8)
  assert "M in LoRA factors" in line and " 0.00M in LoRA" not in line
