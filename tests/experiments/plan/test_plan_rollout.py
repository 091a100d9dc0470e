"""`lngram-exp plan --program=rollout`: Stage II's sampling compiled as one program.

The smoke GRPO config (a tiny random Qwen3-VL + PVM) on two H100s (XLA:GPU) and on a
v5e:2x2 topology (the TPU compiler, through the command): the prefill and the decode
loop are in the program, the cache is the formula's, the text has the peak / FITS and
the decode-time lines; a non-GRPO config or an unknown program is one line. The smoke
image is 192 x 192 (36 visual tokens, a 102-token prompt): the Triton flash attention
takes the padded length 128 (the default 128 x 128 image gives 82, padded to 96, which
its power-of-2 tiles refuse).
"""

import math
import re

import pytest
from cli_runner import refusal, run_cli
from lowering import tpu_devices

from experiments.configs import load_config
from experiments.plan import gpu
from experiments.plan.rollout import format_rollout, plan_rollout

CONFIGS = "experiments/configs"
GRPO = f"{CONFIGS}/qwen3vl_pvm_grpo.py:smoke"
IMAGE = "--config.qwen3vl.data.image_size=(192, 192)"


def test_the_rollout_compiles_for_gpus_and_holds_its_cache():
  if not gpu.compiler_available():
    pytest.skip(f"needs the GPU compiler ({gpu.EXTRA})")
  config = load_config(GRPO)
  config.qwen3vl.data.update(image_size=(192, 192))
  r = plan_rollout(config, {"data": 2}, target="h100:2")
  g = r["geometry"]
  from experiments.jobs.qwen3vl.planning import qwen3vl_model
  t = qwen3vl_model(config).text
  rows, slots, N = g["rows"], g["cache_len"], g["new_tokens"]
  assert (rows, N, slots) == (2, 4, 36 + 2 + 64 + 4)
  itemsize = 4   # the smoke model is float32
  assert g["cache"]["kv"] == t.n_layers * 2 * rows * slots * t.n_kv_heads * t.head_dim * itemsize
  assert r["cache_device"] == pytest.approx(sum(g["cache"].values()) / 2)
  assert r["hlo"].count(" while(") >= 1 and r["verdict"]["fits"]
  assert g["weights_device"] == g["weights"]   # data=2: every GPU holds every weight
  assert r["decode_step"]["bytes"] == (g["weights"] + r["cache_device"]
                                       + r["collectives_step"]["all-gather"])
  assert r["decode_s"] == pytest.approx(N * r["decode_step"]["step_s"])
  out = format_rollout(r, "smoke")
  assert re.search(r"^peak memory .* per GPU \[XLA:GPU h100\] .*FITS", out, re.M)
  assert re.search(r"^decode step .*memory-bound: reads", out, re.M)
  assert math.isfinite(r["rollout_s"]) and r["rollout_s"] > 0


def test_plan_rollout_command_for_a_tpu_topology():
  tpu_devices("v5e:2x2")   # skips without libtpu
  done = run_cli("plan", f"--config={GRPO}", "--mesh=data=4", "--target=v5e:2x2",
                 "--program=rollout", IMAGE, "--config.qwen3vl.grpo.prompts_per_step=2",
                 timeout=600)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("plan of the rollout of")
  assert re.search(r"^peak memory .* per chip \[XLA:TPU v5e:2x2\] .*FITS", done.stdout, re.M)
  assert re.search(r"^rollout time .*new tokens/s on 4 × TPU v5e", done.stdout, re.M)


@pytest.mark.parametrize("args, message", [
    ([f"--config={CONFIGS}/qwen3vl_pvm_sft.py:smoke", "--program=rollout"],
     "--program=rollout plans Stage II's sampling"),
    ([f"--config={GRPO}", "--program=decode"], "--program='decode' is not one of"),
])
def test_bad_programs_are_one_line(args, message):
  assert message in refusal("plan", *args, "--mesh=data=2")
