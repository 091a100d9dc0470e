"""Table 12's programs (prefill at 256 / 512 / 1,024 tokens, cached decode) compiled by
XLA:GPU for one H800 on this CPU machine: they compile, with their kernels (BENCHMARKS.md).

    python -m experiments.tools.bench.gpu_table12 --out=experiments/results/records/gpu_table12
    python -m experiments.tools.bench.gpu_table12 --out=... --table

The model and rows are lm_efficiency's (Table 12's 2B decoder, Qwen3-1.7B widths, bf16,
the byte vocabulary; Lngram v2 at layers 1 and 13), built from shapes (`nnx.eval_shape`:
nothing allocated) and unrolled (`--impl loop`, as the GPU suite times it). Each
program is `jit(...).lower(...).compile()` for `--target` (experiments/plan/gpu.py);
its record holds the peak (arguments + outputs - donated + temporaries), the Triton
kernel calls in the program and the compile seconds, written as soon as the row ends.
Rows: the baseline and the paper's headline r64/m4/KV8, with the readout as a Pallas
kernel (`--readout`, default "pallas": the Triton sink readout) and as XLA.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import time
from pathlib import Path

ROWS = ("baseline", "r64/m4/KV8")
LENGTHS = (256, 512, 1024)
SMOKE_LENGTHS = (16, 32, 64)
NEW_TOKENS = 32
CALL = "__gpu$xla.gpu.triton"


def _placed(tree, device):
  import jax
  sharding = jax.sharding.SingleDeviceSharding(device)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _compiled(fn, args, device, donate=()):
  import jax

  from experiments.plan.compile import compile_for_gpu
  t0 = time.perf_counter()
  compiled = compile_for_gpu(jax.jit(fn, donate_argnums=donate).trace(*args), [device])
  m = compiled.memory_analysis()
  peak = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
          + m.temp_size_in_bytes)
  return {"peak_bytes": peak, "argument_bytes": m.argument_size_in_bytes,
          "temp_bytes": m.temp_size_in_bytes, "kernel_calls": compiled.as_text().count(CALL),
          "compile_s": round(time.perf_counter() - t0, 1)}


def compile_row(name: str, target: str, readout: str, lengths=LENGTHS,
                new_tokens: int = NEW_TOKENS, smoke: bool = False, log=print) -> dict:
  """The prefill and decode programs of one row, compiled for `target`'s one GPU."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from experiments.plan import gpu
  from experiments.tools.bench.lm_efficiency import _decode_tokens
  from experiments.tools.bench.scan_lm import PureLM, build_lm, lm_config
  (device,) = gpu.target_devices(target)
  decode_after = lengths[-1]
  cfg = lm_config(name, smoke=smoke, readout=readout, max_len=decode_after + new_tokens)
  model = PureLM(nnx.eval_shape(lambda: build_lm(cfg, scan=False)))
  params = _placed(model.params, device)
  row = {"name": name, "target": target, "readout": readout if name != "baseline" else None,
         "prefill": {}, "decode": {}}
  for T in lengths:
    tokens = _placed(jax.ShapeDtypeStruct((1, T), jnp.int32), device)
    prefill = functools.partial(model.prefill, cache_len=T + new_tokens
                                if T != decode_after else decode_after + new_tokens)
    row["prefill"][str(T)] = r = _compiled(prefill, (params, tokens), device)
    log(f"  {name}: prefill {T}: peak {r['peak_bytes'] / 2**30:.2f} GiB, {r['kernel_calls']} "
        f"Triton calls, {r['compile_s']:.0f} s")
  tokens = _placed(jax.ShapeDtypeStruct((1, decode_after), jnp.int32), device)
  prefill = functools.partial(model.prefill, cache_len=decode_after + new_tokens)
  _, cache = jax.eval_shape(prefill, model.params, jax.ShapeDtypeStruct((1, decode_after),
                                                                        jnp.int32))
  token = _placed(jax.ShapeDtypeStruct((1,), jnp.int32), device)
  decode = functools.partial(_decode_tokens, model, steps=new_tokens)
  row["decode"]["1"] = r = _compiled(decode, (params, _placed(cache, device), token), device,
                                    donate=(1,))
  log(f"  {name}: decode B=1 ({new_tokens} steps): peak {r['peak_bytes'] / 2**30:.2f} GiB, "
      f"{r['kernel_calls']} Triton calls, {r['compile_s']:.0f} s")
  return row


def _gib(n: float) -> str:
  return f"{n / 2**30:.2f}"


def table(records: list[dict]) -> str:
  """The markdown table of the records (rows in ROWS order, Pallas readout first)."""
  order = {n: i for i, n in enumerate(ROWS)}
  records = sorted(records, key=lambda r: (order.get(r["name"], 99), r["readout"] != "pallas"))
  lines = ["| row | readout | target | prefill 256 / 512 / 1,024: peak GiB | Triton calls | "
           "compile s | decode B=1: peak GiB | Triton calls | compile s |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for rec in records:
    p = [rec["prefill"][k] for k in sorted(rec["prefill"], key=int)]
    d = rec["decode"]["1"]
    peaks = " / ".join(_gib(x["peak_bytes"]) for x in p)
    calls = " / ".join(str(x["kernel_calls"]) for x in p)
    seconds = " / ".join(f"{x['compile_s']:.0f}" for x in p)
    lines.append(f"| {rec['name']} | {rec['readout'] or '-'} | {rec['target']} | {peaks} | "
                 f"{calls} | {seconds} | {_gib(d['peak_bytes'])} | {d['kernel_calls']} | "
                 f"{d['compile_s']:.0f} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True, help="folder of the JSON records")
  p.add_argument("--target", default="h800:1", help="one GPU: h800:1, h100:1, h200:1, a100:1")
  p.add_argument("--readouts", default="pallas,absorbed",
                 help="the Lngram rows' readouts (comma-separated)")
  p.add_argument("--table", action="store_true", help="print the table of the records")
  p.add_argument("--smoke", action="store_true",
                 help="lm_efficiency's smoke backbone and lengths 16 / 32 / 64 (seconds)")
  args = p.parse_args(argv)
  out = Path(args.out)
  if args.table:
    print(table([json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]))
    return 0
  out.mkdir(parents=True, exist_ok=True)
  from importlib import metadata

  import jax
  jax.config.update("jax_platforms", "cpu")
  for name in ROWS:
    for readout in (["-"] if name == "baseline" else args.readouts.split(",")):
      key = f"{name.replace('/', '_')}_{readout}_{args.target.replace(':', 'x')}"
      if (out / f"{key}.json").exists():
        print(f"{key}: recorded", flush=True)
        continue
      row = compile_row(name, args.target, "absorbed" if readout == "-" else readout,
                        lengths=SMOKE_LENGTHS if args.smoke else LENGTHS, smoke=args.smoke,
                        log=functools.partial(print, flush=True))
      row.update(date=datetime.date.today().isoformat(), host=f"{os.cpu_count()} CPU cores",
                 versions={"jax": jax.__version__,
                           "jax-cuda12-plugin": metadata.version("jax-cuda12-plugin")})
      (out / f"{key}.json").write_text(json.dumps(row, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  from experiments.plan.gpu import quiet_cuda_startup
  quiet_cuda_startup()
  sys.exit(main())
