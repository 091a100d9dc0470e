"""`lngram-exp plan --target=<gpu>:<GPUs>`: the run's step compiled by XLA:GPU on this CPU.

With jax's CUDA plugin installed (`pip install -e '.[gpu-compile]'`, which the README's
test command does) the GPU compiler runs here for GPUs given as specs
(experiments/plan/gpu.py). Tiny models compile in seconds: the Lngram `readout="pallas"`
program holds the Triton sink-readout kernels and the Triton flash attention (chosen by
the compile's target), the MoE's grouped matmuls are the Triton gmm/tgmm and its tokens
travel by ragged all-to-all, the text has the interface's lines, and the usable memory
follows JAX's allocator. The refusals are one line.
"""

import re

import pytest
from cli_runner import refusal, run_cli

from experiments.configs import load_config
from experiments.plan import gpu
from experiments.plan.report import plan_run
from experiments.plan.text import format_plan

CONFIGS = "experiments/configs"
CALL = "__gpu$xla.gpu.triton"


def _needs_compiler():
  if not gpu.compiler_available():
    pytest.skip(f"needs the GPU compiler ({gpu.EXTRA})")


def _kernels(hlo: str) -> dict[str, int]:
  """Triton kernel calls of a compiled GPU program by kernel name."""
  names = re.findall(r'%([A-Za-z_]+)[.\d]* = [^\n]*custom_call_target="__gpu\$xla\.gpu\.triton"',
                     hlo)
  names += re.findall(r'custom_call_target="__gpu\$xla\.gpu\.triton"[^\n]*op_name="[^"]*/'
                      r'([A-Za-z_]+)/pallas_call"', hlo)
  out: dict[str, int] = {}
  for name in names:
    out[name] = out.get(name, 0) + 1
  return out


@pytest.fixture(scope="module")
def lngram_plan():
  _needs_compiler()
  config = load_config(f"{CONFIGS}/lm_lngram.py:smoke")
  config.model.update(head_dim=64)   # flash attention's tiles: heads of 64, rows of 128
  config.model.memory.update(readout="pallas")
  config.data.update(seq_len=128)
  return plan_run(config, {"data": 2}, target="h100:2")


def test_the_triton_kernels_are_in_the_gpu_program(lngram_plan):
  r = lngram_plan
  assert r["compiler"] == "XLA:GPU" and r["accelerator"].name == "H100 SXM"
  hlo = r["hlo"]
  assert hlo.count(CALL) > 0
  assert "sink_readout_fwd" in hlo and "sink_readout_bwd" in hlo
  assert "mha" in hlo   # jax's Triton flash attention (forward and backward kernels)
  assert "tpu_custom_call" not in hlo


def test_the_text_holds_peak_fits_and_collectives(lngram_plan):
  text = format_plan(lngram_plan, "lm_lngram.py:smoke")
  lines = text.splitlines()
  peak = [line for line in lines if "peak" in line and "GiB" in line]
  assert len(peak) == 1 and "FITS" in peak[0] and "[XLA:GPU h100]" in peak[0], peak
  assert "per GPU" in peak[0] and "XLA_PYTHON_CLIENT_MEM_FRACTION=0.75" in peak[0]
  # JAX's allocator takes 0.75 of the memory CUDA reports for an H100 SXM.
  assert lngram_plan["hbm_usable"] == pytest.approx(0.75 * 84978434048)
  collectives = [line for line in lines if line.startswith("collectives")]
  assert len(collectives) == 1 and "per GPU" in collectives[0]
  # Data parallel: the gradients are all-reduced, at least the parameters' bytes.
  assert lngram_plan["collectives"]["all-reduce"] >= lngram_plan["params"]["bytes"]
  assert "Pallas Triton kernel call(s)" in text and "no autotuning" in text
  assert "XLA:GPU has no cost analysis" in text


def test_usable_memory_follows_the_allocator_fraction(monkeypatch):
  monkeypatch.setenv(gpu.MEM_FRACTION_VARIABLE, "0.5")
  assert gpu.usable_bytes("h200") == pytest.approx(0.5 * 150754820096)
  monkeypatch.setenv(gpu.MEM_FRACTION_VARIABLE, "1.5")
  with pytest.raises(ValueError, match="must be a number in \\(0, 1\\]"):
    gpu.usable_bytes("h200")


