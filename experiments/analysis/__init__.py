"""Reading the Lngram IDs of a trained LM: the Lngram v2 paper's §3 and App. B/C analyses.

Position records (`records`) hold, for sampled byte positions of reference
and held-out files (token positions of a run on token data: `token_docs`),
each Lngram layer's input h, router logits z and codes, the file, nuisance
and surface features, and semantic targets taken from the
Python source itself (`targets`: tokenize and ast). The analyses read them:
utilisation (Table 9), ID-KNN readers (Table 1), single-code associations
(App. C.2), distributed semantics (App. C.3), address stability across
checkpoints (App. B.2) and injection / propagation (App. B.3). `run.analyze_lm`
runs them on a run directory (`lngram-exp analyze` on an LM run).
"""
