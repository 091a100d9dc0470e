"""Token data throughput: prepare-data against the tokenizers package, the loader against the step.

    python -m experiments.tools.bench.tokens --files=8 --max_docs=2000 --repeats=3
    python -m experiments.tools.bench.tokens --tokenizer=tok/tokenizer.json --steps=10

1. prepare-data, one worker and one tokenizer thread (tokens/s per core), over
   the embedded corpus's documents written as `--files` parquet files (the form
   FineWeb-Edu ships), against `Tokenizer.encode_batch` over the same texts
   already in memory, one thread too. The ratio is what our pipeline keeps
   (reading parquet, the split hash, digests, writing shards): 1.0 = no
   overhead. Rounds alternate between the two; the median counts.
2. The loader (`TokenBatches`) at the default config's batch (`lm_lngram`,
   16 × 128 tokens) in rows/s, against the rows/s one training step of that
   config consumes (the trainer's own step, vocabulary from the manifest). A
   ratio above 1 means the loader is not the bottleneck.
3. The loader alone at a GPU-sized batch (`--big_batch`), and this process's
   resident memory before and after many batches (memory-mapped: flat).

Without `--tokenizer`, a byte-level BPE of `--vocab_size` ids is trained on the
same texts first (not timed). Prints JSON, then a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

# One tokenizer thread: per-core figures on both sides (read when tokenizers starts).
os.environ.setdefault("RAYON_NUM_THREADS", "1")


def _texts(max_docs: int) -> list[str]:
  from experiments.data.tokens import tokenizer_texts

  texts = []
  for text in tokenizer_texts(""):
    texts.append(text)
    if len(texts) == max_docs:
      break
  return texts


def _write_parquet(texts: list[str], folder: Path, files: int) -> str:
  import pyarrow as pa
  import pyarrow.parquet as pq

  folder.mkdir(parents=True, exist_ok=True)
  per = -(-len(texts) // files)
  for i in range(files):
    pq.write_table(pa.table({"text": texts[i * per:(i + 1) * per]}),
                   folder / f"part-{i:05d}.parquet")
  return str(folder)


def _time(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def prepare_ratio(texts, tokenizer: str, work: Path, files: int, repeats: int) -> dict:
  from tokenizers import Tokenizer

  from experiments.data.tokens import prepare

  inputs = _write_parquet(texts, work / "parquet", files)
  tok = Tokenizer.from_file(str(Path(tokenizer) if tokenizer.endswith(".json")
                                else Path(tokenizer) / "tokenizer.json"))
  tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
  ours, theirs, fast, manifest = [], [], [], None
  for r in range(repeats):
    out = work / f"out{r}"
    ours.append(_time(lambda out=out: prepare(inputs, tokenizer, str(out), workers=1,
                                               progress=False)))
    manifest = json.loads((out / "manifest.json").read_text())
    theirs.append(_time(lambda: tok.encode_batch(texts, add_special_tokens=False)))
    # What prepare calls (the same ids, no offsets): the ratio to it is our overhead alone.
    fast.append(_time(lambda: tok.encode_batch_fast(texts, add_special_tokens=False)))
  # prepare also writes one EOS per document; count the same tokens on both sides.
  ours_s, theirs_s, fast_s = (statistics.median(t) for t in (ours, theirs, fast))
  return {"docs": len(texts), "files": files, "tokens": tokens,
          "tokens_with_eos": manifest["tokens"],
          "prepare_tokens_per_s": round(tokens / ours_s),
          "encode_batch_tokens_per_s": round(tokens / theirs_s),
          "encode_batch_fast_tokens_per_s": round(tokens / fast_s),
          "ratio": round(theirs_s / ours_s, 3), "ratio_fast": round(fast_s / ours_s, 3)}


def loader_ratio(data: str, config_path: str, steps: int, repeats: int) -> dict:
  from experiments.configs import load_config
  from experiments.data.tokens import TokenBatches, TokenCorpus
  from experiments.tools.bench.train import _runner

  config = load_config(config_path)
  corpus = TokenCorpus(data)
  with config.unlocked():
    config.model.vocab_size = corpus.vocab_size
  dc = config.data
  loader = TokenBatches(corpus, seq_len=dc.seq_len, batch_size=dc.batch_size, seed=dc.seed)
  batches = [next(loader) for _ in range(steps)]
  run = _runner(config, batches)
  loads = []
  for _ in range(repeats):
    loads.append(_time(lambda: [next(loader) for _ in range(steps)]))
  step_s = statistics.median(run() for _ in range(repeats))
  load_s = statistics.median(loads)
  rows = steps * dc.batch_size
  return {"config": config_path, "batch": [dc.batch_size, dc.seq_len],
          "vocab_size": corpus.vocab_size, "loader_rows_per_s": round(rows / load_s, 1),
          "step_rows_per_s": round(rows / step_s, 1), "ratio": round(step_s / load_s, 1)}


def _rss_mb() -> float:
  """This process's resident memory now (Linux /proc), MiB."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def loader_alone(data: str, batch_size: int, seq_len: int, batches: int) -> dict:
  """The loader by itself at another shape (a GPU-sized batch), and whether its host
  memory stays flat over `batches` batches (several epochs of a small corpus)."""
  from experiments.data.tokens import TokenBatches, TokenCorpus

  loader = TokenBatches(TokenCorpus(data), seq_len=seq_len, batch_size=batch_size, seed=0)
  next(loader)
  start_mb, t0 = _rss_mb(), time.perf_counter()
  for _ in range(batches):
    next(loader)
  seconds = time.perf_counter() - t0
  return {"batch": [batch_size, seq_len], "batches": batches,
          "epochs": round(batches * batch_size / loader.rows_per_epoch, 1),
          "rows_per_s": round(batches * batch_size / seconds, 1),
          "tokens_per_s": round(batches * batch_size * seq_len / seconds),
          "rss_mb_start": round(start_mb, 1), "rss_mb_end": round(_rss_mb(), 1)}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--files", type=int, default=8, help="parquet files to split into")
  parser.add_argument("--max_docs", type=int, default=2000, help="documents of the corpus")
  parser.add_argument("--tokenizer", default="", help="a tokenizer.json (default: train one)")
  parser.add_argument("--vocab_size", type=int, default=4096)
  parser.add_argument("--config", default="experiments/configs/lm_lngram.py",
                      help="the config whose step the loader is measured against")
  parser.add_argument("--steps", type=int, default=10, help="batches per loader/step round")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--big_batch", default="256x1024",
                      help="rows x tokens of the loader-alone measure (a GPU-sized batch)")
  parser.add_argument("--big_batches", type=int, default=50)
  ns = parser.parse_args(argv)

  import jax

  from experiments.data.tokens import train_tokenizer

  texts = _texts(ns.max_docs)
  with tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    tokenizer = ns.tokenizer or str(train_tokenizer(iter(texts), str(work / "tok"),
                                                    vocab_size=ns.vocab_size))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, jax backend "
                   f"{jax.default_backend()}, Python {platform.python_version()}",
        "load_average_1min": round(os.getloadavg()[0], 1),
        "prepare": prepare_ratio(texts, tokenizer, work, ns.files, ns.repeats),
    }
    result["loader"] = loader_ratio(str(work / "out0"), ns.config, ns.steps, ns.repeats)
    rows, tokens = (int(x) for x in ns.big_batch.split("x"))
    result["loader_alone"] = loader_alone(str(work / "out0"), rows, tokens, ns.big_batches)
  print(json.dumps(result, indent=1))
  print(markdown(result))
  return result


