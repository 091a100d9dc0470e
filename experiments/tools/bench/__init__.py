"""Runnable tools: benchmarks and checks, each `python -m experiments.tools.bench.<name>`.

  layer          the Lngram v2 layer vs a dense decoder layer (`dense.py`), readout forms
  kernels        the Pallas sink readout and the layer with each readout
  sharding       bytes the collectives move per token, sharded step-time ratios
  multihost      a multi-process check of the sharded layer over `jax.distributed`
  generate       tokens/s of LM sampling with and without the decode caches
  train          training tokens/s of the LM configs
  mesh_train     bytes each collective moves per training step on a mesh, step times
  vlm_decode     VLM decode tokens/s with and without PVM
  arm_params     total / active parameters of every memory arm
  lm_efficiency  the paper's Table 12: prefill / decode latency and memory of a 2B
                 decoder with Lngram v2 (its rows and model: `scan_lm.py`; the paper's
                 numbers, overheads and tables: `lm_efficiency_table.py`)
  tokens         token-data throughput: prepare-data, the loader against the step
  hf_import      Hugging Face checkpoint import time and peak memory, ours vs transformers
  hf_train_step  the Table 13 recipe's training step at Qwen3-1.7B widths, with and
                 without Lngram v2 (step time, peak memory, overhead target)
  targets        the GPU suite's absolute targets as PASS/FAIL lines (used by the benches)
  scale_check    the main arms at d 512 x 8 layers, 1,000 steps each, under a deadline
                 (the GPU scale check; `scale_check.sh` runs it alone; its arms:
                 `scale_check_arms.py`, one arm's training: `scale_check_train.py`)
  gpu_suite.sh   the GPU check suite (kernel tests, then the benchmarks above)

Benchmarks print tables; the numbers live in BENCHMARKS.md with date, machine and
command. Nothing outside the tools and tests imports from here (tests/test_imports.py).
"""
