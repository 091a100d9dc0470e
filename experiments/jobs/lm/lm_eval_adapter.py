"""lm-evaluation-harness over a restored LM: `make_lm(model, codec)` is an `lm_eval` model.

    import lm_eval
    from experiments.jobs.lm.lm_eval_adapter import make_lm
    lm = make_lm(model, codec, batch_size=8)      # model: a DecoderLM with its weights
    results = lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])

`lngram-exp lm-eval` (experiments/cli/commands/lm_eval.py) restores a run and does
this. The class (`LngramLM`, a subclass of `lm_eval.api.model.LM`) is built on first
use, so this module imports without lm_eval; using it without lm_eval installed raises
a one-line error naming the extra (`pip install 'lngram-jax[eval]'`).

The three request types, as lm-eval's `LM` documents them:
  loglikelihood          (context, continuation) -> (sum of the continuation tokens'
                         log-probabilities given the context, whether each of them is
                         the argmax). Encoded as lm-eval's causal models do: trailing
                         spaces of the context move to the continuation, the
                         continuation is `encode(context + continuation)` past
                         `len(encode(context))`, an empty context is the prefix token.
                         A row longer than max_len + 1 tokens loses its oldest
                         context tokens (left truncation); a continuation longer than
                         max_len is refused.
  loglikelihood_rolling  (text,) -> its log-probability after the prefix token, in
                         disjoint windows of max_len predicted tokens, each with as
                         much context as fits (`lm_eval.utils.get_rolling_token_windows`
                         with context_len 1).
  generate_until         (context, gen_kwargs) -> the continuation, greedy unless
                         gen_kwargs ask for `do_sample` with a temperature > 0, of at
                         most `max_gen_toks` tokens (default 256, capped to max_len - 1),
                         cut before the first `until` string and before a stop token
                         (the run's EOS). The context keeps its last max_len -
                         max_gen_toks tokens. The project's own sampler
                         (experiments/models/generate.py) draws all max_gen_toks
                         tokens (one compiled scan per padded shape), then they are cut.

Scoring runs `batch_size` rows at a time through one jitted forward per padded shape:
rows are right-padded (marked invalid) to the smallest of a few bucket lengths (powers
of two from 16, and max_len) and a short last batch is filled with one-token dummy rows,
so a whole evaluation compiles at most once per bucket. The [B, T, V] logits are never
whole: the blocks' output is projected a chunk of positions at a time
(`cross_entropy.default_chunk`). Rows are sorted by length so that a batch is of
similar rows; answers come back in request order.

The prefix token (what an empty context, and the first window of a rolling request,
conditions on) is lm-eval's BOS-or-EOS; `lngram-exp lm-eval` passes the run's BOS
(an imported Hugging Face model's), else its EOS; without either (a byte-level run)
it is the first token of "\\n" (byte 10).
"""

from __future__ import annotations

import functools
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.models.cross_entropy import default_chunk

log = logging.getLogger(__name__)

EXTRA = "pip install 'lngram-jax[eval]'"
MIN_BUCKET = 16
DEFAULT_MAX_GEN_TOKS = 256   # lm-eval's default for generate_until


def require_lm_eval():
  """The `lm_eval` module, or a one-line ModuleNotFoundError naming the extra."""
  try:
    import lm_eval
    import lm_eval.api.model  # noqa: F401
  except ModuleNotFoundError as e:
    if e.name is None or e.name.split(".")[0] != "lm_eval":
      raise
    raise ModuleNotFoundError(
        f"lm-eval needs the optional package lm-evaluation-harness ({EXTRA}).") from None
  return lm_eval


def buckets_for(max_len: int) -> tuple[int, ...]:
  """Padded row lengths: powers of two from MIN_BUCKET below max_len, and max_len."""
  out, b = [], MIN_BUCKET
  while b < max_len:
    out.append(b)
    b *= 2
  return (*out, max_len)


class _Bytes:
  """Byte-level runs: ids are the UTF-8 bytes."""

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    return bytes(np.asarray(ids, np.uint8).tolist()).decode("utf-8", errors="replace")


