"""The near-duplicate sensitivity analysis: every recorded run re-scored without the
validation documents that have a near-duplicate in its setting's training split.

Declared in Reproductions v3, after the runs: a sensitivity analysis beside the main
table, not a replacement of it. The rule is experiments/data/dedup.py's (equal content
hashes of normalised lines: comments, blank lines and indentation dropped, every string
literal `""` and number `0`), applied by `experiments.data.validation.near_duplicates`, to
the data each setting's runs read:

  bytes   the embedded corpus's validation files against its training files (the split
          of `repro_lm.py:bytes`'s data config);
  tokens  the token data's validation documents against its training documents: the same
          corpus files exported (`reproduce.export_corpus`), split by prepare-data's rule
          (experiments/data/tokens/prepare.py `is_validation_doc` at
          `reproduce.TOKEN_VAL_FRACTION`; one document per file).

The sets are computed from the data, never typed, and checked against the records: the
validation set recomputed here must be the one every run of the setting scored (its
`eval_per_doc.json` names), and the byte corpus's content hash the one the records carry;
a setting that fails a check is not re-scored and says why. Each run's per-document
losses (nats summed over a document's targets, and their count) give its bits per unit
over the documents kept exactly (`validation.rescore`'s sum): no retraining.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from types import SimpleNamespace

import numpy as np

from experiments.tools import reproduce


@dataclasses.dataclass(frozen=True)
class NearDuplicates:
  """A setting's validation documents with a near-duplicate in its training split: the
  names as its records hold them (path order), each one's training twins; `why` is set
  (and `names` empty) where the set could not be established for the records."""

  setting: str
  names: tuple[str, ...] = ()
  twins: dict = dataclasses.field(default_factory=dict)
  why: str = ""


def _corpus():
  from experiments.configs import load_config
  from experiments.data.corpus import corpus_spec, load_corpus

  config = load_config(f"{reproduce.CONFIGS}/{reproduce.CONFIG}:bytes,baseline")
  return load_corpus(corpus_spec(SimpleNamespace(data=config.data)))


@functools.lru_cache(maxsize=1)
def _split_twins() -> dict:
  """{"bytes": {validation path: training twins}, "tokens": {relative path: twins},
  "content": the byte corpus's content sha256, "bytes_val" / "tokens_val": each split's
  validation paths}, from the data."""
  from experiments.data import validation
  from experiments.data.tokens.prepare import is_validation_doc

  corpus = _corpus()
  paths = (*corpus.train_paths, *corpus.val_paths)
  docs = (*corpus.train_docs, *corpus.val_docs)
  is_val = [is_validation_doc(bytes(np.asarray(d)), reproduce.TOKEN_VAL_FRACTION) for d in docs]

  def pick(want):
    return ([p for p, v in zip(paths, is_val, strict=True) if v == want],
            [d for d, v in zip(docs, is_val, strict=True) if v == want])

  return {"bytes": validation.near_duplicates(corpus.val_paths, corpus.val_docs,
                                              corpus.train_paths, corpus.train_docs),
          "tokens": validation.near_duplicates(*pick(True), *pick(False)),
          "content": corpus.manifest.get("content_sha256"),
          "bytes_val": set(corpus.val_paths), "tokens_val": set(pick(True)[0])}


# The v3 controls score the deduplicated set themselves (their family's section,
# experiments/tools/reproduce/declared.py): the sensitivity analysis re-scores the rest.
V3_ARMS = frozenset({a for arms in reproduce.CONTROL_ARMS.values() for a in arms}
                    | {reproduce.YOUNG_BASE, reproduce.YOUNG_INSERTED})


def _main_arms(results: dict, setting: str) -> dict:
  return {arm: e for arm, e in results.get(setting, {}).items() if arm not in V3_ARMS}


def _recorded_sets(results: dict, setting: str) -> tuple[set[tuple[str, ...]], set[str]]:
  """The document-name lists the setting's finished runs scored, and its corpus hashes."""
  names, corpora = set(), set()
  for entry in _main_arms(results, setting).values():
    for s in entry["seeds"].values():
      if s.get("per_doc") is not None:
        names.add(tuple(s["per_doc"]["names"]))
      if s.get("corpus"):
        corpora.add(s["corpus"])
  return names, corpora


