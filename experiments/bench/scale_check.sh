#!/usr/bin/env bash
# The GPU scale check by itself (experiments/bench/scale_check.py): the main arms at
# d 512 x 8 layers, 16,384 tokens per step, 1,000 steps, bf16, within BUDGET_S.
#
#   OUT=<dir> bash experiments/bench/scale_check.sh            # from the repository root
#   SMOKE=1 SKIP_WHEELS=1 OUT=/tmp/scale_dry bash experiments/bench/scale_check.sh   # CPU
#
# Environment: OUT (default ./scale_out: <arm>.jsonl curves, scale_check.json, its table,
# scale_check.log), PY (default python3), BUDGET_S (the script's deadline, default 510 s:
# a 9-minute slot less start-up), SKIP_WHEELS=1 (do not install .whl/*.whl into
# /tmp/site, as gpu_suite.sh does for the GPU machine's Python, which lacks
# ml_collections), ARMS (comma-separated subset), SMOKE=1 (tiny shapes).
# The compilation cache ($JAX_COMPILATION_CACHE_DIR, default the suite's) makes a rerun
# on the same machine skip compiling.
set -u
OUT=${OUT:-./scale_out}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-510}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/lngram_jax_xla_cache}
if [ "${SKIP_WHEELS:-0}" != 1 ] && compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
case ":$PYTHONPATH:" in *":$PWD:"*) ;; *) export PYTHONPATH=$PYTHONPATH:$PWD ;; esac
args=(--out "$OUT" --budget-s "$BUDGET_S" --cache-dir "$JAX_COMPILATION_CACHE_DIR")
[ "${SMOKE:-0}" = 1 ] && args+=(--smoke)
[ -n "${ARMS:-}" ] && args+=(--arms "$ARMS")
# The script stops itself at its deadline; the outer timeout only guards a hang.
timeout -k 10 $((${BUDGET_S%.*} + 60)) "$PY" -m experiments.bench.scale_check "${args[@]}" 2>&1 \
  | tee "$OUT/scale_check.log"
exit "${PIPESTATUS[0]}"
