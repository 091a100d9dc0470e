"""Sampling text from an LM: byte (or a run's tokenizer) encoding, right-padded prompts,
the cap on new tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments.models.generate import generate


def cap_new_tokens(max_len: int, prompts: list[str], asked: int,
                   codec=None) -> tuple[int, str]:
  """(new tokens the model can hold after the longest prompt, a note if that is < asked);
  `codec`: a token-data run's text <-> ids (`encode`, `decode`, `unit`), None: bytes."""
  if asked < 1:
    raise ValueError(f"max_new_tokens={asked} must be >= 1.")
  unit = "bytes" if codec is None else codec.unit
  longest = max((codec or _BYTES).encode(p).size for p in prompts)
  room = max_len - longest
  if room < 1:
    raise ValueError(f"the prompt is {longest} {unit}, and the model holds at most "
                     f"max_len={max_len} tokens; use a shorter --prompt.")
  if asked <= room:
    return asked, ""
  return room, (f"max_new_tokens={asked} capped to {room}: the model holds max_len={max_len} "
                f"tokens and the longest prompt is {longest} {unit}.")


def encode(text: str) -> np.ndarray:
  """Byte tokens of a UTF-8 string: int32 [T]."""
  return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


def decode(tokens) -> str:
  """Text of byte tokens (invalid UTF-8 sequences are replaced); an id that is not a byte
  is refused (a model whose vocabulary is not 256 bytes needs its tokenizer)."""
  ids = np.asarray(tokens)
  if ids.size and (ids.min() < 0 or ids.max() > 255):
    raise ValueError(f"token id {int(ids.max() if ids.max() > 255 else ids.min())} is not a "
                     "byte: decoding bytes needs a model of 256 ids (give the run its "
                     "tokenizer.json).")
  return bytes(ids.astype(np.uint8).tolist()).decode("utf-8", errors="replace")


def sample_text(model, prompts: list[str], *, max_new_tokens: int, seed: int = 0,
                temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
                use_cache: bool = True, codec=None) -> list[str]:
  """Continues each prompt; prompts of unequal length are right-padded. `codec`: as
  for `cap_new_tokens` (None: byte tokens)."""
  if not prompts or any(not p for p in prompts):
    raise ValueError("sample_text: every prompt must be a non-empty string.")
  codec = codec or _BYTES
  encoded = [codec.encode(p) for p in prompts]
  vocab = int(model.config.vocab_size)
  for p, e in zip(prompts, encoded, strict=True):
    if e.size and int(e.max()) >= vocab:   # would index past the embedding: NaN logits
      raise ValueError(f"the prompt {p[:40]!r} encodes to id {int(e.max())}, outside the "
                       f"model's vocabulary of {vocab:,}: the tokenizer does not belong to "
                       "this model.")
  lengths = np.asarray([e.size for e in encoded], np.int32)
  tokens_BxT = np.zeros((len(encoded), lengths.max()), np.int32)
  for i, e in enumerate(encoded):
    tokens_BxT[i, :e.size] = e
  new_BxN = generate(model, jnp.asarray(tokens_BxT), prompt_lengths=jnp.asarray(lengths),
                     max_new_tokens=max_new_tokens, rng=jax.random.key(seed),
                     temperature=temperature, top_k=top_k, greedy=greedy, use_cache=use_cache)
  return [codec.decode(row) for row in np.asarray(new_BxN)]


class _Bytes:
  """The byte-level runs' codec: `encode` / `decode` above."""

  unit = "bytes"
  encode = staticmethod(encode)
  decode = staticmethod(decode)


_BYTES = _Bytes()