def markdown(result: dict) -> str:
  p, ld, la = result["prepare"], result["loader"], result["loader_alone"]
  return "\n".join([
      "| measure | ours | reference | ratio |", "|---|---:|---:|---:|",
      f"| prepare-data tokens/s per core vs encode_batch | {p['prepare_tokens_per_s']:,} | "
      f"{p['encode_batch_tokens_per_s']:,} | {p['ratio']:.3f} |",
      f"| prepare-data vs encode_batch_fast (what it calls) | {p['prepare_tokens_per_s']:,} | "
      f"{p['encode_batch_fast_tokens_per_s']:,} | {p['ratio_fast']:.3f} |",
      f"| loader rows/s vs step rows/s ({ld['batch'][0]} × {ld['batch'][1]}) | "
      f"{ld['loader_rows_per_s']:,} | {ld['step_rows_per_s']:,} | {ld['ratio']:.1f} |",
      "", f"loader alone at {la['batch'][0]} × {la['batch'][1]}: {la['rows_per_s']:,} rows/s "
      f"({la['tokens_per_s']:,} tokens/s), resident memory {la['rss_mb_start']} -> "
      f"{la['rss_mb_end']} MiB over {la['batches']} batches ({la['epochs']} epochs)"])


if __name__ == "__main__":
  main()
