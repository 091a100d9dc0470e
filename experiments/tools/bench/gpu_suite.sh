#!/usr/bin/env bash
# One short check run on a GPU machine: environment, Pallas/Triton kernels against
# their references on the real GPU, then the kernel, layer and PVM-decode benchmarks.
#
#   OUT=<dir> bash experiments/tools/bench/gpu_suite.sh      # from the repository root, on the GPU
#   PY=.venv/bin/python SKIP_WHEELS=1 SMOKE=1 OUT=/tmp/gpu_dry bash experiments/tools/bench/gpu_suite.sh
#
# The second line is the CPU dry run: SMOKE=1 swaps every benchmark for its tiny
# variant (the pytest steps are the same; their GPU tests skip on a CPU).
#
# Environment:
#   OUT          where results go (default ./gpu_out): gpu_suite.log (every step's
#                stdout+stderr behind a header with its command, then its exit code and
#                wall seconds), suite_summary.json, env.json, kernels_bench.json,
#                gpu_spec.json, lngram_bench.json, decode_8b.json, decode_wide.json, pvm_cost.json,
#                lm_efficiency.json, hf_train_step.json (step 5c),
#                scale/ (the scale check's curves and scale_check.json, step 9) and
#                scale_records.tar.gz (its finished arm x seeds' records).
#   PY           the Python to use (default python3).
#   SKIP_WHEELS  1: do not install the wheels of .whl/ (flax, ml_collections) into
#                /tmp/site; the GPU machine's Python lacks ml_collections and may
#                hold another flax. .whl/ is git-ignored: fetch the wheels where a
#                package index is reachable and copy the folder with the tree:
#                  pip download -q --no-deps --python-version 3.12 --only-binary=:all: \
#                    -d .whl flax==0.12.12 ml_collections==1.1.0
#   SMOKE        1: tiny benchmark shapes (CPU dry run, under 3 minutes on 2 cores).
#   BUDGET_S     wall-clock budget of the whole suite (default 470: one call of under 9
#                minutes with the machine's start; the step limits below sum to more, so
#                a call names the steps it skips): a step never runs past it; a step that
#                would start with under 10 s left is skipped. Each step's limit is its
#                own time budget. The split used on a 15-minute device budget is in
#                BENCHMARKS.md ("The next GPU run").
#   SCALE_CHECK_DATA, SCALE_CHECK_SEEDS  the scale check's training text (default
#                pkg:transformers) and seeds (default 0,1): step 9.
#   SKIP_STEPS   space-separated step names not to run (recorded as skipped), e.g.
#                "decode-8b decode-wide" to spend a short GPU run on the steps after them.
#
# No `set -e`: a failing step must not stop the others. Every step runs under its
# own `timeout`; exit code 124 means the step hit its limit (its partial output is
# in the log: Python runs unbuffered).
set -u

OUT=${OUT:-./gpu_out}
PY=${PY:-python3}
SMOKE=${SMOKE:-0}
BUDGET_S=${BUDGET_S:-470}
mkdir -p "$OUT"
LOG=$OUT/gpu_suite.log
STEPS=$OUT/.steps.tsv
: > "$LOG"
: > "$STEPS"
export PYTHONUNBUFFERED=1
# A rerun on the same machine reuses compiled programs (tests and benchmarks alike).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/lngram_jax_xla_cache}
export LNGRAM_JAX_CACHE_DIR=$JAX_COMPILATION_CACHE_DIR
SUITE_T0=$(date +%s.%N)

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# step NAME LIMIT_S CMD...: runs CMD under `timeout`, tees into the log, records rc and wall.
step() {
  local name=$1 limit=$2
  shift 2
  local shown=${*//$'\n'/ }
  shown=${shown:0:300}
  local left
  left=$(awk -v b="$BUDGET_S" -v e="$(elapsed "$SUITE_T0")" 'BEGIN { printf "%d", b - e }')
  if [[ " ${SKIP_STEPS:-} " == *" $name "* ]]; then
    echo "=== [$name] SKIPPED: named in SKIP_STEPS ===" | tee -a "$LOG"
    printf '%s\tskipped\t0\t%s\n' "$name" "$shown" >> "$STEPS"
    return
  fi
  if [ "$left" -lt 10 ]; then
    echo "=== [$name] SKIPPED: ${left}s of the ${BUDGET_S}s budget left ===" | tee -a "$LOG"
    printf '%s\tskipped\t0\t%s\n' "$name" "$shown" >> "$STEPS"
    return
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "=== [$name] \$ $shown (timeout ${limit}s, at $(elapsed "$SUITE_T0")s) ===" | tee -a "$LOG"
  local t0 rc wall
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  wall=$(elapsed "$t0")
  echo "=== [$name] exit $rc, ${wall}s wall$([ "$rc" = 124 ] && echo ' (TIMED OUT)') ===" \
    | tee -a "$LOG"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$wall" "$shown" >> "$STEPS"
}

json_str() {  # a JSON string literal
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/ }
  printf '"%s"' "$s"
}