TOKEN_CORPUS_PREFIX = f"{reproduce.token_root(reproduce.ROOT) / 'corpus'}/"


def near_duplicates(results: dict, setting: str) -> NearDuplicates:
  """The setting's near-duplicate validation documents, named as its records name them,
  after checking that the data here is the data its runs scored (else `why`)."""
  recorded, corpora = _recorded_sets(results, setting)
  if not recorded:
    return NearDuplicates(setting, why="no run of this setting kept its per-document losses")
  if len(recorded) > 1:
    return NearDuplicates(setting, why=f"its runs scored {len(recorded)} different document "
                                       "sets")
  names = next(iter(recorded))
  try:
    split = _split_twins()
  except (OSError, ValueError) as e:
    return NearDuplicates(setting, why=f"the corpus could not be read ({type(e).__name__})")
  if setting == "bytes":
    if corpora and corpora != {split["content"]}:
      return NearDuplicates(setting, why="the corpus here is not the one the records were "
                                         "trained on (content sha256 differs)")
    if not set(names) <= split["bytes_val"]:
      return NearDuplicates(setting, why="the records scored documents outside the corpus's "
                                         "validation split")
    twins, recorded_name = split["bytes"], str
  elif setting == "tokens":
    relative = {n[len(TOKEN_CORPUS_PREFIX):] if n.startswith(TOKEN_CORPUS_PREFIX) else None
                for n in names}
    if relative != split["tokens_val"]:
      return NearDuplicates(setting, why="the token validation split recomputed from the "
                                         "corpus is not the set the records scored")
    twins, recorded_name = split["tokens"], lambda rel: f"{TOKEN_CORPUS_PREFIX}{rel}"
  else:
    return NearDuplicates(setting, why=f"no training split known for {setting!r}")
  # A near-duplicate the windows did not keep (fewer than two units) has nothing to drop.
  found = {recorded_name(p): tuple(t) for p, t in twins.items() if recorded_name(p) in names}
  return NearDuplicates(setting, tuple(n for n in names if n in found), found)


def without(results: dict, setting: str, drop) -> dict:
  """A copy of `collect`'s results in which every finished run of `setting` is scored over
  its validation documents other than `drop`: "final" its bits per unit over the kept
  documents (nats summed over them / their targets / ln 2), "per_doc" restricted to them.
  A run without per-document losses (or one that did not score a dropped document's
  name set) has no final here: it cannot be re-scored."""
  drop = set(drop)
  out = dict(results)
  arms = copy.deepcopy(_main_arms(results, setting))
  for entry in arms.values():
    for s in entry["seeds"].values():
      per_doc = s.get("per_doc")
      if s["final"] is None:
        continue
      if per_doc is None:
        s["final"] = None
        continue
      keep = np.asarray([n not in drop for n in per_doc["names"]])
      nats = np.asarray(per_doc["nats"], np.float64)[keep]
      tokens = np.asarray(per_doc["tokens"], np.float64)[keep]
      s["final"] = float(nats.sum() / max(tokens.sum(), 1.0) / math.log(2.0))
      s["per_doc"] = {**per_doc, "names": [n for n, k in zip(per_doc["names"], keep,
                                                               strict=True) if k],
                      "nats": nats, "tokens": tokens}
  out[setting] = arms
  return out


def removed_units(results: dict, found: NearDuplicates) -> tuple[int, int, int, int]:
  """(documents removed, documents scored, units removed, units scored) of the setting's
  validation set as its runs scored it (every run scored the same set: `near_duplicates`)."""
  for entry in _main_arms(results, found.setting).values():
    for s in entry["seeds"].values():
      per_doc = s.get("per_doc")
      if per_doc is not None:
        tokens = np.asarray(per_doc["tokens"], np.float64)
        gone = np.asarray([n in set(found.names) for n in per_doc["names"]])
        return (int(gone.sum()), len(per_doc["names"]), int(tokens[gone].sum()),
                int(tokens.sum()))
  return 0, 0, 0, 0


def short_name(setting: str, name: str) -> str:
  """A document's name without the token corpus's folder."""
  return name[len(TOKEN_CORPUS_PREFIX):] if name.startswith(TOKEN_CORPUS_PREFIX) else name
