"""`sample_checkpoint`: continue prompts with a saved LM run, in one call.

    from experiments.sampling import sample_checkpoint
    texts, step, note = sample_checkpoint("runs/lm_lngram", ["def "], max_new_tokens=50)

What `lngram-exp sample` prints, for a notebook: the run is restored (the
newest readable step, or `step`), optionally placed on a device mesh, and the
number of new bytes is capped to what the model holds after the longest prompt
(`note` says so when it is).
"""

from __future__ import annotations


def sample_checkpoint(workdir, prompts: list[str], *, step: int | None = None,
                      mesh: dict | None = None, max_new_tokens: int = 200, seed: int = 0,
                      temperature: float = 0.8, top_k: int | None = None,
                      greedy: bool = False, use_cache: bool = True
                      ) -> tuple[list[str], int, str]:
  """(the continuation of each prompt, the checkpoint step used, a note or "").

  `mesh`: a `mesh` block ({"data": 2, "table": 4}) to sample on a device mesh;
  None: one device. Raises a one-line ValueError for a VLM run, a prompt the
  model cannot hold, or prompts that are empty or not UTF-8 text.
  """
  from experiments.preflight import check_prompts
  from experiments.tasks.evaluate import require_lm
  from experiments.tasks.restore import restore_module
  from experiments.tasks.sample import cap_new_tokens, sample_text
  prompts = check_prompts(list(prompts))
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
  if mesh:
    from experiments.trainer.placement import make_train_mesh
    device_mesh = make_train_mesh(mesh)   # a bad block fails here, before the restore
  model, saved, step = restore_module(workdir, step)
  require_lm(saved, workdir, "sample")
  codec = None
  if saved.get("experiment", {}).get("data", {}).get("kind") == "tokens":
    from experiments.data.tokens.run import run_codec
    codec = run_codec(workdir)   # the run's own copy of its tokenizer
  else:
    from experiments.hf.tokenizer import hf_codec
    codec = hf_codec(workdir)    # import-hf: the checkpoint's tokenizer.json and EOS ids
  vocab = int(model.config.vocab_size)
  if codec is None and vocab != 256:
    # Bytes would be read as this vocabulary's ids: a run imported without its tokenizer.
    raise ValueError(f"{workdir} holds no tokenizer.json and its model's vocabulary is "
                     f"{vocab:,} ids, not 256 bytes: copy the checkpoint's tokenizer.json "
                     "into the run directory to sample.")
  if mesh:
    from experiments.models.layout import placement_rules
    from experiments.trainer.placement import place_model
    place_model(model, device_mesh, rules=placement_rules(model))
  max_new, note = cap_new_tokens(model.config.max_len, prompts, max_new_tokens, codec)
  texts = sample_text(model, prompts, max_new_tokens=max_new, seed=seed,
                      temperature=temperature, top_k=top_k, greedy=greedy,
                      use_cache=use_cache, codec=codec)
  return texts, step, note