# The summary is written on exit, so steps appended at the end are included too.
write_summary() {
  {
    echo "=== summary: step, exit code, wall s ==="
    awk -F'\t' '{ printf "%-14s %-8s %8s  %s\n", $1, $2, $3, $4 }' "$STEPS"
    echo "total $(elapsed "$SUITE_T0")s wall"
  } | tee -a "$LOG"
  {
    printf '{"smoke": %s, "python": %s, "total_wall_s": %s, "steps": [' \
      "$([ "$SMOKE" = 1 ] && echo true || echo false)" "$(json_str "$PY")" \
      "$(elapsed "$SUITE_T0")"
    local first=1 name rc wall cmd
    while IFS=$'\t' read -r name rc wall cmd; do
      [ $first = 1 ] || printf ', '
      first=0
      case $rc in *[!0-9]* | '') rc=$(json_str "$rc") ;; esac  # "skipped" stays a string
      printf '{"name": %s, "rc": %s, "wall_s": %s, "cmd": %s}' "$(json_str "$name")" \
        "$rc" "$wall" "$(json_str "$cmd")"
    done < "$STEPS"
    printf ']}\n'
  } > "$OUT/suite_summary.json"
  rm -f "$STEPS"
}
trap write_summary EXIT

# --- 0. wheels of what the GPU machine's Python lacks (flax of this repo, ml_collections) --
if [ "${SKIP_WHEELS:-0}" != 1 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> "$LOG" 2>&1 && export PYTHONPATH=/tmp/site:$PWD
  wheels_rc=$?
  echo "=== [wheels] $(ls .whl 2>&1 | tr '\n' ' ')-> /tmp/site: exit $wheels_rc ===" \
    | tee -a "$LOG"
  printf 'wheels\t%s\t0\tpip install --target /tmp/site .whl/*.whl\n' "$wheels_rc" >> "$STEPS"
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
case ":$PYTHONPATH:" in *":$PWD:"*) ;; *) export PYTHONPATH=$PYTHONPATH:$PWD ;; esac

# --- 1. environment (~10 s) ----------------------------------------------------------------
if command -v nvidia-smi > /dev/null; then
  step nvidia-smi 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
ENV_PY=$(mktemp /tmp/gpu_suite_env.XXXXXX.py)
cat > "$ENV_PY" << 'EOF'
# Versions (the carried flax must be the one imported), backend and devices -> env.json.
import importlib.metadata as md, json, os, sys
import jax
versions = {}
for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "ml_collections",
             "numpy", "pytest", "triton", "grain"):
  try:
    versions[name] = md.version(name)
  except md.PackageNotFoundError:
    versions[name] = None
import flax
env = {"python": sys.version, "versions": versions, "flax_file": flax.__file__,
       "flax_imported": flax.__version__, "backend": jax.default_backend(),
       "devices": [str(d) for d in jax.devices()],
       "device_kind": jax.devices()[0].device_kind}
print(json.dumps(env, indent=1))
with open(os.path.join(sys.argv[1], "env.json"), "w") as f:
  json.dump(env, f, indent=1)
EOF
step env 20 "$PY" "$ENV_PY" "$OUT"
rm -f "$ENV_PY"

# The device's own XLA:GPU target config beside the spec `plan --target` ships for this chip
# (experiments/plan/gpu_specs/): a field the plan has wrong shows here (~10 s).
if [ "$SMOKE" = 1 ]; then
  step gpu-spec 60 "$PY" -m experiments.tools.bench.gpu_spec_check --target=h100:1 \
    --json "$OUT/gpu_spec.json"
else
  step gpu-spec 30 "$PY" -m experiments.tools.bench.gpu_spec_check --json "$OUT/gpu_spec.json"
fi