def test_a_step_over_the_allocators_share_does_not_fit(monkeypatch):
  """The verdict honours XLA_PYTHON_CLIENT_MEM_FRACTION: with a share of a few KiB of the
  H100's memory the same step DOES NOT FIT, and the line says which share it assumed."""
  _needs_compiler()
  monkeypatch.setenv(gpu.MEM_FRACTION_VARIABLE, "1e-07")
  config = load_config(f"{CONFIGS}/lm_lngram.py:smoke")
  r = plan_run(config, {"data": 1}, target="h100:1")
  peak = [line for line in format_plan(r).splitlines() if line.startswith("peak memory")]
  assert not r["verdict"]["fits"] and "DOES NOT FIT" in peak[0]
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION=1e-07" in peak[0]


def test_plan_gpu_target_command_and_hlo_dump(tmp_path):
  """The interface: one `peak` line with the per-GPU GiB and FITS, one line starting
  `collectives`, the program written by --dump_hlo; nothing about CUDA drivers."""
  _needs_compiler()
  out = tmp_path / "step.hlo"
  done = run_cli("plan", f"--config={CONFIGS}/lm_lngram.py:smoke", "--mesh=data=2",
                 "--target=h800:2", "--config.model.memory.readout=pallas",
                 f"--dump_hlo={out}", timeout=600)
  assert done.returncode == 0, done.stderr
  peak = [line for line in done.stdout.splitlines() if "peak" in line]
  assert len(peak) == 1 and re.search(r"[\d.]+ GiB per GPU \[XLA:GPU h800\].*FITS", peak[0])
  assert re.search(r"^collectives +all-reduce [\d.]+ \w*B", done.stdout, re.M)
  assert CALL in out.read_text()
  assert "cuda" not in done.stderr.lower(), done.stderr


def test_the_moe_on_gpus_takes_the_grouped_kernel_and_the_ragged_all_to_all(tmp_path):
  """The MoE smoke recipe on expert=2 over two H100s: tokens travel to their experts by
  ragged all-to-all, the experts' products are the Triton gmm/tgmm, and no ragged_dot
  is left for XLA:GPU to compute densely."""
  _needs_compiler()
  config = load_config(f"{CONFIGS}/moe06b_lngram_v2.py:smoke")
  r = plan_run(config, {"expert": 2}, target="h100:2")
  hlo = r["hlo"]
  exchanges = hlo.count("ragged-all-to-all-start(")
  # 2 MoE layers × (out, back), forward and backward: 8 in jax 0.10.2's XLA:GPU program;
  # jax 0.11.2's program holds 4 (measured; not yet read further), so at least the
  # forward's out and back of each layer.
  assert exchanges >= 4
  kernels = _kernels(hlo)
  assert kernels.get("grouped_matmul_gmm", 0) > 0 and kernels.get("grouped_matmul_tgmm", 0) > 0
  assert "ragged_dot_general" not in hlo
  # Each exchange moves a device's slots (here >= 128 rows of 32 floats): the async pair's
  # bytes, counted once.
  assert r["collectives"]["all-to-all"] >= exchanges * 128 * 32 * 4
  assert "densely" not in format_plan(r)


def test_without_a_target_a_gpu_plan_is_judged_by_xla_gpu_never_by_xla_cpu(monkeypatch):
  """Without --target the step compiles for XLA:CPU (its numbers) and once more by
  XLA:GPU for as many of the named GPUs: the verdict is that compile's, labelled;
  XLA:CPU's peak is printed, never judged. Without the GPU compiler the estimate
  judges, and the note names the extra."""
  _needs_compiler()
  config = load_config(f"{CONFIGS}/lm_lngram.py:smoke")
  r = plan_run(config, {"data": 2}, accelerator="h200", proxy=True)
  assert r["verdict"]["source"] == "XLA:GPU h200:2" and r["verdict"]["fits"]
  text = format_plan(r)
  peak = [line for line in text.splitlines() if line.startswith("peak memory")]
  assert len(peak) == 1 and "[XLA:GPU h200:2, the chip's own compiler" in peak[0]
  assert re.search(r"^XLA:CPU peak .*not a verdict", text, re.M)
  monkeypatch.setattr(gpu, "compiler_available", lambda: False)
  r = plan_run(config, {"data": 2}, accelerator="h200", proxy=True)
  assert r["proxy"] is None and r["verdict"]["source"] == "estimate"
  assert "the GPU compiler is not installed (pip install -e '.[gpu-compile]')" in format_plan(r)


