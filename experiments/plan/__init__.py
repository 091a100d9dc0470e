"""`lngram-exp plan`: what a run costs per device on a mesh, before it starts.

    plan_run(config, {"fsdp": 8}, accelerator="h100", mfu=0.4)   every number
    format_plan(result)                                          the printed text (text.py)

The config's job builds the train step from shapes and counts it (its `planner()`:
experiments/jobs/<job>/planning.py, on `experiments.trainer.state.abstract_train_state`
and experiments/models/counts.py); compile.py finds that planner and compiles the step for
its target (gpu.py: XLA:GPU for GPUs given as specs; tpu.py: libtpu's topologies);
collectives.py reads the bytes the collectives move out of the compiled HLO;
jaxpr_flops.py the program's matmul FLOPs; accelerators.py the table of chips the step
time is projected on; report.py puts them together and text.py prints them; rollout.py
plans Qwen3-VL's Stage II sampling. DESIGN.md §10.1. The command
(`experiments/cli/commands/plan.py`) checks the flags, provides the host devices
and prints.
"""