# --- 2. kernels against their references on the real GPU (~40 s + ~40 s) -------------------
# GPU-marked tests: the Triton readout and the fused readout vs XLA, values and gradients
# (7 cases, 39 s on an H200 with a warm compilation cache). No -x: every case reports.
step pytest-gpu 60 "$PY" -m pytest -v -m gpu --tb=short -p no:cacheprovider tests/kernels \
  tests/lngram_jax/test_fused.py tests/lngram_jax/test_pallas_layer.py
# Layer first: on a GPU its "pallas"/"pallas_fused" readouts run the real Triton kernels
# (interpret mode only on CPU) against "absorbed", values and every gradient. Then the
# interpret-mode Triton cases; the lowering checks are host-independent and the Mosaic (TPU)
# cases irrelevant here (CPU CI runs both), and so are the float64 cases, which took the
# whole step on an H200 (CPU CI runs them).
step pytest-kernels 50 "$PY" -m pytest -v -m "not gpu" \
  -k "not bench and not lower and not mosaic and not float64" \
  --tb=short -p no:cacheprovider --durations=10 tests/lngram_jax/test_pallas_layer.py \
  tests/lngram_jax/test_fused.py tests/kernels/test_sink_readout_fused.py \
  tests/kernels/test_sink_readout_kernel.py

# --- 3. kernel benchmark: layer rows, then readout r64 / r121 / r512 (~70 s) ----------------
if [ "$SMOKE" = 1 ]; then
  step kernels-bench 75 "$PY" -m experiments.tools.bench.kernels --shape tiny --json "$OUT/kernels_bench.json"
else
  step kernels-bench 75 "$PY" -m experiments.tools.bench.kernels --repeats 3 --inner 5 \
    --json "$OUT/kernels_bench.json"
fi

# --- 4. Lngram layer vs dense layer at the gpu shape, three targets (~50 s) -----------------
# Readout forms "literal"/"pallas" at this shape are in the kernels table above. The one-bit
# surrogate's three backward forms side by side: "auto" picks "blocks" from CPU runs, and
# the onebit fwd+bwd measured 5.09 ms with "gather" (2026-11-29) and 6.42 ms with
# "blocks" (2026-12-04) on an H200 in two runs; this row settles it in one.
if [ "$SMOKE" = 1 ]; then
  step lngram-bench 60 "$PY" -m experiments.tools.bench.layer --shape tiny --repeats 1 \
    --json "$OUT/lngram_bench.json"
else
  step lngram-bench 70 "$PY" -m experiments.tools.bench.layer --shape gpu --repeats 10 \
    --readouts absorbed --surrogates none,onebit --surrogate-impls gather,blocks,triton \
    --json "$OUT/lngram_bench.json"
fi

# --- 5. PVM decode overhead, d 1024 x 24 layers, 3 branches (~70 s) -------------------------
if [ "$SMOKE" = 1 ]; then
  step decode-wide 90 "$PY" -m experiments.tools.bench.vlm_decode --shape wide --set d_model=64 \
    --set n_layers=3 --set n_heads=4 --set n_kv_heads=2 --set head_dim=16 --set ffn_dim=128 \
    --set image=32 --set vit_dim=16 --set vit_layers=1 --set vit_ffn=32 --set latent_dim=32 \
    --set pvm_head_dim=16 --set branch_layers=0.2 --batch 2 --prompt 8 --new-tokens 4 \
    --repeats 2 --json "$OUT/decode_wide.json"
else
  # The paper's backbone widths (Qwen3-VL-8B: d 4096, 36 layers, 32/8 heads of 128, FFN
  # 12288, three branches of latent 512 at layers 8/16/24): one branch is ~4% of a layer
  # there, as in the paper (the byte vocabulary leaves out its 0.6B-parameter head).
  step decode-8b 130 "$PY" -m experiments.tools.bench.vlm_decode --shape wide --set d_model=4096 \
    --set n_layers=36 --set n_heads=32 --set n_kv_heads=8 --set head_dim=128 \
    --set ffn_dim=12288 --set branch_layers=7.15.23 --batch 8 --prompt 64 --new-tokens 128 \
    --repeats 5 --json "$OUT/decode_8b.json"
  # The same three branches measured at batch 1, the paper's TPOT setting: one branch
  # projected from batch 1 (pvm-cost, 2026-12-04) gave +3.8% where batch 8 gave +1.8%.
  step decode-8b-b1 130 "$PY" -m experiments.tools.bench.vlm_decode --shape wide --set d_model=4096 \
    --set n_layers=36 --set n_heads=32 --set n_kv_heads=8 --set head_dim=128 \
    --set ffn_dim=12288 --set branch_layers=7.15.23 --batch 1 --prompt 64 --new-tokens 128 \
    --repeats 5 --json "$OUT/decode_8b_b1.json"
  step decode-wide 85 "$PY" -m experiments.tools.bench.vlm_decode --shape wide --batch 8 \
    --prompt 64 --new-tokens 128 --repeats 10 --json "$OUT/decode_wide.json"
