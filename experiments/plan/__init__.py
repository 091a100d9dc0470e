"""`lngram-exp plan`: what a run costs per device on a mesh, before it starts.

    plan_run(config, {"fsdp": 8}, accelerator="h100", mfu=0.4)   every number
    format_plan(result)                                          the printed text

abstract.py builds the train step from shapes; compile.py compiles it for its target
(gpu.py: XLA:GPU for GPUs given as specs; tpu.py: libtpu's topologies); accounting.py
holds the analytic parameter and FLOP counts; collectives.py reads the bytes the
collectives move out of the compiled HLO; accelerators.py the table of chips the
step time is projected on; report.py puts them together; qwen3vl.py builds the
Qwen3-VL + PVM stages' step and counts. DESIGN.md §10.1. The command
(`experiments/cli/commands/plan.py`) checks the flags, provides the host devices
and prints.
"""
