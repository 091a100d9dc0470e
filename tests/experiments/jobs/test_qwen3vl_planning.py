"""The Qwen3-VL job's plan hooks (experiments/jobs/qwen3vl/planning.py); the plan of its
stages as a whole: tests/experiments/plan/test_plan.py."""

import jax

from experiments.configs import load_config
from experiments.jobs.qwen3vl import planning
from experiments.trainer.placement import make_train_mesh


def test_qwen3vl_grpo_step_traces_under_gradient_accumulation():
  """Stage II's step in micro-batches: each takes its rows' images (`micro_grid`) and
  holds their own image tokens in PVM's memory."""
  grpo = load_config("experiments/configs/qwen3vl_pvm_grpo.py:smoke")
  grpo.train.update(grad_accum=2)
  mesh = make_train_mesh({"data": 1}, devices=jax.devices("cpu")[:1])
  run, _, geo = planning.abstract_run(grpo, mesh)
  assert geo["rows"] == 2
  run.step.trace(run.state, run.rest, run.batch)   # raised before micro_grid was applied
