"""Pallas kernels of lngram_jax, each with an XLA reference and a dispatching api.

  sink_readout   the blocked sink-softmax readout: per token, Hq queries of
                 width D over R memory tokens (keys = values) plus one fixed
                 sink logit with a zero value (Triton on GPU, Mosaic on TPU,
                 interpret mode on CPU).

Shape legend: N tokens (B·T flattened), R routes, D route-token width,
Hq query heads. `python -m kernels.bench` times the kernels against XLA.
"""
