"""Pallas kernels, each with its XLA reference beside it (the one definition of its contract).

  sink_readout   the blocked sink-softmax readout: per token, Hq queries of
                 width Dr over R memory rows (keys = values) plus one fixed
                 sink logit with a zero value (Triton on GPU, with a
                 token-block variant for small R; Mosaic on TPU; interpret
                 mode on CPU), under a custom_vjp (`api.py`); and the fused
                 variant that gathers and RMS-normalises the rows from tables
                 by row id inside the kernel (Triton only). Glue:
                 `lngram_jax.pallas`, `lngram_jax.fused`.
  flip_scores    the one-bit surrogate's backward: scores of g against a
                 table row and its one-bit neighbours (row XOR 2^k), and the
                 scatter-add of g onto the row (atomics; Triton only, no
                 dispatching api: glue `lngram_jax.surrogate_pallas`).
  attention      causal attention within segments, for the decoder
                 (`experiments.models.attention`): splash on TPU, jax's Triton
                 flash attention on GPU, the XLA reference elsewhere; per
                 batch shard under a mesh.
  grouped_matmul the MoE's grouped matmul (`experiments.models.moe`): megablox
                 on TPU, Triton gmm/tgmm on GPU (where XLA computes ragged_dot
                 densely), XLA's ragged_dot on CPU.
  out_shapes     output shapes of a Pallas call that keep their inputs'
                 varying mesh axes (kernels run per shard inside shard_map).

The dispatching apis pick by the platform the program is lowered for, not by the
process that traces it. The ops are standalone: this package imports nothing from
`lngram_jax`, `pvm_jax` or `experiments`. The readout kernels are the core of
"Lngram v2: Latent N-Gram Memory with Interpretable Discrete Representations" (the
absorbed sink-attention readout, §2.4; v1: "Lngram: N-gram Conditional Memory in
Latent Space", arXiv 2605.24869). Conventions: DESIGN.md §2 (readout forms), §7
(testing kernels on CPU: interpret mode and lowering checks).

Shape legend (DESIGN.md §1): BT tokens (B·T flattened), R memory rows per token
(routes), Dr row width (the route-token width), Dm width of one table row,
Hq query heads. `python -m experiments.tools.bench.kernels` times the kernels
against XLA.
"""