fi

# --- 5b. PVM decode cost at Qwen3-VL-8B widths with its 151,936-token vocabulary (~90 s) ----
# experiments/tools/bench/pvm_decode_cost.py: base at depths 18 and 36, PVM (one branch) at 36,
# projected to 3 branches in 36 layers (paper, one H200: 24.28 -> 25.46 ms/token). Runs on
# what steps 1-5 leave of BUDGET_S.
if [ "$SMOKE" = 1 ]; then
  step pvm-cost 60 "$PY" -m experiments.tools.bench.pvm_decode_cost --widths tiny --dtype float32 \
    --new-tokens 4 --visual 8 --prompt 8 --repeats 2 --json "$OUT/pvm_cost.json"
else
  step pvm-cost 120 "$PY" -m experiments.tools.bench.pvm_decode_cost --widths 8b --depths 18,36 \
    --new-tokens 64 --repeats 5 --json "$OUT/pvm_cost.json"
fi

# --- 5c. Lngram v2 training-step cost at Qwen3-1.7B widths, Table 13's recipe (~150 s) ---
# (2026-12-04 on an H200: checkpoint 23 s, the baseline's first compile 29 s without the
# compilation cache; 120 s ended inside the memory model's compile.) Then both rows again
# with the "gather" surrogate backward (see step 4) on the same checkpoint (--dir: reused).
# experiments/tools/bench/hf_train_step.py: a synthetic checkpoint written by the import path,
# the recipe with Lngram v2 at layers 2 and 14 (1-based) against it without memory; the
# step-0 logits must agree before timing. 16 of the 28 layers, so that the checkpoint
# write and two compiles fit the step (a shallower backbone overstates the overhead).
if [ "$SMOKE" = 1 ]; then
  step hf-train-step 60 "$PY" -m experiments.tools.bench.hf_train_step --tiny --repeats 2 \
    --json "$OUT/hf_train_step.json"
else
  step hf-train-step 180 "$PY" -m experiments.tools.bench.hf_train_step --layers 16 \
    --memory-layers 1,13 --repeats 5 --dir /tmp/hf_train_step_ckpt \
    --json "$OUT/hf_train_step.json"
  step hf-step-gather 100 "$PY" -m experiments.tools.bench.hf_train_step --layers 16 \
    --memory-layers 1,13 --repeats 5 --surrogate-impl gather --dir /tmp/hf_train_step_ckpt \
    --json "$OUT/hf_train_step_gather.json"
fi

# STEP 6: VLM training (not part of this suite)
# (Steps 1-5 may use the whole default BUDGET_S; a step added here runs only if the ones
# above finish early, or with a larger BUDGET_S.)

# --- 7. the paper's Table 12: 2B decoder (28 x d 2048), eight Lngram rows (~240 s) ---------
# Prefill 1024 and decode B 1/8 latency + memory per row, overheads vs the baseline, and one
# Lngram layer's decode step. Rows run baseline and r64/m4/KV8 first and the JSON is
# rewritten after each, so a step cut short keeps what it measured. The unrolled DecoderLM
# (--impl loop): on an H200 (2026-12-04) the scanned blocks decoded 1.8x slower than it
# (3.64 vs 2.01 ms/token at B 1) while prefill agreed (scan / loop 1.01), so scanned
# decode rows are not the model's; one prefill length keeps eight rows' compiles in the
# step. Like any step after 5, it runs on what steps 1-5 leave of BUDGET_S.
if [ "$SMOKE" = 1 ]; then
  step lm-efficiency 170 "$PY" -m experiments.tools.bench.lm_efficiency --smoke \
    --loop-check r64/m4/KV8 --json "$OUT/lm_efficiency.json"
else
  step lm-efficiency 250 "$PY" -m experiments.tools.bench.lm_efficiency --repeats 5 --impl loop \
    --lengths 1024 --config-limit-s 45 --budget-s 240 --json "$OUT/lm_efficiency.json"
