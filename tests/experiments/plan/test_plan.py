"""`lngram-exp plan`: the compiled step's numbers against first-principles counts.

Analytic counts (experiments/models/counts.py): parameters exactly; training FLOPs
6·A·BT + 12·L·T·Hq·Dh·BT (A: multiply-adds per token of every matmul, the Lngram
readout's included) within 10% of XLA's cost analysis summed over the mesh. The
full-size check compiles hf_lngram.py:keye2b at its real width (d 2048, vocabulary
151,936, Lngram R 121 at d 2048) with 2 of its 28 layers, because compiling all 28
on CPU takes about a minute: per-layer terms are identical, so the full model's
counts are the same formulae with L = 28 (the README shows that run).
"""

import math
import resource

import jax
import pytest
from cli_runner import run_cli

from experiments.configs import load_config
from experiments.models import counts
from experiments.models.config import lm_config
from experiments.plan import accelerators
from experiments.plan.collectives import collective_bytes, line_bytes
from experiments.plan.report import plan_run, refuse_mesh
from experiments.plan.text import format_plan
from experiments.trainer.placement import make_train_mesh

CONFIGS = "experiments/configs"


@pytest.fixture(scope="module")
def small():
  """lm_lngram.py (d 128, 4 layers, Lngram in 2) on a data=2 mesh."""
  config = load_config(f"{CONFIGS}/lm_lngram.py")
  return config, plan_run(config, {"data": 2}, accelerator="h100", mfu=0.4)


def test_small_plan_matches_the_analytic_counts(small):
  config, r = small
  formula = counts.param_count(lm_config(config))
  assert r["params"]["count"] == formula["total"] == r["params"]["formula"]["total"]
  assert r["params"]["bytes"] == 4 * formula["total"]          # float32, replicated on data
  assert r["optimizer_bytes"] >= 2 * r["params"]["bytes"]     # AdamW's two moments
  xla_total = r["xla"]["flops"] * r["devices"]
  assert abs(xla_total / r["flops_formula"] - 1) < 0.10, (xla_total, r["flops_formula"])
  assert abs(r["flops_jaxpr"] / r["flops_formula"] - 1) < 0.02   # the matmuls alone
  # Data parallel: every gradient is all-reduced once, so at least the parameters' bytes.
  assert r["collectives"]["all-reduce"] >= r["params"]["bytes"]
  assert r["xla"]["peak"] > r["xla"]["temp"] > 0
  text = format_plan(r, "lm_lngram.py")
  for word in ("parameters", "optimizer state", "activations", "peak memory",
               "FLOPs per step", "FLOPs per token", "collectives", "step time", "H100"):
    assert word in text


def test_full_width_plan_allocates_nothing():
  config = load_config(f"{CONFIGS}/hf_lngram.py:keye2b")
  config.model.update(n_layers=2, memory_layers=(1,))
  before = {id(a) for a in jax.live_arrays()}
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  r = plan_run(config, {"fsdp": 8}, accelerator="h200", mfu=0.4)
  grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss
  assert not {id(a) for a in jax.live_arrays()} - before   # no array was created
  # Parameters + AdamW state of this model are 5.9 GB: allocating them would show.
  assert 3 * 4 * r["params"]["count"] > 5e9 and grown < 2e9, grown
  assert r["params"]["count"] == r["params"]["formula"]["total"]
  assert r["params"]["bytes"] < 1.05 * 4 * r["params"]["count"] / 8   # fsdp splits them
  # XLA counts the chunked cross entropy's scan body once: its 8 per weight and token
  # (forward, recompute, two backward products) of the unembedding, for one chunk of n.
  n = r["loss_chunks"]
  unembed = 8 * 2048 * 151936 * r["tokens"]
  seen = r["flops_formula"] - unembed * (1 - 1 / n)
  assert n > 1 and abs(r["xla"]["flops"] * 8 / seen - 1) < 0.10, (n, seen)
  assert abs(r["flops_jaxpr"] / r["flops_formula"] - 1) < 0.02
  assert r["collectives"]["all-gather"] > 0   # fsdp gathers parameters for the forward


