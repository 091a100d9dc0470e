"""Runnable tools: benchmarks and checks, each `python -m experiments.bench.<name>`.

  layer       the Lngram v2 layer vs a dense decoder layer (`dense.py`), readout forms
  kernels     the Pallas sink readout and the layer with each readout
  sharding    bytes the collectives move per token, sharded step-time ratios
  multihost   a multi-process check of the sharded layer over `jax.distributed`
  generate    tokens/s of LM sampling with and without the decode caches
  train       training tokens/s of the LM configs
  vlm_decode  VLM decode tokens/s with and without PVM
  gpu_suite.sh  the GPU check suite (kernel tests, then the benchmarks above)

Benchmarks print tables; the numbers live in BENCHMARKS.md with date, machine and
command. Nothing in the library packages imports from here.
"""
