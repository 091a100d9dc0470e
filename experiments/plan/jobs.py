"""What the plan does per job (experiments/jobs/registry.py): the LM's and Qwen3-VL's mesh
checks, abstract steps and analytic counts; the tiny VLM is not planned.

    planner(config)   the job's planner, or a one-line refusal
      .check_mesh(config, sizes)                   refuses a mesh the config cannot use
      .abstract_run(config, mesh)                  (AbstractRun, model config, geometry)
      .counts(config, run, mc, geo, devices, token_shards)
                                                   parameters and FLOPs by formula, the
                                                   activation estimate, the step's rows
"""

from __future__ import annotations

from experiments.jobs.registry import job_name


def planner(config):
  name = job_name(config)
  if name not in PLANNERS:
    raise ValueError(f"plan: the {name} job's configs are not planned (the jobs planned: "
                     f"{', '.join(PLANNERS)}).")
  return PLANNERS[name]


class LMPlanner:
  """The decoder LM (experiments/plan/abstract.py builds its step)."""

  @staticmethod
  def check_mesh(config, sizes: dict) -> None:
    from jax.sharding import AbstractMesh

    from experiments.jobs import checks
    from experiments.models.layout import check_expert_axis
    from experiments.plan.abstract import model_config
    from experiments.trainer.placement import AXES
    checks.check_blocks(config)
    mesh = AbstractMesh(tuple(sizes[a] for a in AXES), tuple(AXES))
    model = model_config(config)
    if getattr(model, "moe_layers", ()):   # each `expert` device holds whole experts
      check_expert_axis(model.moe.n_experts, mesh)
    checks.check_fits(mesh, batch_size=int(config.data.batch_size),
                      seq_len=int(config.data.seq_len), memory=model.memory)

  @staticmethod
  def abstract_run(config, mesh):
    from experiments.plan.abstract import abstract_run
    return abstract_run(config, mesh), None, None

  @staticmethod
  def counts(config, run, mc, geo, devices: int, token_shards: int) -> dict:
    del mc, geo
    from experiments.jobs import checks
    from experiments.plan.accounting import param_count, train_flops
    B, T = int(config.data.batch_size), int(config.data.seq_len)
    return {"counts": param_count(run.model), "batch": B, "seq_len": T, "vl": None,
            "estimate": checks.memory_plan(config, devices, token_shards=token_shards),
            "formula": train_flops(run.model, batch=B, seq_len=T)}


class Qwen3VLPlanner:
  """Qwen3-VL with PVM, Stage I / II (experiments/plan/qwen3vl.py)."""

  @staticmethod
  def check_mesh(config, sizes: dict) -> None:
    from experiments.plan.qwen3vl import check_qwen3vl_mesh
    check_qwen3vl_mesh(config, sizes)

  @staticmethod
  def abstract_run(config, mesh):
    from experiments.plan.qwen3vl import qwen3vl_abstract_run
    return qwen3vl_abstract_run(config, mesh)

  @staticmethod
  def counts(config, run, mc, geo, devices: int, token_shards: int) -> dict:
    del config, devices
    from experiments.plan import qwen3vl
    parts = qwen3vl.qwen3vl_train_flops(mc, geo)
    vl = {**geo, "flops_parts": parts, "layers": mc.text.n_layers,
          "pvm_layers": tuple(mc.text.ffn_branch_layers), "vision_depth": mc.vision.depth}
    return {"counts": qwen3vl.qwen3vl_param_count(mc), "batch": geo["rows"],
            "seq_len": geo["seq_len"], "vl": vl, "formula": parts["total"],
            "estimate": qwen3vl.memory_estimate(mc, geo, token_shards, run)}


PLANNERS = {"lm": LMPlanner, "qwen3vl": Qwen3VLPlanner}