def test_moe_recipe_at_full_width_matches_the_formula():
  """moe06b_lngram_v2 (MoE in every layer, Lngram v2 R 16) at d 768 with 8 experts and a
  32,768 vocabulary, 2 layers and a short batch so that it compiles in seconds."""
  config = load_config(f"{CONFIGS}/moe06b_lngram_v2.py")
  config.model.update(vocab_size=32768, n_layers=2, memory_layers=(1,), moe_layers=(0, 1))
  config.data.update(batch_size=2, seq_len=128)
  r = plan_run(config, {"data": 2})
  assert r["params"]["count"] == r["params"]["formula"]["total"]
  # XLA:CPU runs ragged_dot densely over the experts; the program's matmuls are the formula's.
  assert r["dense_ragged"] and "ragged_dot densely" in format_plan(r)
  assert abs(r["flops_jaxpr"] / r["flops_formula"] - 1) < 0.02   # remat: models/counts.py
  assert math.isclose(r["projection"]["compute_s"] * 989e12 * 0.4,
                      r["flops_jaxpr"] / 2, rel_tol=1e-9)
  # Expert parallelism: the same matmuls (the receive buffer's rows past what a balanced
  # load fills do not count), all-to-all among the collectives (on XLA:CPU the dense
  # stand-in, said so), and each device holding half the routed experts.
  ep = plan_run(config, {"expert": 2})
  assert ep["flops_jaxpr"] == pytest.approx(r["flops_jaxpr"], rel=1e-6)
  assert ep["collectives"]["all-to-all"] > 0 == r["collectives"]["all-to-all"]
  assert 2 * ep["params"]["experts"][0] == ep["params"]["experts"][1] == r["params"]["experts"][0]
  text = format_plan(ep)
  assert "1/2 of the experts on each device" in text and "dense stand-in" in text


def test_mesh_that_does_not_divide_is_refused():
  config = load_config(f"{CONFIGS}/lm_lngram.py")   # 16 routes, batch 16
  with pytest.raises(ValueError, match="routes=16 must be a multiple of mesh.table=3"):
    refuse_mesh(config, {"table": 3})
  with pytest.raises(ValueError, match="explicit sizes"):
    refuse_mesh(config, {"data": -1})
  moe = load_config(f"{CONFIGS}/moe06b_baseline.py")   # 8 routed experts
  with pytest.raises(ValueError, match="n_experts=8 must be a multiple of mesh.expert=3"):
    refuse_mesh(moe, {"expert": 3})
  done = run_cli("plan", f"--config={CONFIGS}/lm_lngram.py:smoke", "--mesh=data=3",
                 timeout=120)
  assert done.returncode == 2, done.stderr
  error = done.stderr.strip().splitlines()
  assert len(error) == 1 and error[0].startswith("error: data.batch_size=4 must be a "
                                                 "multiple of mesh.data × mesh.fsdp × mesh.expert = 3")


HLO = """HloModule m

%body (p: (s32[], f32[10])) -> (s32[], f32[10]) {
  %ar = f32[10]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add
  %lone = f32[99]{0} all-reduce(%x), channel_id=2, replica_groups={{0},{1},{2},{3}}, to_apply=%add
}

%cond (p: (s32[], f32[10])) -> pred[] {
  %c = pred[] constant(true)
}

ENTRY %main (a: f32[8,4]) -> f32[8,4] {
  %ag = f32[8,4]{1,0} all-gather(%a), channel_id=3, replica_groups=[1,4]<=[4], dimensions={0}
  %rs = bf16[2]{0} reduce-scatter(%a), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}
  %ags = ((f32[2]{0}), f32[8]{0}) all-gather-start(%a), channel_id=5, replica_groups={{0,1,2,3}}
  %agd = f32[8]{0} all-gather-done(%ags)
  %w = (s32[], f32[10]) while(%t), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"3"}}
  %rows = f32[64,1,128]{2,1,0} bitcast(%a)
  %buf = f32[256,1,128]{2,1,0} broadcast(%z)
  %r2a = f32[256,1,128]{2,1,0} ragged-all-to-all(%rows, %buf, %o, %s, %oo, %rs), \
channel_id=6, replica_groups={{0,1,2,3}}
}
"""


