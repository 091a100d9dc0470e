"""Evaluating and sampling a finished (or running) run from its checkpoint."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments.checkpoint.restore import restore_module
from experiments.data.corpus import corpus_spec
from experiments.models.generate import generate


def evaluate_run(workdir, *, step: int | None = None, max_batches: int | None = None) -> dict:
  """Validation bits per byte (and Lngram metrics) of a checkpoint in `workdir`.

  Data settings come from the run's saved config; `max_batches` overrides
  data.eval_batches. An LM command: a VLM run is evaluated by `analyze`.
  """
  return evaluate_checkpoint(workdir, step=step, max_batches=max_batches)[0]


def evaluate_checkpoint(workdir, *, step: int | None = None, max_batches: int | None = None,
                        mesh: dict | None = None) -> tuple[dict, int]:
  """(`evaluate_run`'s metrics, the checkpoint step they come from).

  `mesh`: a `mesh` block ({"data": 2, "table": 4}; experiments/train/mesh.py) to
  evaluate on a device mesh, as training does; None: one device.
  """
  import ml_collections

  from experiments.data import eval_batches, load_corpus  # needs grain
  from experiments.train.lm_task import evaluate_model

  model, saved, used_step = restore_module(workdir, step)
  require_lm(saved, workdir, "eval")
  config = ml_collections.ConfigDict(saved["experiment"])
  dc = config.data
  corpus = load_corpus(corpus_spec(config))
  batches = eval_batches(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size,
                         max_batches=max_batches or dc.eval_batches)
  if not mesh:
    return evaluate_model(model, batches), used_step
  from experiments.models import layout
  from experiments.train import mesh as mesh_lib
  device_mesh = mesh_lib.make_train_mesh(mesh)
  memory = model.config.memory
  mesh_lib.check_fits(device_mesh, batch_size=dc.batch_size, seq_len=dc.seq_len,
                      memory=memory, lngram_halo=_lngram_halo(memory))
  mesh_lib.place_model(model, device_mesh)
  with layout.use(device_mesh):
    return evaluate_model(model, batches), used_step


def _lngram_halo(memory) -> int:
  """How far Lngram's n-gram windows and conv reach back (0 for other branches)."""
  if hasattr(memory, "max_order") and hasattr(memory, "conv_context"):
    return max(memory.max_order - 1, memory.conv_context)
  return 0


def cap_new_tokens(max_len: int, prompts: list[str], asked: int) -> tuple[int, str]:
  """(new tokens the model can hold after the longest prompt, a note if that is < asked)."""
  if asked < 1:
    raise ValueError(f"max_new_tokens={asked} must be >= 1.")
  longest = max(encode(p).size for p in prompts)
  room = max_len - longest
  if room < 1:
    raise ValueError(f"the prompt is {longest} bytes, and the model holds at most "
                     f"max_len={max_len} tokens; use a shorter --prompt.")
  if asked <= room:
    return asked, ""
  return room, (f"max_new_tokens={asked} capped to {room}: the model holds max_len={max_len} "
                f"tokens and the longest prompt is {longest} bytes.")


def require_lm(saved: dict, workdir, command: str) -> None:
  """`eval` and `sample` read text runs; a VLM run says so clearly."""
  if saved.get("kind", "lm") != "lm":
    raise ValueError(
        f"lngram-exp {command} is an LM command, and {workdir} is a VLM run; use "
        f"`lngram-exp analyze --workdir={workdir}` (accuracy by length, attention decay, "
        "LogitLens, grounding) instead.")


def encode(text: str) -> np.ndarray:
  """Byte tokens of a UTF-8 string: int32 [T]."""
  return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


def decode(tokens) -> str:
  """Text of byte tokens (invalid UTF-8 sequences are replaced)."""
  return bytes(np.asarray(tokens, np.uint8).tolist()).decode("utf-8", errors="replace")


def sample_text(model, prompts: list[str], *, max_new_tokens: int, seed: int = 0,
                temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
                use_cache: bool = True) -> list[str]:
  """Continues each prompt; prompts of unequal length are right-padded."""
  if not prompts or any(not p for p in prompts):
    raise ValueError("sample_text: every prompt must be a non-empty string.")
  encoded = [encode(p) for p in prompts]
  lengths = np.asarray([e.size for e in encoded], np.int32)
  tokens_BxT = np.zeros((len(encoded), lengths.max()), np.int32)
  for i, e in enumerate(encoded):
    tokens_BxT[i, :e.size] = e
  new_BxN = generate(model, jnp.asarray(tokens_BxT), prompt_lengths=jnp.asarray(lengths),
                     max_new_tokens=max_new_tokens, rng=jax.random.key(seed),
                     temperature=temperature, top_k=top_k, greedy=greedy, use_cache=use_cache)
  return [decode(row) for row in np.asarray(new_BxN)]
