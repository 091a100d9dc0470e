"""`lngram-exp plan --target=<TPU topology>`: the run's step compiled by the TPU compiler.

With libtpu installed (`pip install -e '.[tpu]'`, which the README's test command
does) a CPU machine compiles for TPU chips it does not have. Tiny models compile for
`v5e:2x2` in seconds: the Lngram `readout="pallas"` program holds the Mosaic kernel
(chosen by the compile's target, not by this CPU process), attention holds splash,
a frozen-backbone step reduces only the trained leaves' gradients, and the text has
the interface's lines. Without libtpu these tests skip; the refusals are checked
either way.
"""

import math
import re

import pytest
from cli_runner import refusal, run_cli
from lowering import KERNEL_CALL, tpu_devices

from experiments.configs import load_config
from experiments.plan import tpu
from experiments.plan.report import plan_run
from experiments.plan.text import format_plan

CONFIGS = "experiments/configs"


def _kernels(hlo: str) -> dict[str, int]:
  """Mosaic kernels of a compiled TPU program by name (sink_readout_fwd, splash_...)."""
  names = re.findall(r"%([A-Za-z_]+)[.\d]* = [^\n]*custom_call_target=\"tpu_custom_call\"", hlo)
  out: dict[str, int] = {}
  for name in names:
    out[name] = out.get(name, 0) + 1
  return out


@pytest.fixture(scope="module")
def lngram_plan():
  tpu_devices("v5e:2x2")   # skips without libtpu
  config = load_config(f"{CONFIGS}/lm_lngram.py:smoke")
  # Head width 64 and rows of 128 tokens: shapes the splash kernel takes.
  config.model.update(head_dim=64)
  config.model.memory.update(readout="pallas")
  config.data.update(seq_len=128)
  return plan_run(config, {"data": 4}, target="v5e:2x2")


def test_pallas_readout_and_splash_attention_are_in_the_tpu_program(lngram_plan):
  r = lngram_plan
  kernels = _kernels(r["hlo"])
  assert r["hlo"].count(KERNEL_CALL["tpu"]) == sum(kernels.values()) > 0
  assert kernels.get("sink_readout_fwd") == kernels.get("sink_readout_bwd") == 1, kernels
  assert any("splash" in name for name in kernels), kernels
  assert r["compiler"] == "XLA:TPU" and r["accelerator"].name == "TPU v5e"


def test_the_text_holds_peak_fits_and_collectives(lngram_plan):
  text = format_plan(lngram_plan, "lm_lngram.py:smoke")
  lines = text.splitlines()
  peak = [line for line in lines if "peak" in line and "GiB" in line]
  assert len(peak) == 1 and "FITS" in peak[0] and "[XLA:TPU v5e:2x2]" in peak[0]
  usable = lngram_plan["hbm_usable"]
  assert 15 * 2**30 < usable <= 16 * 2**30   # a 16 GiB v5e chip, as its compiler counts
  collectives = [line for line in lines if line.startswith("collectives")]
  assert len(collectives) == 1
  for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute"):
    assert kind in collectives[0]
  # Data parallel: the gradients are all-reduced, at least the parameters' bytes.
  assert lngram_plan["collectives"]["all-reduce"] >= lngram_plan["params"]["bytes"]
  # Why XLA:TPU's FLOPs are not the formula's: the splash and readout kernels' matmuls
  # are in the jaxpr, not in any cost analysis; the loss's chunks count once.
  why = [line for line in lines if line.startswith("  why not 1")]
  seen = lngram_plan["flops_jaxpr_seen"]
  assert len(why) == 1 and "without the Pallas kernels'" in why[0]
  assert seen["as_compiler"] <= seen["no_kernels"] < lngram_plan["flops_jaxpr"]


def test_frozen_backbone_step_reduces_only_the_trained_gradients():
  """Qwen3-VL smoke Stage I (PVM trains, the rest frozen) on v5e:2x2, data=4: the
  gradient reduction moves the trainable leaves' bytes, not the model's."""
  tpu_devices("v5e:2x2")
  config = load_config(f"{CONFIGS}/qwen3vl_pvm_sft.py:smoke")
  config.data.update(batch_size=4)
  r = plan_run(config, {"data": 4}, target="v5e:2x2")
  trained = 4 * r["qwen3vl"]["trainable"]          # float32 gradients
  total = 4 * r["params"]["count"]
  reduced = r["collectives"]["all-reduce"] + r["collectives"]["reduce-scatter"]
  assert trained <= reduced <= trained + 64 * 1024, (trained, reduced, total)
  assert reduced < total / 5


def test_plan_target_command_and_hlo_dump(tmp_path):
  tpu_devices("v5e:2x2")
  out = tmp_path / "step.hlo"
  done = run_cli("plan", f"--config={CONFIGS}/lm_lngram.py:smoke", "--mesh=data=4",
                 "--target=v5e:2x2", f"--dump_hlo={out}", timeout=600)
  assert done.returncode == 0, done.stderr
  assert re.search(r"^peak memory .*[\d.]+ GiB per chip .*FITS", done.stdout, re.M)
  assert re.search(r"^collectives +all-reduce [\d.]+ \w*B", done.stdout, re.M)
  assert "HloModule" in out.read_text()


