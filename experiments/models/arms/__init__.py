"""The comparison arms of the Lngram v2 paper, each a memory-slot branch.

  pkm         Product Key Memory ("Large Memory Layers with Product Keys",
              arXiv 1907.05242), optional gated "memory+" output
  engram      hashed token n-gram memory ("Conditional Memory via Scalable
              Lookup", arXiv 2601.07372)
  lngram_v1   single-table Lngram v1 ("Lngram: N-gram Conditional Memory in
              Latent Space", arXiv 2605.24869)
  sparse_ffn  the parameter-matched top-1 sparse SwiGLU (Lngram v2 paper §4.1)

Each module defines NAME, SLOT, CONFIG, MODULE and `param_count(config)`;
experiments/models/branches.py registers them.
"""
