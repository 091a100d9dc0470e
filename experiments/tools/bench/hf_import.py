"""Import time and peak host memory of a Hugging Face checkpoint: ours against `transformers`.

    python -m experiments.tools.bench.hf_import --dir=runs/qwen3_widths [--layers=2]

Writes a synthetic Qwen3 checkpoint of Qwen3-1.7B's widths and vocabulary
(hidden 2048, 16 query / 8 KV heads of 128, FFN 6144, vocabulary 151,936,
tied embeddings) with `--layers` layers in bf16 (2 layers: ~0.8 GB), then
loads it once with `experiments.hf.load_hf` and once with
`transformers.AutoModelForCausalLM.from_pretrained(dtype=bfloat16)`, each in a
fresh process, in the same run. Reports the load's wall time (imports
excluded) and the process's peak RSS (VmHWM, imports included) for both,
and their ratios. `transformers` and torch are needed only for the second
measurement (the dev extra).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

# VmHWM: this process's own peak (ru_maxrss would carry the parent's over fork + exec).
_PEAK = """
def _peak_kib():
  for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
      return int(line.split()[1])
"""
_OURS = _PEAK + """
import time
import jax
from experiments.hf import load_hf
t = time.perf_counter()
model, config = load_hf({dir!r})
jax.block_until_ready(jax.tree.leaves(model))
print(time.perf_counter() - t, _peak_kib())
"""
_THEIRS = _PEAK + """
import time
import torch, transformers
t = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained({dir!r}, dtype=torch.bfloat16)
print(time.perf_counter() - t, _peak_kib())
"""


# Qwen3-1.7B's widths; --tiny: a few-KiB model with the same structure (the bench's test).
WIDTHS = dict(vocab_size=151936, d_model=2048, n_heads=16, n_kv_heads=8, head_dim=128,
              ffn_dim=6144)
TINY = dict(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=48)


def write_checkpoint(out: Path, layers: int, seed: int = 0, widths=None, *,
                     reuse: bool = False) -> int:
  """The synthetic checkpoint (config.json + model.safetensors); returns its bytes.

  `synthetic.json` beside them records what was drawn (layers, seed, widths, bytes),
  written last. With `reuse`, a directory whose record matches is left as it is (the
  same draw: a second benchmark on one machine skips a write of gigabytes).
  """
  widths = dict(widths or WIDTHS)
  record = {"layers": layers, "seed": seed, "widths": widths}
  record_path = out / "synthetic.json"
  if reuse and record_path.exists() and (out / "model.safetensors").exists():
    written = json.loads(record_path.read_text())
    if {k: written.get(k) for k in record} == record:
      return written["bytes"]
  import ml_dtypes

  from experiments.hf.export import hf_config_json
  from experiments.hf.names import hf_shapes
  from experiments.hf.safetensors_io import write_file
  from experiments.models.config import LMConfig
  record_path.unlink(missing_ok=True)   # a write cut short leaves no matching record
  config = LMConfig(**widths, n_layers=layers, max_len=40960,
                    rope_theta=1e6, tie_embeddings=True, qk_norm=True,
                    norm_scale_in_dtype=True, param_dtype="bfloat16", dtype="bfloat16")
  rng = np.random.default_rng(seed)
  tensors = {name: (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(
      ml_dtypes.bfloat16) for name, shape in hf_shapes(config).items()}
  out.mkdir(parents=True, exist_ok=True)
  write_file(out / "model.safetensors", tensors, {"format": "pt"})
  (out / "config.json").write_text(json.dumps(hf_config_json(config)))
  size = sum(t.nbytes for t in tensors.values())
  record_path.write_text(json.dumps({**record, "bytes": size}))
  return size


def measure(code: str) -> tuple[float, float]:
  """(load seconds, peak RSS GiB) of `code` run in a fresh Python process."""
  done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                        text=True)
  seconds, rss_kib = done.stdout.split()[-2:]
  return float(seconds), int(rss_kib) / 2**20


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dir", required=True, help="where the synthetic checkpoint goes")
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--tiny", action="store_true", help="tiny widths (a test of the bench)")
  args = parser.parse_args(argv)
  size = write_checkpoint(Path(args.dir), args.layers, widths=TINY if args.tiny else None)
  ours = measure(_OURS.format(dir=args.dir))
  theirs = measure(_THEIRS.format(dir=args.dir))
  widths = "tiny" if args.tiny else "Qwen3-1.7B"
  print(f"checkpoint: {size / 2**30:.2f} GiB bf16, {args.layers} layers at {widths} widths")
  print("| loader | load s | peak RSS GiB |\n| --- | ---: | ---: |")
  print(f"| experiments.hf.load_hf | {ours[0]:.2f} | {ours[1]:.3f} |")
  print(f"| transformers from_pretrained | {theirs[0]:.2f} | {theirs[1]:.3f} |")
  print(f"| ratio ours / transformers | {ours[0] / theirs[0]:.2f}x | {ours[1] / theirs[1]:.3f}x |")


if __name__ == "__main__":
  main()