def test_an_unplanned_job_is_refused_in_one_line():
  from experiments.plan.compile import planner
  config = load_config(f"{CONFIGS}/vlm_pvm_sft.py")
  with pytest.raises(ValueError, match=r"^plan: the vlm job's configs are not planned \(the "
                     r"jobs planned: lm, qwen3vl\)\.$"):
    planner(config)
  with pytest.raises(ValueError, match="not planned"):
    refuse_mesh(config, {"data": 2})


def test_collective_bytes_by_hand():
  got = collective_bytes(HLO)
  assert got["all-gather"] == 8 * 4 * 4 / 4 + 8 * 4 / 4   # each device's piece, sync + async
  assert got["reduce-scatter"] == 2 * 2 * 4               # the whole input
  assert got["all-reduce"] == 3 * 10 * 4                  # 3 trips; singleton groups move 0
  assert got["all-to-all"] == 64 * 128 * 4                # ragged: its operand, not its buffer
  assert got["unknown_trips"] == 0


def test_async_ragged_all_to_all_of_a_gpu_program():
  """XLA:GPU's ragged all-to-all is an async pair whose start returns ((operands with their
  offset arrays), result); commas inside a layout `{1,0}` do not split that tuple."""
  line = ("%r = ((f32[128,32]{1,0}, f32[256,32]{1,0}, s64[2]{0}, s64[2]{0}, s64[2]{0}, "
          "/*index=5*/s64[2]{0}), f32[256,32]{1,0}) ragged-all-to-all-start(%x, %buf, %o, %s, "
          "%oo, /*index=5*/%rs), channel_id=1, replica_groups={{0,1}}")
  assert line_bytes(line, {"x": "f32[128,32]{1,0}"}) == ("all-to-all", 128 * 32 * 4)
  assert line_bytes(line) == ("all-to-all", 256 * 32 * 4)   # no operand shape: the result


def test_async_collective_permute_counts_its_buffer_once():
  """A collective-permute-start returns the flat (operand, result, context scalars): its
  buffer counts once, not operand and result (the TPU compiler's FSDP gathers are rings of
  these: counted twice, they read as double the traffic)."""
  line = ("%cp = (bf16[1,192,1152]{2,1,0:T(8,128)(2,1)}, bf16[1,192,1152]{2,1,0:T(8,128)(2,1)}, "
          "u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%x), channel_id=5, "
          "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}")
  assert line_bytes(line) == ("collective-permute", 192 * 1152 * 2)
  gpu = ("%cp = (f32[8,4]{1,0}, f32[8,4]{1,0}) collective-permute-start(%x), channel_id=2, "
         "source_target_pairs={{0,1},{1,0}}")
  assert line_bytes(gpu) == ("collective-permute", 8 * 4 * 4)


def test_projected_step_time_by_hand():
  chip = accelerators.accelerator("h100")
  t = accelerators.projected_step_s(chip, flops=chip.peak_flops * 0.5,
                                    collective_bytes=chip.link_bw, devices=8, mfu=0.5)
  assert math.isclose(t["compute_s"], 1.0) and math.isclose(t["comm_s"], 1.0)
  assert accelerators.collective_bw(chip, 64) == chip.network_bw   # beyond one node
  assert accelerators.accelerator("a100").peak_flops == 312e12   # the fourth GPU row
  with pytest.raises(ValueError, match="accelerator='b200'"):
    accelerators.accelerator("b200")


