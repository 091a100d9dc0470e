"""Pallas kernels, each with an XLA reference beside it and a dispatching api.

  sink_readout   the blocked sink-softmax readout: per token, Hq queries of
                 width Dr over R memory rows (keys = values) plus one fixed
                 sink logit with a zero value (Triton on GPU, Mosaic on TPU,
                 interpret mode on CPU); and the fused variant that gathers
                 and RMS-normalises the rows from tables by row id inside the
                 kernel (Triton only).
  flip_scores    the one-bit surrogate's backward: scores of g against a
                 table row and its one-bit neighbours (row XOR 2^k), and the
                 scatter-add of g onto the row (atomics; Triton only, glue
                 `lngram_jax.surrogate_pallas`).
  attention      causal attention within segments (splash on TPU, jax's
                 Triton flash attention on GPU).
  grouped_matmul the MoE's grouped matmul (megablox on TPU, Triton gmm/tgmm
                 on GPU, where XLA computes ragged_dot densely).

The ops are standalone: this package imports nothing from `lngram_jax`,
`pvm_jax` or `experiments`. They are the readout core of "Lngram v2: Latent
N-Gram Memory with Interpretable Discrete Representations" (the absorbed
sink-attention readout, §2.4; v1: "Lngram: N-gram Conditional Memory in Latent
Space", arXiv 2605.24869); the model glue lives in `lngram_jax.pallas` and
`lngram_jax.fused`. Conventions: DESIGN.md §2 (readout forms), §7 (testing
kernels on CPU: interpret mode and lowering checks).

Shape legend (DESIGN.md §1): BT tokens (B·T flattened), R memory rows per token
(routes), Dr row width (the route-token width), Dm width of one table row,
Hq query heads. `python -m experiments.tools.bench.kernels` times the kernels
against XLA.
"""
