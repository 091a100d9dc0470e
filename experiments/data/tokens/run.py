"""A training run on token data (`data.kind="tokens"`): the data checked against the run.

    data = run_data(config, workdir, rows=None, record=True)
    data.batches, data.val_batches, data.vocab_size

The model's vocabulary is the manifest's unless the config sets one
(`model.vocab_size` > 0), which must then hold every id of the tokenizer. The
run directory keeps `token_data.json` (the data directory, its tokenizer and
digest) and a copy of the tokenizer; a resumed run refuses data of another
tokenizer, and data whose shards changed unless `data.allow_corpus_change`
(the byte corpus's rule, experiments/data/corpus.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np

from experiments.data import validation
from experiments.data.corpus import saved_steps
from experiments.data.tokens.format import (
    TokenDataError,
    check_tokenizer,
    write_json_atomic,
)
from experiments.data.tokens.rows import TokenBatches, TokenCorpus, token_eval_batches
from experiments.data.tokens.tokenizer import FILE as TOKENIZER_FILE
from experiments.data.tokens.tokenizer import Codec, describe
from experiments.trainer import durable

log = logging.getLogger("experiments")

KINDS = ("bytes", "tokens")
RECORD = "token_data.json"


def data_kind(config) -> str:
  kind = config.data.get("kind", "bytes") or "bytes"
  if kind not in KINDS:
    raise ValueError(f"data.kind={kind!r} is not one of {KINDS}.")
  if kind == "tokens" and not config.data.get("path"):
    raise ValueError("data.kind='tokens' needs data.path=<a directory written by "
                     "`lngram-exp prepare-data`>.")
  return kind


def vocab_size(manifest: dict, configured: int, path: str) -> int:
  """The model's vocabulary: the manifest's, or `configured` if set and large enough."""
  needed = int(manifest["tokenizer"]["vocab_size"])
  if not configured:
    return needed
  if int(configured) < needed:
    raise TokenDataError(
        f"model.vocab_size={configured} cannot hold the ids of data.path={path!r}, whose "
        f"tokenizer has {needed}; set model.vocab_size >= {needed} or 0 (the data's).")
  return int(configured)


def model_vocab(model_config, vocab: int):
  """`model_config` (an LMConfig) with the data's vocabulary; refuses a memory or FFN
  branch whose own `vocab_size` (Engram's n-gram hash) cannot hold its ids."""
  for slot in ("memory", "ffn_branch"):
    branch = getattr(model_config, slot, None)
    own = getattr(branch, "vocab_size", None)
    if own is not None and own < vocab:
      raise TokenDataError(
          f"model.{slot}.vocab_size={own} cannot hold the data's {vocab} token ids; set "
          f"--config.model.{slot}.vocab_size={vocab}.")
    if getattr(branch, "case_fold", False):   # Engram folds the byte ids of A-Z
      raise TokenDataError(
          f"model.{slot}.case_fold=True folds byte ids, which token ids are not; set "
          f"--config.model.{slot}.case_fold=false for token data.")
  return model_config.replace(vocab_size=vocab)


@dataclasses.dataclass
class RunData:
  corpus: TokenCorpus
  batches: TokenBatches
  val_batches: list
  vocab_size: int
  val_names: tuple[str, ...] | None = None   # per-document validation set: its documents

  @property
  def description(self) -> str:
    m = self.corpus.manifest
    return (f"token data {m['train_tokens']} train / {m['val_tokens']} validation tokens "
            f"({m['docs']} documents, vocabulary {m['tokenizer']['vocab_size']})")


def run_data(config, workdir, *, rows: tuple[int, int] | None = None,
             record: bool = True) -> RunData:
  """The token data of a run: checked against the run directory (and recorded there
  when `record`, process 0), its training batches (`rows`: this process's rows of each
  batch) and validation batches."""
  dc = config.data
  corpus = TokenCorpus(dc.path)
  allow_change = bool(dc.get("allow_corpus_change", False))
  vocab = vocab_size(corpus.manifest, config.model.get("vocab_size", 0), dc.path)
  check_run(corpus, workdir, allow_change=allow_change)
  if config.get("init_from", ""):
    check_init_from(corpus, config.init_from)
  if record:
    record_run(corpus, workdir)
  batches = TokenBatches(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size, seed=dc.seed,
                         rows=rows, allow_data_change=allow_change)
  val, names = val_batches(corpus, dc)
  return RunData(corpus, batches, val, vocab, names)


def val_doc_names(corpus: TokenCorpus) -> list[str]:
  """A name per validation document: its input file (the shard's source), and its
  index among that shard's validation documents when the shard holds several."""
  docs, shards = corpus.val_docs, corpus.manifest["shards"]
  counts = np.bincount(docs.shard_D, minlength=len(shards)) if len(docs) else []
  seen: dict[int, int] = {}
  names = []
  for k in docs.shard_D.tolist():
    j = seen[k] = seen.get(k, -1) + 1
    names.append(shards[k]["source"] + (f"#{j}" if counts[k] > 1 else ""))
  return names


def val_batches(corpus: TokenCorpus, dc, max_batches: int | None = None):
  """(validation batches, document names or None) of a data config: the per-document
  set when `data.val_doc_cap` > 0 (experiments/data/validation.py), else the first
  `eval_batches` batches of the split in manifest order. A split without a
  document of two tokens (nothing to predict) is refused with the remedy."""
  docs = corpus.val_docs
  if not (np.asarray(docs.length_D) >= 2).any():
    raise TokenDataError(
        f"data.path={str(corpus.root)!r}: its validation split holds {len(docs)} document(s) "
        "and none of two tokens or more; prepare the data again with a larger --val_fraction "
        f"(it was {corpus.manifest['split']['val_fraction']}) or more documents.")
  return validation.config_batches(
      corpus.val_docs, val_doc_names(corpus), dc, max_batches=max_batches,
      default=lambda: token_eval_batches(corpus, seq_len=dc.seq_len,
                                         batch_size=dc.batch_size,
                                         max_batches=max_batches or dc.eval_batches))


def _record(corpus: TokenCorpus) -> dict:
  m = corpus.manifest
  return {"path": str(corpus.root.resolve()), "format_version": m["format_version"],
          "tokenizer": m["tokenizer"], "shards_sha256": m["shards_sha256"],
          "docs": m["docs"], "tokens": m["tokens"]}


def check_run(corpus: TokenCorpus, workdir, *, allow_change: bool = False) -> None:
  """Refuses, on resume, token data of another tokenizer than the run's (always) or
  with other shards (unless `allow_change`)."""
  path = Path(workdir) / RECORD
  steps = saved_steps(workdir)
  if not steps or not path.is_file():
    return
  old = durable.read_json(path, "token-data record")
  check_tokenizer(corpus.manifest, old["tokenizer"]["sha256"], old["tokenizer"]["vocab_size"],
                  what=f"this run's (checkpoints up to step {steps[-1]})")
  if old["shards_sha256"] != corpus.digest and not allow_change:
    raise TokenDataError(
        f"data: the token data in {corpus.root} differs from the data this run's checkpoints "
        f"(up to step {steps[-1]}) were trained on ({old['docs']} -> "
        f"{corpus.manifest['docs']} documents); resume on the same data, use a new "
        "--workdir, or pass --config.data.allow_corpus_change=true.")


def check_init_from(corpus: TokenCorpus, source: str) -> None:
  """Refuses to start from a run (or `hf:DIR` checkpoint) whose embeddings belong to
  another tokenizer's ids: its token-data record, else its tokenizer.json, else it is
  a byte-level run (the "bytes" tokenizer). `hf:org/name` is the hub snapshot the
  run starts from (experiments/hf/hub.py), never a relative path that is not there."""
  what = "the init_from run's"
  if str(source).startswith("hf:"):
    from experiments.hf.hub import resolve_checkpoint
    what = f"the init_from checkpoint {source}'s"
    source = resolve_checkpoint(str(source).removeprefix("hf:"))
  source = Path(source)
  if (source / RECORD).is_file():
    tok = durable.read_json(source / RECORD, "token-data record")["tokenizer"]
  elif (source / TOKENIZER_FILE).is_file():
    tok = describe(str(source)).to_json()
  else:
    tok = {"sha256": "bytes", "vocab_size": 256}
  check_tokenizer(corpus.manifest, tok["sha256"], tok["vocab_size"], what=what)


def record_run(corpus: TokenCorpus, workdir) -> None:
  """Writes `token_data.json` and a copy of the tokenizer into the run directory."""
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  path = workdir / RECORD
  if path.is_file():
    old = durable.read_json(path, "token-data record")
    if old["shards_sha256"] != corpus.digest and saved_steps(workdir):
      kept = path.with_name(f"token_data.{saved_steps(workdir)[-1]}.json")
      os.replace(path, kept)
      log.warning("data: the token data changed (allowed by data.allow_corpus_change); "
                  "the old record is kept in %s.", kept.name)
  write_json_atomic(path, _record(corpus))
  source = corpus.root / TOKENIZER_FILE
  if source.is_file():
    durable.copy_file(source, workdir / TOKENIZER_FILE)


def eval_data(config, workdir, max_batches: int | None = None) -> list:
  """Validation batches of a saved run's token data (`lngram-exp eval`), refused if
  the data directory now holds another tokenizer's tokens."""
  dc = config.data
  corpus = TokenCorpus(dc.path)
  path = Path(workdir) / RECORD
  if path.is_file():
    run = durable.read_json(path, "token-data record")["tokenizer"]
    check_tokenizer(corpus.manifest, run["sha256"], run["vocab_size"], what="this run's")
  return val_batches(corpus, dc, max_batches)[0]


class _ByteIds:
  """Token data prepared with "bytes": ids are UTF-8 bytes (no tokenizer.json)."""

  unit = "tokens"

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    return bytes(np.asarray(ids, np.uint8).tolist()).decode("utf-8", errors="replace")


def run_codec(workdir):
  """Text <-> ids of a token-data run, from the tokenizer it keeps (`record_run`)."""
  if (Path(workdir) / TOKENIZER_FILE).is_file():
    return Codec(str(workdir))
  record = Path(workdir) / RECORD
  if record.is_file() and durable.read_json(record, "token-data record")["tokenizer"]["kind"] == "bytes":
    return _ByteIds()
  raise TokenDataError(f"{workdir} was trained on token data but holds no {TOKENIZER_FILE} "
                       f"(nor {RECORD}); copy the data's tokenizer.json there to sample.")