def test_jaxpr_flops_by_hand():
  import jax.numpy as jnp

  from experiments.plan.jaxpr_flops import jaxpr_flops
  x, w = jnp.zeros((64, 16)), jnp.zeros((8, 16, 32))
  sizes = jnp.full((8,), 8, jnp.int32)
  loss = lambda x, w: jax.lax.ragged_dot(x, w, sizes).sum()  # noqa: E731
  # Forward and both cotangents: 3 × 2·M·K·N, each row meeting only its group.
  grads = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(x, w)
  assert jaxpr_flops(grads) == 3 * 2 * 64 * 16 * 32

  def scoped(x, w):   # the expert-parallel receive buffer: 16 of its 64 rows count
    with jax.named_scope("routed_rows_16"):
      return loss(x, w)

  grads = jax.make_jaxpr(jax.value_and_grad(scoped, argnums=(0, 1)))(x, w)
  assert jaxpr_flops(grads) == 3 * 2 * 16 * 16 * 32
  a = jnp.zeros((16, 16))
  scanned = jax.make_jaxpr(lambda a: jax.lax.scan(lambda c, _: (c @ a, None), a, None,
                                                  length=5)[0])(a)
  assert jaxpr_flops(scanned) == 5 * 2 * 16 ** 3
  # As a compiler's cost analysis sees it: a loop body once, a platform's kernel branch
  # (here the cheaper one: no matmul) instead of its XLA twin.
  assert jaxpr_flops(scanned, loops=False) == 2 * 16 ** 3
  chosen = jax.make_jaxpr(lambda a: jax.lax.platform_dependent(
      a, cpu=lambda a: a @ a, default=lambda a: a * 2.0))(a)
  assert jaxpr_flops(chosen) == 2 * 16 ** 3 and jaxpr_flops(chosen, kernels=False) == 0


def test_qwen3vl_smoke_stages_plan_with_analytic_counts():
  """qwen3vl_pvm_sft.py:smoke (Stage I: PVM alone trains) compiled on data=2; the
  parameters by part are counted by hand-derivable formulae
  (experiments/jobs/qwen3vl/planning.py)
  and equal the abstract model's shapes; Stage II's step is built (not compiled) over
  prompts × group rows with the decoder and PVM trainable."""
  from experiments.jobs.qwen3vl import planning as qwen3vl

  config = load_config(f"{CONFIGS}/qwen3vl_pvm_sft.py:smoke")
  r = plan_run(config, {"data": 2})
  counts, g = r["params"]["formula"], r["qwen3vl"]
  assert r["params"]["count"] == counts["total"] == counts["text"] + counts["vision"] \
      + counts["pvm"]
  assert g["trainable"] == counts["pvm"] > 0            # Stage I: the branches only
  # AdamW's two float32 moments of the trainable leaves only (replicated on data), + counts.
  assert 8 * counts["pvm"] <= r["optimizer_bytes"] <= 8 * counts["pvm"] + 64
  assert r["params"]["bytes"] == 4 * counts["total"]
  assert abs(r["flops_jaxpr"] / r["flops_formula"] - 1) < 0.02
  assert abs(r["xla"]["flops"] * 2 / r["flops_formula"] - 1) < 0.10
  assert g["rows"] * g["seq_len"] == r["tokens"] == 2 * 192
  assert "trainable (branch)" in format_plan(r)
  with pytest.raises(ValueError, match="do not split time"):
    refuse_mesh(config, {"seq": 2})
  grpo = load_config(f"{CONFIGS}/qwen3vl_pvm_grpo.py:smoke")
  mesh = make_train_mesh({"data": 2}, devices=jax.devices("cpu")[:2])
  run, mc, geo = qwen3vl.abstract_run(grpo, mesh)
  stage2 = qwen3vl.qwen3vl_param_count(mc)
  assert geo["rows"] == 2 and geo["trainable"] == stage2["text"] + stage2["pvm"]
  # Stage II differentiates the decoder and PVM, not the frozen tower: the formula's matmuls
  # are the traced step's (read from its jaxpr, not compiled).
  from experiments.plan.jaxpr_flops import jaxpr_flops
  traced = run.step.trace(run.state, run.rest, run.batch).jaxpr
  assert abs(jaxpr_flops(traced) / qwen3vl.qwen3vl_train_flops(mc, geo)["total"] - 1) < 0.02
  assert run.batch["completion"].shape == (2, 4)