def test_gpus_on_several_hosts_meet_the_network():
  """`h100:2x2`: 4 GPUs on 2 hosts (their devices belong to 2 processes): the collectives
  are priced at the network's rate between hosts, not NVLink's."""
  _needs_compiler()
  config = load_config(f"{CONFIGS}/lm_lngram.py:smoke")
  r = plan_run(config, {"data": 4}, target="h100:2x2")
  text = format_plan(r)
  assert "4 × H100 SXM, 2 hosts of 2" in text and "(the network between hosts)" in text
  assert r["collectives"]["all-reduce"] > 0
  assert r["projection"]["comm_s"] == pytest.approx(r["collective_bytes"] / 50e9)


@pytest.mark.parametrize("args, message", [
    (["--mesh=data=2", "--target=h800:8"], "--target=h800:8 has 8: give axis sizes"),
    (["--mesh=data=8", "--target=b200:8"], "h100, h200, h800, a100"),
    (["--mesh=data=4", "--target=h800:16"], "a host holds at most 8 GPUs"),
    (["--mesh=data=2", "--target=h800:2", "--accelerator=h100"], "leave out --accelerator"),
])
def test_bad_gpu_targets_are_one_line(args, message):
  if "has 8" in message:
    _needs_compiler()
  assert message in refusal("plan", f"--config={CONFIGS}/lm_lngram.py:smoke", *args)


def test_without_the_gpu_compiler_the_target_names_the_extra(monkeypatch):
  monkeypatch.setattr(gpu, "compiler_available", lambda: False)
  with pytest.raises(ValueError, match=r"pip install -e '\.\[gpu-compile\]'"):
    gpu.target_devices("h800:8")


def test_target_names():
  assert gpu.parse_target("h800:8") == ("h800", 1, 8)
  assert gpu.parse_target("H800:8x8") == ("h800", 8, 8)
  assert gpu.parse_target("a100:1") == ("a100", 1, 1)
  assert [gpu.target_of("h100", n) for n in (1, 4, 8, 16, 12, 64)] == [
      "h100:1", "h100:4", "h100:8", "h100:2x8", None, "h100:8x8"]
  assert gpu.is_gpu_target("h200:8") and not gpu.is_gpu_target("v5p:2x2x2")
  for bad in ("h800", "h800:0", "h800:x8", "rtx4090:1"):
    with pytest.raises(ValueError):
      gpu.parse_target(bad)
  # The shipped specs: compute capability, memory as CUDA reports it, shared memory.
  assert gpu.spec_field("a100", "major") == 8 and gpu.spec_field("h800", "major") == 9
  assert gpu.spec_field("h200", "device_memory_size") > 1.7 * gpu.spec_field(
      "h100", "device_memory_size")
  assert gpu.spec_field("a100", "shared_memory_per_block_optin") == 166912


def test_a_lora_run_counts_its_factors_and_only_they_hold_optimizer_state():
  """lm_lngram.py:smoke with model.lora.rank=4 on one H100: the factors' count from the
  shapes equals the formula's, AdamW's moments are those of the trained parameters alone
  (the factors and the memory branch, the LM task's LoRA mask), and XLA:GPU compiles it."""
  _needs_compiler()
  from experiments.models.config import lm_config
  config = load_config(f"{CONFIGS}/lm_lngram.py:smoke")
  config.model.lora.rank = 4
  mc = lm_config(config)
  r = plan_run(config, {"data": 1}, target="h100:1")
  assert r["compiler"] == "XLA:GPU" and r["oom"] is None and "HloModule" in r["hlo"]
  counts = r["params"]["formula"]
  # rank 4 on w_q [D, Hq, Dh] and w_kv [D, 2, Hkv, Dh] (the default targets) per layer.
  per_layer = 4 * (2 * mc.d_model + mc.n_heads * mc.head_dim + 2 * mc.n_kv_heads * mc.head_dim)
  assert r["params"]["lora"] == counts["lora"] == mc.n_layers * per_layer
  assert r["params"]["count"] == counts["total"]
  trained = counts["lora"] + counts["memory"]
  assert 0 < counts["memory"] < counts["backbone"]
  # mu and nu in float32 per trained value, plus the transforms' step counts.
  assert 8 * trained <= r["optimizer_bytes"] <= 8 * trained + 64, (r["optimizer_bytes"], trained)
  lines = format_plan(r).splitlines()
  lora = [line for line in lines if line.startswith("  LoRA factors")]
  assert len(lora) == 1 and f"{counts['lora']:,} [shapes] = {counts['lora']:,} [formula]" in lora[0]
  assert any(line.startswith("optimizer state") and "trained parameters alone" in line
             for line in lines)
