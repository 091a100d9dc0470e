#!/usr/bin/env bash
# The GPU scale check by itself (experiments/tools/bench/scale_check.py): the declared family
# `scale_check` (baseline, Lngram v2 r16, v1 at matched active parameters, Engram) at
# d 512 x 8 layers, 16,384 bytes a step, 1,000 steps, bf16; two seeds a run of ~15 minutes,
# every finished arm x seed recorded, so separate runs add seeds (SEEDS=0,1 then 2,3 then 4).
#
#   DATA=pkg:transformers SEEDS=0,1 OUT=<dir> bash experiments/tools/bench/scale_check.sh   # repo root
#   SMOKE=1 SKIP_WHEELS=1 OUT=/tmp/scale_dry bash experiments/tools/bench/scale_check.sh   # CPU
#
# Environment: OUT (default ./scale_out: runs/<arm>_s<seed>/, scale_check.json, its tables,
# scale_check.log, and scale_records.tar.gz: the records of this run's finished arm x seeds),
# DATA (required at full size: >= 30 MB of training text that 1,000 steps read less than
# once, a folder or pkg:NAME, an installed Python package's source; its sha256 is recorded
# and seeds pair only on the same data; on the GPU image pkg:transformers: 51.0 MB of
# training text with transformers 5.24, 0.32 of an epoch a run), SEEDS (default 0,1), PY
# (default python3), BUDGET_S (the script's deadline, default 840 s: a 15-minute slot less
# start-up; 510 for a 9-minute one, which fits fewer arm x seeds: the rest are skipped and a
# later run trains them),
# SKIP_WHEELS=1 (do not install .whl/*.whl into /tmp/site, as gpu_suite.sh does for the GPU
# machine's Python, which lacks ml_collections), ARMS (comma-separated subset), SMOKE=1
# (tiny shapes on a slice of the standard library; its records stay under $OUT).
# The records go into the repository with
#   tar -xzf scale_records.tar.gz -C experiments/results/records/scale_check
# (an arm x seed recorded there under the same declaration is skipped by a later run), and
# `python -m experiments.tools.reproduce declared` prints the family's section from them.
# The compilation cache ($JAX_COMPILATION_CACHE_DIR, default the suite's) makes the second
# seed of every arm, and a rerun on the same machine, skip compiling.
set -u
OUT=${OUT:-./scale_out}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-840}
SEEDS=${SEEDS:-0,1}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/lngram_jax_xla_cache}
if [ "${SKIP_WHEELS:-0}" != 1 ] && compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
case ":$PYTHONPATH:" in *":$PWD:"*) ;; *) export PYTHONPATH=$PYTHONPATH:$PWD ;; esac
args=(--out "$OUT" --budget-s "$BUDGET_S" --cache-dir "$JAX_COMPILATION_CACHE_DIR"
      --seeds "$SEEDS" --records "$OUT/records")
if [ "${SMOKE:-0}" = 1 ]; then
  args+=(--dry_run)
elif [ -z "${DATA:-}" ]; then
  echo "error: DATA is required at full size (>= 30 MB of training text: a folder, or" \
       "pkg:NAME for an installed Python package's source)" >&2
  exit 2
fi
[ -n "${DATA:-}" ] && args+=(--data "$DATA")
[ -n "${ARMS:-}" ] && args+=(--arms "$ARMS")
# The script stops itself at its deadline; the outer timeout only guards a hang.
timeout -k 10 $((${BUDGET_S%.*} + 60)) "$PY" -m experiments.tools.bench.scale_check "${args[@]}" 2>&1 \
  | tee "$OUT/scale_check.log"
status=${PIPESTATUS[0]}
# One archive of the records (a remote machine hands back few files).
if compgen -G "$OUT/records/*_s*" > /dev/null; then
  tar -czf "$OUT/scale_records.tar.gz" -C "$OUT/records" .
fi
exit "$status"