fi

# --- 8. one r512/m4/KV8/mem256 layer, forward and forward+backward at B 4, T 1024 (~60 s) ---
# Target <= 10 ms forward+backward and <= 3 GiB (the authors' streaming module: 292 ms,
# 8.2 GiB). Runs on what the steps above leave of BUDGET_S.
if [ "$SMOKE" = 1 ]; then
  step lngram-r512 60 "$PY" -m experiments.tools.bench.layer --shape tiny --repeats 1 \
    --readouts absorbed --surrogates onebit --json "$OUT/lngram_r512.json"
else
  step lngram-r512 60 "$PY" -m experiments.tools.bench.layer --shape gpu_r512 --repeats 5 \
    --readouts pallas_fused,absorbed --surrogates onebit --json "$OUT/lngram_r512.json"
fi

# --- 8b. the MoE FFN of the 0.6B recipes (d 768, 8 experts of 1,024, top-2, one shared) ---
# grouped dispatch (ragged_dot: a grouped GEMM on GPU) and the per-token loop against the
# dense SwiGLU of equal active parameters (~40 s). Runs on what the steps above leave.
if [ "$SMOKE" = 1 ]; then
  step moe-ffn 60 "$PY" -m experiments.tools.bench.moe_efficiency --tokens 256 --d_model 64 \
    --expert_dim 64 --repeats 1
else
  step moe-ffn 60 "$PY" -m experiments.tools.bench.moe_efficiency --tokens 4096 --d_model 768 \
    --expert_dim 1024 --repeats 5
fi

# --- 9. scale check: the main arms at d 512 x 8 layers, 16k tokens/step, 1,000 steps -------
# (experiments/tools/bench/scale_check.py, ~9 min). Needs its own slot: it runs on what the steps
# above leave of BUDGET_S, with its deadline 20 s inside the step's limit; to run it alone:
#   SKIP_STEPS="pytest-gpu pytest-kernels kernels-bench lngram-bench decode-8b decode-wide \
#     pvm-cost hf-train-step lm-efficiency lngram-r512 moe-ffn" BUDGET_S=560 OUT=<dir> \
#     bash experiments/tools/bench/gpu_suite.sh
# (or experiments/tools/bench/scale_check.sh). Curves: $OUT/scale/<arm>.jsonl; the finished
# arm x seeds' records in $OUT/scale_records.tar.gz. Its training text is SCALE_CHECK_DATA,
# by default `pkg:transformers`, the source of the transformers package the GPU image holds
# (51.0 MB of training text with transformers 5.24; 1,000 steps read 0.32 of it), which the
# standard library's 10.9 MB is too small to replace; seeds pair only on the same data, so
# every run of the family keeps the same package and version. SCALE_CHECK_SEEDS (default 0,1).
SCALE_DATA=${SCALE_CHECK_DATA:-pkg:transformers}
SCALE_SEEDS=${SCALE_CHECK_SEEDS:-0,1}
scale_left=$(awk -v b="$BUDGET_S" -v e="$(elapsed "$SUITE_T0")" 'BEGIN { printf "%d", b - e }')
scale_budget=$(( scale_left > 550 ? 510 : scale_left - 40 ))
if [ "$SMOKE" = 1 ]; then
  step scale-check 120 "$PY" -m experiments.tools.bench.scale_check --smoke --arms baseline,lngram_r16 \
    --out "$OUT/scale" --cache-dir "$JAX_COMPILATION_CACHE_DIR"
elif [ "$scale_budget" -gt 60 ]; then
  step scale-check 550 "$PY" -m experiments.tools.bench.scale_check --out "$OUT/scale" \
    --budget-s "$scale_budget" --cache-dir "$JAX_COMPILATION_CACHE_DIR" \
    --data "$SCALE_DATA" --seeds "$SCALE_SEEDS" --records "$OUT/scale/records"
  if compgen -G "$OUT/scale/records/*_s*" > /dev/null; then
    tar -czf "$OUT/scale_records.tar.gz" -C "$OUT/scale/records" .
  fi
else
  echo "=== [scale-check] SKIPPED: ${scale_left}s of the ${BUDGET_S}s budget left ===" | tee -a "$LOG"
  printf 'scale-check\tskipped\t0\t%s\n' "python -m experiments.tools.bench.scale_check" >> "$STEPS"
fi