class _Methods:
  """What `LngramLM` adds to lm-eval's `LM` (see the module docstring)."""

  def _setup(self, model, codec=None, *, batch_size: int = 1, prefix_token_id: int | None = None,
             stop_ids: tuple[int, ...] = (), buckets: tuple[int, ...] | None = None,
             seed: int = 0, use_cache: bool = True):
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
      raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1.")
    self.model = model
    self.codec = codec or _Bytes()
    self.max_length = int(model.config.max_len)
    self.vocab_size = int(model.config.vocab_size)
    if codec is None and self.vocab_size != 256:
      raise ValueError(f"a model of {self.vocab_size:,} ids is not a byte-level model: "
                       "pass its tokenizer's codec.")
    self.batch_size = batch_size
    if prefix_token_id is None:   # "\n": where a document of the corpus starts
      newline = np.asarray(self.codec.encode("\n")).tolist()
      prefix_token_id = newline[0] if newline else 0
    self.prefix_token_id = int(prefix_token_id)
    if not 0 <= self.prefix_token_id < self.vocab_size:
      raise ValueError(f"prefix_token_id={self.prefix_token_id} is outside the model's "
                       f"vocabulary of {self.vocab_size:,}.")
    self.stop_ids = tuple(int(i) for i in stop_ids)
    self.buckets = tuple(sorted(set(buckets or buckets_for(self.max_length))))
    if self.buckets[-1] < self.max_length:
      self.buckets = (*self.buckets, self.max_length)
    self.seed = seed
    self.use_cache = use_cache
    self._graphdef, self._state = nnx.split(model)
    self._warned = set()

  # --- encoding --------------------------------------------------------------

  def tok_encode(self, text: str) -> list[int]:
    """Token ids of `text` (none for ""); an id outside the model's vocabulary is refused."""
    if not text:
      return []
    try:
      encoded = self.codec.encode(text)
    except ValueError:   # an imported model's codec refuses text of no tokens (" ")
      if not text.isspace():
        raise
      encoded = []
    ids = [int(i) for i in np.asarray(encoded, np.int64).reshape(-1).tolist()]
    if ids and max(ids) >= self.vocab_size:
      raise ValueError(f"{text[:40]!r} encodes to id {max(ids)}, outside the model's "
                       f"vocabulary of {self.vocab_size:,}: the tokenizer does not belong "
                       "to this model.")
    return ids

  def tok_decode(self, ids) -> str:
    return self.codec.decode(np.asarray(list(ids), np.int32))

  def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of a loglikelihood request (lm-eval's convention)."""
    if not context:
      cont = self.tok_encode(continuation)
      if cont and cont[0] == self.prefix_token_id:
        return cont[:1], cont[1:]
      return [self.prefix_token_id], cont
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
      context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = self.tok_encode(context + continuation)
    ctx = self.tok_encode(context)
    return ctx or [self.prefix_token_id], whole[len(ctx):]

  # --- lm-eval's three request types -------------------------------------------

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    pairs = [self.encode_pair(*req.args[:2]) for req in requests]
    results = self.score_pairs(pairs, disable_tqdm=disable_tqdm, desc="loglikelihood")
    for req, result in zip(requests, results, strict=True):
      self._cache("loglikelihood", req.args, result)
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    windows, owner = [], []
    for i, req in enumerate(requests):
      ids = self.tok_encode(req.args[0])
      for window in get_rolling_token_windows(token_list=ids, prefix_token=self.prefix_token_id,
                                              max_seq_len=self.max_length, context_len=1):
        windows.append(make_disjoint_window(window))
        owner.append(i)
    totals = [0.0] * len(requests)
    scores = self.score_pairs(windows, disable_tqdm=disable_tqdm, desc="loglikelihood_rolling")
    for i, (logprob, _) in zip(owner, scores, strict=True):
      totals[i] += logprob
    for req, total in zip(requests, totals, strict=True):
      self._cache("loglikelihood_rolling", req.args, total)
    return totals

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    from tqdm import tqdm
    out = [None] * len(requests)
    groups = {}   # requests of equal gen_kwargs share a sampler
    for i, req in enumerate(requests):
      kwargs = dict(req.args[1]) if len(req.args) > 1 and req.args[1] else {}
      groups.setdefault(json.dumps(kwargs, sort_keys=True, default=str), []).append(i)
    bar = tqdm(total=len(requests), desc="generate_until", disable=disable_tqdm)
    for n_group, (key, members) in enumerate(groups.items()):
      sampler = self._sampler(json.loads(key))
      contexts = {i: self.tok_encode(requests[i].args[0]) or [self.prefix_token_id]
                  for i in members}
      members = sorted(members, key=lambda i: -len(contexts[i]))
      for n_batch, start in enumerate(range(0, len(members), self.batch_size)):
        batch = members[start:start + self.batch_size]
        rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), n_group), n_batch)
        texts = self._generate([contexts[i] for i in batch], sampler, rng)
        for i, text in zip(batch, texts, strict=True):
          out[i] = text
          self._cache("generate_until", requests[i].args, text)
        bar.update(len(batch))
    bar.close()
    return out

  # --- scoring -------------------------------------------------------------------

  def score_pairs(self, pairs, *, disable_tqdm: bool = True, desc: str = "scoring"
                  ) -> list[tuple[float, bool]]:
    """(log-probability, is greedy) of each (context ids, continuation ids) pair."""
    from tqdm import tqdm
    L = self.max_length
    for ctx, cont in pairs:
      if len(cont) > L:
        raise ValueError(f"a continuation of {len(cont)} tokens is longer than the model's "
                         f"max_len={L}: it cannot be scored.")
      if not ctx:
        raise ValueError("a loglikelihood request needs at least one context token.")
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    results = [None] * len(pairs)
    for start in tqdm(range(0, len(order), self.batch_size), desc=desc, disable=disable_tqdm):
      batch = order[start:start + self.batch_size]
      rows = []
      for i in batch:
        ctx, cont = pairs[i]
        whole = (ctx + cont)[-(L + 1):]   # left truncation
        rows.append((whole[:-1], whole[1:], len(cont)))
      logp_BxT, greedy_BxT = self._score_rows(rows)
      for j, (i, (inputs, _, n_cont)) in enumerate(zip(batch, rows, strict=True)):
        span = slice(len(inputs) - n_cont, len(inputs))
        results[i] = (float(np.sum(logp_BxT[j, span], dtype=np.float64)),
                      bool(np.all(greedy_BxT[j, span])))
    return results

  def _score_rows(self, rows):
    """Per-position (target log-probability, target is the argmax) [B, T] numpy arrays of
    rows (inputs, targets, _), right-padded to a bucket and to `batch_size` rows."""
    B, T = self.batch_size, self._bucket(max(len(inputs) for inputs, _, _ in rows))
    tokens_BxT = np.zeros((B, T), np.int32)
    targets_BxT = np.zeros((B, T), np.int32)
    valid_BxT = np.zeros((B, T), bool)
    valid_BxT[:, 0] = True   # the filler rows: one real token each
    for j, (inputs, targets, _) in enumerate(rows):
      tokens_BxT[j, :len(inputs)] = inputs
      targets_BxT[j, :len(targets)] = targets
      valid_BxT[j, :len(inputs)] = True
    chunk = default_chunk(B, T, self.vocab_size)
    logp_BxT, greedy_BxT = _token_scores(self._graphdef, self._state, jnp.asarray(tokens_BxT),
                                         jnp.asarray(valid_BxT), jnp.asarray(targets_BxT),
                                         chunk=chunk)
    return np.asarray(logp_BxT), np.asarray(greedy_BxT)

  def _bucket(self, n: int) -> int:
    return next(b for b in self.buckets if b >= n)

  # --- generation ----------------------------------------------------------------

  def _sampler(self, kwargs: dict) -> dict:
    """until, max_gen_toks and the draw of a request's gen_kwargs."""
    until = kwargs.pop("until", None)
    until = [] if until is None else [until] if isinstance(until, str) else list(until)
    if not all(isinstance(s, str) for s in until):
      raise ValueError(f"generate_until: until={until!r} must be a string or a list of them.")
    given = [kwargs.pop(k, None) for k in ("max_gen_toks", "max_new_tokens", "max_tokens")]
    max_gen = int(next((v for v in given if v is not None), DEFAULT_MAX_GEN_TOKS))
    if max_gen < 1:
      raise ValueError(f"generate_until: max_gen_toks={max_gen} must be >= 1.")
    if max_gen > self.max_length - 1:
      self._warn_once(f"generate_until: max_gen_toks={max_gen} capped to "
                      f"{self.max_length - 1} (the model holds max_len={self.max_length}).")
      max_gen = self.max_length - 1
    temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
    do_sample = bool(kwargs.pop("do_sample", False)) and temperature > 0
    top_k = kwargs.pop("top_k", None)
    ignored = sorted(kwargs)
    if ignored:
      self._warn_once(f"generate_until: gen_kwargs {ignored} are not used.")
    return {"until": until, "max_new_tokens": max_gen, "greedy": not do_sample,
            "temperature": temperature if do_sample else 1.0,
            "top_k": int(top_k) if do_sample and top_k else None}

  def _generate(self, contexts: list[list[int]], sampler: dict, rng) -> list[str]:
    from experiments.models.generate import generate
    new = sampler["max_new_tokens"]
    room = self.max_length - new
    contexts = [ids[-room:] for ids in contexts]   # left truncation
    T = min(self._bucket(max(len(ids) for ids in contexts)), room)
    B = self.batch_size
    tokens_BxT = np.zeros((B, T), np.int32)
    lengths_B = np.ones((B,), np.int32)   # filler rows: one token
    for j, ids in enumerate(contexts):
      tokens_BxT[j, :len(ids)] = ids
      lengths_B[j] = len(ids)
    new_BxN = generate(self.model, jnp.asarray(tokens_BxT), prompt_lengths=jnp.asarray(lengths_B),
                       max_new_tokens=new, rng=rng, temperature=sampler["temperature"],
                       top_k=sampler["top_k"], greedy=sampler["greedy"],
                       use_cache=self.use_cache)
    return [self._finish(row, sampler["until"]) for row in np.asarray(new_BxN)[:len(contexts)]]

  def _finish(self, ids, until: list[str]) -> str:
    """The text of new ids, cut before the first stop token and the first `until` string."""
    ids = [int(i) for i in ids]
    cut = next((n for n, i in enumerate(ids) if i in self.stop_ids), len(ids))
    text = self.tok_decode(ids[:cut])
    for stop in until:
      if stop:
        text = text.split(stop, 1)[0]
    return text

  # --- lm-eval plumbing ------------------------------------------------------------

  def _cache(self, kind: str, args, result) -> None:
    hook = getattr(self, "cache_hook", None)
    if hook is not None:
      hook.add_partial(kind, args, result)

  def _warn_once(self, message: str) -> None:
    if message not in self._warned:
      self._warned.add(message)
      log.warning(message)

  @property
  def tokenizer_name(self) -> str:
    return type(self.codec).__name__


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk"))
def _token_scores(graphdef, state, tokens_BxT, valid_BxT, targets_BxT, *, chunk: int):
  """(log-probability of each target, whether it is the argmax) [B, T], without the whole
  [B, T, V] logits: the output projection runs `chunk` positions at a time."""
  model = nnx.merge(graphdef, state)
  hidden_BxTxD = model(tokens_BxT, valid=valid_BxT, return_hidden=True)
  B, T, D = hidden_BxTxD.shape
  n = -(-T // chunk)
  pad = n * chunk - T
  h_NxBxCxD = jnp.pad(hidden_BxTxD, ((0, 0), (0, pad), (0, 0))).reshape(
      B, n, chunk, D).swapaxes(0, 1)
  t_NxBxC = jnp.pad(targets_BxT, ((0, 0), (0, pad))).reshape(B, n, chunk).swapaxes(0, 1)

  def one(args):
    h_BxCxD, t_BxC = args
    logits_BxCxV = model.logits(h_BxCxD).astype(jnp.float32)
    target_BxC = jnp.take_along_axis(logits_BxCxV, t_BxC[..., None], axis=-1)[..., 0]
    logp_BxC = target_BxC - jax.nn.logsumexp(logits_BxCxV, axis=-1)
    return logp_BxC, jnp.argmax(logits_BxCxV, axis=-1) == t_BxC

  logp_NxBxC, greedy_NxBxC = jax.lax.map(one, (h_NxBxCxD, t_NxBxC))
  logp_BxT = logp_NxBxC.swapaxes(0, 1).reshape(B, n * chunk)[:, :T]
  greedy_BxT = greedy_NxBxC.swapaxes(0, 1).reshape(B, n * chunk)[:, :T]
  return logp_BxT, greedy_BxT


@functools.cache
def adapter_class():
  """`LngramLM`: lm-eval's `LM` with the methods above (built once, on first use)."""
  require_lm_eval()
  from lm_eval.api.model import LM

  class LngramLM(_Methods, LM):
    """An lm-eval model over a restored DecoderLM and its codec (module docstring).

    Args:
      model: a `DecoderLM` with its weights.
      codec: text <-> ids (`encode`, `decode`) of the model's tokenizer; None: bytes.
      batch_size: rows per forward (and per generation).
      prefix_token_id: what an empty context conditions on (default: the first id of "\\n").
      stop_ids: token ids that end a generation (the run's EOS).
      buckets: padded row lengths (default: powers of two from 16, and max_len).
      seed: the generation key when gen_kwargs ask for sampling.
      use_cache: generate with the KV cache (the fast path).
    """

    def __init__(self, model, codec=None, **kwargs):
      LM.__init__(self)
      self._setup(model, codec, **kwargs)

  LngramLM.__module__ = __name__
  LngramLM.__qualname__ = "LngramLM"
  return LngramLM


def make_lm(model, codec=None, **kwargs):
  """An `LngramLM` (an `lm_eval.api.model.LM`) over `model`; kwargs: see `LngramLM`."""
  return adapter_class()(model, codec, **kwargs)


def __getattr__(name: str):
  if name == "LngramLM":
    return adapter_class()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