def test_the_moe_recipe_on_expert_4_sends_tokens_by_all_to_all(tmp_path):
  """The issue's interface: the MoE smoke recipe's TPU program on expert=4 holds the
  ragged all-to-all (out to the experts and back, and their transposes), the plan counts
  its bytes, and each chip holds a quarter of the routed experts."""
  tpu_devices("v5e:2x2")
  out = tmp_path / "moe.hlo"
  done = run_cli("plan", f"--config={CONFIGS}/moe06b_lngram_v2.py:smoke", "--mesh=expert=4",
                 "--target=v5e:2x2", f"--dump_hlo={out}", timeout=600)
  assert done.returncode == 0, done.stderr
  hlo = out.read_text()
  assert hlo.count("ragged-all-to-all(") == 8   # 2 MoE layers × (out, back) × (fwd, bwd)
  moved = re.search(r"^collectives .* all-to-all ([\d.]+) KiB", done.stdout, re.M)
  # 32 tokens per chip × top-2 × width 128 × 4 bytes, 4 exchanges per layer, 2 layers.
  assert moved and float(moved.group(1)) >= 4 * 2 * 32 * 2 * 128 * 4 / 1024
  experts = re.search(r"^  routed experts +([\d.]+) KiB per device of ([\d.]+) KiB .*1/4",
                      done.stdout, re.M)
  assert experts and float(experts.group(1)) * 4 == pytest.approx(float(experts.group(2)))
  assert "dropless receive buffer" in done.stdout   # why XLA:TPU's FLOPs exceed the jaxpr's


@pytest.mark.parametrize("args, message", [
    (["--mesh=data=2", "--target=v5e:2x2"], "--target=v5e:2x2 has 4: give axis sizes"),
    (["--mesh=data=4", "--target=v9z:2x2"], "is not a TPU topology"),
    (["--mesh=data=4", "--target=v5e:2x2x2"], "v5e topologies have 2 axes"),
    (["--mesh=data=4", "--target=v5e:2x2", "--accelerator=h100"], "leave out --accelerator"),
])
def test_bad_targets_are_one_line(args, message):
  if "has 4" in message:
    tpu_devices("v5e:2x2")
  assert message in refusal("plan", f"--config={CONFIGS}/lm_lngram.py:smoke", *args)


def test_without_libtpu_the_target_names_the_extra(monkeypatch):
  monkeypatch.setattr(tpu, "libtpu_available", lambda: False)
  with pytest.raises(ValueError, match=r"pip install -e '\.\[tpu\]'"):
    tpu.topology_devices("v5e:2x2")


def test_topology_names_and_proxies():
  assert tpu.parse_topology("v5p:2x2x2") == ("v5p", (2, 2, 2))
  assert [tpu.proxy_topology("v5p", n) for n in (2, 4, 8, 16, 64)] == [
      None, "v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4", "v5p:4x4x4"]
  assert tpu.proxy_topology("v5e", 8) == "v5e:2x4" and tpu.proxy_topology("v4", 8) == "v4:2x2x1"
  assert tpu.proxy_topology("v5e", 12) is None
  for name in ("v4:2x2x1", "v5e:2x4", "v6e:2x2"):
    generation, dims = tpu.parse_topology(name)
    assert math.prod(dims) * tpu.devices_per_chip(generation) in (4, 8)


def test_a_tpu_plan_without_target_is_judged_by_its_own_compiler_never_by_xla_cpu():
  """Without --target the step compiles for XLA:CPU (its numbers) and, with libtpu, once
  more for a topology of the named TPU's generation with as many devices: the verdict is
  that compile's, labelled; XLA:CPU's peak is printed, never judged. Without one (no
  topology of 2 devices), the estimate judges, and says why."""
  tpu_devices("v5e:2x2")
  done = run_cli("plan", f"--config={CONFIGS}/lm_lngram.py:smoke", "--mesh=data=4",
                 "--accelerator=tpu_v5e", timeout=600)
  assert done.returncode == 0, done.stderr
  peak = [line for line in done.stdout.splitlines() if line.startswith("peak memory")]
  assert len(peak) == 1 and "[XLA:TPU v5e:2x2, the chip's own compiler" in peak[0], peak
  assert "FITS" in peak[0]
  assert re.search(r"^XLA:CPU peak .*not a verdict", done.stdout, re.M)
  config = load_config(f"{CONFIGS}/lm_lngram.py:smoke")
  r = plan_run(config, {"data": 2}, accelerator="tpu_v5e", proxy=True)   # no 2-chip topology
  assert r["proxy"] is None and r["verdict"]["source"] == "estimate"
  assert "no TPU topology has 2 devices" in format_plan(r)


def test_surrogate_chunks_stay_on_their_devices_under_xla_partitioning():
  """The blocks backward with its windows split over 4 chips by XLA (no shard_map, as the
  Lngram v1 arm runs): chunks take every n-th window on TPU, so no chunk gathers the
  windows of other chips; the program moves a few times the window arrays, not once per
  chunk (here the contiguous layout gathered 73 MB, ten times the rows read; 58 TiB a
  step at the MoE recipe's size)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  from experiments.plan.collectives import collective_bytes
  from lngram_jax.lookup import ngram_lookup

  devices = tpu_devices("v5e:2x2")
  mesh = Mesh(np.array(devices), ("data",))
  # 131,072 windows of 13 rows of 128 floats: 3 chunks of the TPU budget (256 MiB).
  B, T, R, M, Dm = 8, 1024, 16, 4, 128
  rows = NamedSharding(mesh, P("data"))
  avals = (jax.ShapeDtypeStruct((R * 16**3, Dm), jnp.float32, sharding=NamedSharding(mesh, P())),
           jax.ShapeDtypeStruct((B, T, R, M), jnp.float32, sharding=rows))

  def loss(table, z):
    mem = ngram_lookup(table, z, order=3, bits=M, surrogate="onebit", surrogate_impl="blocks")
    return jnp.sum(mem * jnp.cos(mem))

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(*avals).lower().compile()
  gathered = collective_bytes(compiled.as_text())["all-gather"]
  windows = B * T * R * (1 + 3 * M) * 4   # the [windows, cand] int32 rows read
  assert gathered < windows, gathered
