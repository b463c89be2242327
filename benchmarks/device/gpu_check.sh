#!/usr/bin/env bash
# The one GPU script: on the device machine, from the repo root, after benchmarks/device/prepare.sh
# ran here. Usage: bash benchmarks/device/gpu_check.sh [tests] [latency] [attention] [throughput]
# [serve] [stream1] [timeline] [prefix] [qps] [interference] [structured] [offload] [startup]
# [gemm] [fusion] [sampling] [verify] [tiles] [pdl] [gate] [ab] [prefillattn] [flashinfer] [ttft] [dsv4] [dsv4model] [tp] [deferred] (tp: on nvidia-h200-x2)
# (default: all but attention). API_SERVERS=N serves with --api-server-count N. Logs and JSON results go to $OUT;
# a short table prints last.
set -uo pipefail
OUT=${OUT:-/tmp/openinfer-out}
mkdir -p "$OUT"
stages=${*:-tests latency throughput serve stream1 timeline prefix qps interference structured offload startup}
API_SERVERS=${API_SERVERS:-1}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
# PYTHONFAULTHANDLER: a python that `timeout -s ABRT` stops prints where each thread was.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OPENINFER_GPU_RESULTS=$OUT PYTHONFAULTHANDLER=1
# FlashInfer, when benchmarks/device/flashinfer_pack.sh made .fi/ and the call carries it. Its
# JIT builds go to $FLASHINFER_WORKSPACE_BASE/.cache; a previous call's (the fi-jit.tgz.part-*
# files the `flashinfer` stage returns, copied into .fi/) saves compiling them again.
if [ -f .fi/flashinfer.tar.xz ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .fi/*.whl \
    && tar -xJf .fi/flashinfer.tar.xz -C /tmp/site || exit 1
  # pip dates what it installs now, newer than a carried JIT build's objects: ninja would then
  # rebuild every module that includes tvm_ffi's headers (minutes each, inside the first
  # engine start). Dated back, the carried builds are up to date.
  find /tmp/site/tvm_ffi /tmp/site/flashinfer -exec touch -h -d 2000-01-01 {} +
  export FLASHINFER_WORKSPACE_BASE=/tmp/fi-jit FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
  if ls .fi/fi-jit.tgz.part-* >/dev/null 2>&1; then
    mkdir -p /tmp/fi-jit && cat .fi/fi-jit.tgz.part-* | tar -xzf - -C /tmp/fi-jit
  fi
fi
export OPENINFER_CACHE_DIR=/tmp/openinfer-cache
M4=/tmp/qwen3-4b M8=/tmp/qwen3-8b
python3 - <<'PY'
from openinfer_qwen3.shapes import write_config_folder
write_config_folder("Qwen3-4B", "/tmp/qwen3-4b")
write_config_folder("Qwen3-8B", "/tmp/qwen3-8b")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
stage() { echo "=== $1 ($(date +%T))"; }
has() { [[ " $stages " == *" $1 "* ]]; }
# FlashInfer's JIT builds come back as fi-jit.tgz.part-* (under the 16 MB a file may have).
save_jit() { [ -d /tmp/fi-jit ] && rm -f "$OUT"/fi-jit.tgz.part-* \
  && tar -czf - -C /tmp/fi-jit . | split -b 15M - "$OUT/fi-jit.tgz.part-"; }
# A server runs as a background python (not a subshell) so `kill $server` reaches it.
wait_ready() {  # $1: the server's pid; until /health answers, it exits, or 180 s pass
  python3 - "$1" <<'PY'
import os, sys, time, urllib.request as u
for _ in range(900):
    try:
        u.urlopen("http://127.0.0.1:8000/health"); sys.exit(0)
    except OSError:
        pass
    try:
        os.kill(int(sys.argv[1]), 0)
    except OSError:
        sys.exit("the server exited before it was ready; see its log")
    time.sleep(0.2)
sys.exit("the server was not ready after 180 s")
PY
}
stop() { kill -TERM "$1"; wait "$1"; }

if has tests; then
  stage "kernel tests, compiled, every size"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-kernels/tests packages/openinfer-offload/tests 2>&1 | tail -25 | tee "$OUT/kernel_tests.log"
  stage "golden gate vs transformers (Qwen3-4B shapes, bf16)"
  timeout 420 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu \
    --ignore=tests/gpu/test_golden_deepseek_v4_gpu.py 2>&1 | tail -40 | tee "$OUT/golden_tests.log"
fi
if has gate; then
  # A quicker gate for a kernel change than `tests`: the golden gate and the kernel tests of
  # the step's norm, rotary and attention kernels (GATE_TESTS to name others), compiled.
  stage "golden gate vs transformers (Qwen3-4B shapes, bf16)"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu \
    --ignore=tests/gpu/test_golden_deepseek_v4_gpu.py --ignore=tests/gpu/test_start_kernels_gpu.py \
    --ignore=tests/gpu/test_tp_gpu.py --ignore=tests/gpu/test_tp_deepseek_v4_gpu.py 2>&1 \
    | tail -30 | tee "$OUT/golden_tests.log"
  stage "kernel tests: norms, q/k norm + rotary, attention, compiled"
  k=packages/openinfer-kernels/tests/kernels
  timeout 240 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    ${GATE_TESTS:-$k/test_rms_norm.py $k/test_qk_norm_rope.py $k/test_paged_attention_triton.py $k/test_gemm.py} \
    2>&1 | tail -8 | tee "$OUT/gate_kernel_tests.log"
fi
if has tp; then
  M32=/tmp/qwen3-32b
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-32B', '$M32')"
  stage "tensor parallelism: TP=2 against one GPU, Qwen3-8B shapes, teacher-forced"
  timeout 400 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu/test_tp_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/tp_tests.log"
  stage "tensor and expert parallelism: DeepSeek-V4 (3 layers against one GPU; all 43 layers served)"
  timeout 900 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu/test_tp_deepseek_v4_gpu.py \
    2>&1 | tail -15 | tee "$OUT/tp_dsv4_tests.log"
  for size in 8b 32b; do
    model=$M8; [ "$size" = 32b ] && model=$M32
    for tp in 1 2; do
      stage "batch-1 latency, Qwen3-${size^^}, TP=$tp"
      timeout 240 python3 -m openinfer_server.cli bench latency $model --load-format dummy \
        --max-num-seqs 4 --max-model-len 4096 --input-len 128 --output-len 128 --num-iters 3 \
        --tensor-parallel-size $tp --result-file "$OUT/latency-qwen3-$size-tp$tp.json" \
        | grep -E "TPOT|floor"
      stage "offline throughput 128/128 x 512, Qwen3-${size^^}, TP=$tp"
      timeout 300 python3 -m openinfer_server.cli bench throughput $model --load-format dummy \
        --max-num-seqs 512 --max-model-len 4608 --num-prompts 512 --input-len 128 \
        --output-len 128 --tensor-parallel-size $tp \
        --result-file "$OUT/throughput-$size-128-tp$tp.json" | tail -3
    done
  done
fi
if has dsv4; then
  DSV4_TESTS="test_fp8_linear test_fp4_moe test_fp4_moe_decode test_sparse_attention test_indexer test_mhc test_compress_triton test_rms_rotary"
  stage "DeepSeek-V4 kernel tests, compiled, every size"
  timeout 180 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    $(for t in $DSV4_TESTS; do echo packages/openinfer-kernels/tests/kernels/$t.py; done) 2>&1 \
    | tail -25 | tee "$OUT/dsv4_kernel_tests.log"
  stage "DeepSeek-V4 kernels against their read floors"
  timeout 60 python3 benchmarks/device/dsv4_gemm_bench.py 2>&1 | tee "$OUT/dsv4-gemm.log" | tail -30
  stage "DeepSeek-V4 FP4 experts at decode sizes: grouped vs decode path, candidate tiles"
  timeout 180 python3 benchmarks/device/dsv4_moe_sweep.py 2>&1 | tee "$OUT/dsv4-moe-sweep.log" | tail -22
  timeout 60 python3 benchmarks/device/dsv4_attention_bench.py --json "$OUT/dsv4-attention.json" 2>&1 | tail -20
  timeout 45 python3 benchmarks/device/dsv4_mhc_bench.py 2>&1 | tee "$OUT/dsv4-mhc.log" | tail -15
fi
if has dsv4 || has dsv4model; then
  stage "DeepSeek-V4 golden gate vs transformers (V4-Flash widths, 3 layers, FP8/FP4 weights, bf16)"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -s -m gpu \
    tests/gpu/test_golden_deepseek_v4_gpu.py 2>&1 | tail -40 | tee "$OUT/dsv4_golden.log"
  stage "DeepSeek-V4 decode step, kernel by kernel (3 layers, batch 1 and 64)"
  timeout 150 python3 benchmarks/device/dsv4_profile.py --json "$OUT/dsv4-profile.json" 2>&1 \
    | tee "$OUT/dsv4-profile.log" | tail -70
  stage "DeepSeek-V4 launches per layer and decode time, eager and graphed (V4-Flash widths)"
  timeout 240 python3 benchmarks/device/dsv4_launches.py --batches 1,64 --json "$OUT/dsv4-launches.json" 2>&1 | tee "$OUT/dsv4-launches.log" | tail -25
  stage "DeepSeek-V4 decode time per layer, batch 1 and 64 (V4-Flash widths)"
  timeout 150 python3 benchmarks/device/dsv4_decode.py --layers ${DSV4_LAYERS:-6} \
    --json "$OUT/dsv4-decode.json" 2>&1 | tail -8
  # V4-Flash cut to DSV4_BENCH_LAYERS layers (all 43 need two H200s): the engine's own
  # batch-1 latency with CUDA graphs against the weight-read floor of the same layers.
  D4=/tmp/dsv4-flash-cut
  python3 - "$D4" "${DSV4_BENCH_LAYERS:-12}" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "tests/gpu")
from dsv4_transformers import transformers_config
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
config = json.loads(transformers_config(int(sys.argv[2])).to_json_string())
config["architectures"] = ["DeepseekV4ForCausalLM"]
(out / "config.json").write_text(json.dumps(config))
write_tokenizer_files(out)
PY
  stage "DeepSeek-V4 batch-1 latency, ${DSV4_BENCH_LAYERS:-12} of V4-Flash's layers"
  timeout 240 python3 -m openinfer_server.cli bench latency $D4 --load-format dummy --max-num-seqs 4 \
    --max-model-len 4096 --input-len 128 2048 --output-len 64 --num-iters 3 \
    --result-file "$OUT/latency-dsv4-cut.json" 2>&1 | tail -12
fi
if has latency; then
  stage "batch-1 latency, Qwen3-4B"
  timeout -s ABRT 180 python3 -m openinfer_server.cli bench latency $M4 --load-format dummy --max-num-seqs 4 --max-model-len 4096 \
    --input-len 128 --output-len 256 --num-iters 5 --result-file "$OUT/latency-qwen3-4b.json"
  stage "decode breakdown, Qwen3-4B"
  timeout -s ABRT 120 python3 benchmarks/device/decode_breakdown.py $M4 --json "$OUT/breakdown-qwen3-4b.json"
  stage "TTFT 128 / 2048 and TPOT, Qwen3-8B"
  timeout 180 python3 -m openinfer_server.cli bench latency $M8 --load-format dummy --max-num-seqs 4 --max-model-len 4096 \
    --input-len 128 2048 --output-len 64 --num-iters 10 --result-file "$OUT/latency-qwen3-8b.json"
fi
if has ab; then
  # Batch-1 latency of this tree against a baseline on the same machine, runs interleaved
  # (base, new, base, new, ...): AB_BASE names a folder of the baseline's openinfer wheels
  # (benchmarks/device/ab_base.sh COMMIT makes .ab-base), carried with the call. AB_CASES:
  # 4b (TPOT), 8b (TPOT, TTFT at 2048), 8b-long (TTFT at 8192).
  base=${AB_BASE:-.ab-base}
  [ -d "$base" ] || { echo "ab: no baseline wheels in $base"; exit 1; }
  rm -rf /tmp/site-base && cp -r /tmp/site /tmp/site-base && rm -rf /tmp/site-base/openinfer_*
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-base \
    "$base"/openinfer_*.whl || exit 1
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for case in ${AB_CASES:-4b 8b}; do
      case $case in
        4b) args="$M4 --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 5" ;;
        8b) args="$M8 --max-model-len 4096 --input-len 128 2048 --output-len 64 --num-iters 10" ;;
        8b-long) args="$M8 --max-model-len 8448 --input-len 8192 --output-len 8 --num-iters 5" ;;
      esac
      for side in base new; do
        stage "A/B batch-1 latency, $case, $side, round $round"
        site=/tmp/site; [ $side = base ] && site=/tmp/site-base
        PYTHONPATH=$site timeout -s ABRT 180 python3 -m openinfer_server.cli bench latency $args \
          --load-format dummy --max-num-seqs 4 --result-file "$OUT/ab-$case-$side-$round.json" \
          | grep -E "TTFT|TPOT|floor|input"
      done
    done
  done
fi
if has prefillattn; then
  # Prompt attention's tile settings and launch order (Qwen3-8B heads, 2048 / 8192 tokens).
  stage "prompt attention tiles, Triton split and prefill kernels"
  timeout 500 python3 benchmarks/device/prefill_attention.py --json "$OUT/prefill-attention.json" \
    2>&1 | tail -14
fi
if has fusion; then
  # Issue 13: o_proj and down with their split-K sum inside the add + norm (gemm/tiles.py's
  # SUM_FUSED_TILES, picked by the tiles stage).
  stage "kernel tests: the linear and q/k norm + rotary, compiled"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-kernels/tests/kernels/test_gemm.py \
    packages/openinfer-kernels/tests/kernels/test_qk_norm_rope.py 2>&1 | tail -5 | tee "$OUT/fusion_tests.log"
  for size in 4b 8b; do
    stage "batch-1 latency, Qwen3-${size^^}"
    model=$M4; [ $size = 8b ] && model=$M8
    timeout 180 python3 -m openinfer_server.cli bench latency $model --load-format dummy \
      --max-num-seqs 4 --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 5 \
      --result-file "$OUT/latency-qwen3-$size-fused-sum.json" | grep -E "TPOT|floor"
  done
fi
if has verify; then
  # The sampler's kernels and the start-up compile round, compiled (their CPU tests run in CI).
  stage "kernel tests: sampling, compiled; nothing compiles after start-up's round"
  timeout 400 python3 -m pytest -p no:cacheprovider -q -m "gpu or not gpu" \
    packages/openinfer-kernels/tests/kernels/test_sampling.py \
    packages/openinfer-kernels/tests/kernels/test_sampling_flashinfer.py \
    packages/openinfer-kernels/tests/kernels/test_top_p_sample.py \
    tests/gpu/test_start_kernels_gpu.py 2>&1 | tail -8 | tee "$OUT/verify_tests.log"
fi
if has sampling; then
  # Sampling cost per step by batch and parameters: the Sampler (Triton race kernels, a sort
  # for top-k / top-p) against FlashInfer's sampling where .fi is carried.
  for kind in ${SAMPLING_KINDS:-triton flashinfer}; do
    stage "sampling, ms per step, OPENINFER_SAMPLING=$kind"
    OPENINFER_SAMPLING=$kind timeout 300 python3 benchmarks/device/sampling_bench.py \
      --json "$OUT/sampling-$kind.json" 2>&1 | tail -10
  done
  save_jit
  stage "kernel tests: sampling, compiled"
  timeout 200 python3 -m pytest -p no:cacheprovider -q -m "gpu or not gpu" \
    packages/openinfer-kernels/tests/kernels/test_sampling.py \
    packages/openinfer-kernels/tests/kernels/test_sampling_flashinfer.py \
    packages/openinfer-kernels/tests/kernels/test_top_p_sample.py 2>&1 | tail -3 | tee "$OUT/sampling_tests.log"
  # Served, Qwen3-8B 128/128 x 1024 at 512: greedy against Qwen3's recommended sampling
  # (temperature 0.6, top_p 0.95, top_k 20) and top_p alone.
  python3 -m openinfer_server.cli serve $M8 --load-format dummy --max-num-seqs 512 \
    --max-model-len 4608 --port 8000 >> "$OUT/serve.log" 2>&1 &
  server=$!
  if wait_ready $server; then
    for mode in ${SAMPLING_MODES:-greedy qwen3 top-p}; do
      flags=""
      [ $mode = qwen3 ] && flags="--temperature 0.6 --top-p 0.95 --top-k 20"
      [ $mode = top-p ] && flags="--temperature 1.0 --top-p 0.9"
      stage "served throughput, Qwen3-8B 128/128 x 1024 at 512, sampling $mode"
      timeout 200 python3 -m openinfer_server.cli bench serve --random-input-len 128 \
        --random-output-len 128 --num-prompts 1024 --max-concurrency 512 --request-rate inf \
        --ignore-eos --tokenizer $M8 $flags --result-file "$OUT/serve-8b-128-sampling-$mode-$SECONDS.json" \
        | grep -E "Output token throughput|TPOT|Failed"
    done
  fi
  stop $server
fi
if has tiles; then
  stage "o_proj / down + add-norm, split-K sum in the norm: tiles for SUM_FUSED_TILES"
  timeout 480 python3 benchmarks/device/fused_sum_gemm.py --json "$OUT/fused-sum-gemm.json" \
    2>&1 | tail -80
fi
if has gemm; then
  stage "small-batch linear tiles against cuBLAS and the read floor, Qwen3-4B/8B shapes"
  timeout 300 python3 benchmarks/device/small_gemm.py --json "$OUT/small-gemm.json" 2>&1 | tail -24
  # The default is the Triton small-batch linear with PDL (the tests stage): the gate and the
  # step once more on the path it replaced, cuBLAS without PDL.
  stage "golden gate, OPENINFER_LINEAR=cublas OPENINFER_PDL=0"
  OPENINFER_LINEAR=cublas OPENINFER_PDL=0 timeout 420 python3 -m pytest -p no:cacheprovider -q \
    -m gpu tests/gpu 2>&1 | tail -15 | tee "$OUT/golden_tests_cublas.log"
  stage "decode breakdown, Qwen3-4B, OPENINFER_LINEAR=cublas OPENINFER_PDL=0"
  OPENINFER_LINEAR=cublas OPENINFER_PDL=0 timeout 120 python3 benchmarks/device/decode_breakdown.py \
    $M4 --json "$OUT/breakdown-qwen3-4b-cublas.json"
fi
if has pdl; then
  # Programmatic dependent launch (OPENINFER_PDL) with cuBLAS and with the Triton small-batch
  # linear (OPENINFER_LINEAR), each on and off; kernel tests compiled with PDL on.
  stage "kernel tests, compiled, OPENINFER_PDL=1"
  OPENINFER_PDL=1 timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-kernels/tests 2>&1 | tail -5 | tee "$OUT/kernel_tests_pdl.log"
  # model:linear-pdl
  for run in ${PDL_RUNS:-4b:cublas-0 4b:cublas-1 4b:triton-0 4b:triton-1 8b:cublas-0 8b:triton-1}; do
    size=${run%%:*} combo=${run#*:}
    IFS=- read -r linear pdl <<< "$combo"
    model=$M4; [ "$size" = 8b ] && model=$M8
    stage "batch-1 latency, Qwen3-${size^^}, OPENINFER_LINEAR=$linear OPENINFER_PDL=$pdl"
    OPENINFER_LINEAR=$linear OPENINFER_PDL=$pdl timeout 180 \
      python3 -m openinfer_server.cli bench latency $model --load-format dummy --max-num-seqs 4 \
      --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 \
      --result-file "$OUT/latency-qwen3-$size-$combo.json" | grep -E "TPOT|floor"
  done
  if [ -n "${PDL_GOLDEN:-}" ]; then
    stage "golden gate, OPENINFER_LINEAR=triton OPENINFER_PDL=1"
    OPENINFER_LINEAR=triton OPENINFER_PDL=1 timeout 420 python3 -m pytest -p no:cacheprovider \
      -q -m gpu tests/gpu 2>&1 | tail -15 | tee "$OUT/golden_tests_pdl.log"
  fi
fi
if has ttft; then
  stage "where TTFT goes: first-token steps of 2048 and 8192 tokens, Qwen3-8B"
  timeout 200 python3 benchmarks/device/prefill_breakdown.py $M8 --prompt-len 2048 8192 \
    --iters 3 --json "$OUT/prefill-breakdown-qwen3-8b.json" > "$OUT/prefill-breakdown-8b.log" 2>&1
  grep -E "^prompt|^timeline" "$OUT/prefill-breakdown-8b.log"
  stage "the elementwise kernels of a layer against their bytes (Qwen3-8B heads)"
  timeout 120 python3 benchmarks/device/norm_bench.py --json "$OUT/norm-bench.json"
  stage "o_proj / down + add + norm: the residual in cuBLAS's epilogue or in the norm kernel"
  timeout 120 python3 benchmarks/device/residual_gemm.py --json "$OUT/residual-gemm.json"
fi
if has flashinfer; then
  if [ -n "${FI_GOLDEN:-}" ]; then
    # Every step on FlashInfer's kernels, so the gate covers them (no CUDA graphs then).
    stage "golden gate, OPENINFER_ATTENTION_BACKEND=flashinfer OPENINFER_FLASHINFER_EVERY_STEP=1"
    OPENINFER_ATTENTION_BACKEND=flashinfer OPENINFER_FLASHINFER_EVERY_STEP=1 timeout 420 python3 -m pytest -p no:cacheprovider \
      -q -m gpu tests/gpu/test_golden_qwen3_gpu.py 2>&1 | tail -15 | tee "$OUT/golden_tests_flashinfer.log"
    save_jit
  fi
  for backend in ${FI_TTFT:-}; do
    stage "TTFT 2048 / 8192, Qwen3-8B, --attention-backend $backend"
    timeout 240 python3 -m openinfer_server.cli bench latency $M8 --load-format dummy \
      --max-num-seqs 4 --max-model-len 8448 --input-len 2048 8192 --output-len 16 \
      --num-iters 5 --attention-backend $backend --result-file "$OUT/ttft-qwen3-8b-$backend.json"
  done
  if [ -z "${FI_SKIP_TESTS:-}" ]; then
    stage "flashinfer backend: kernel tests, compiled (JIT builds on first use)"
    timeout ${FI_TESTS_TIMEOUT:-560} python3 -m pytest -p no:cacheprovider -q -m "gpu or not gpu" \
      --durations=8 packages/openinfer-kernels/tests/kernels/test_flashinfer_backend.py 2>&1 \
      | tail -40 | tee "$OUT/flashinfer_tests.log"
    save_jit
  fi
  if [ -z "${FI_SKIP_AB:-}" ]; then
    stage "attention backends A/B: decode 128 x 4k and 1 x 4k, prefill 2048 and 8192"
    timeout 300 python3 benchmarks/device/attention_ab.py --json "$OUT/attention-ab.json"
  fi
fi
if has attention; then
  stage "decode attention tile settings"
  timeout 240 python3 benchmarks/device/decode_attention.py --json "$OUT/decode-attention.json"
fi
if has throughput; then
  stage "offline throughput, Qwen3-8B, 128/128 x 512"
  timeout 200 python3 -m openinfer_server.cli bench throughput $M8 --load-format dummy --max-num-seqs 512 --max-model-len 4608 \
    --num-prompts 512 --input-len 128 --output-len 128 --result-file "$OUT/throughput-8b-128.json"
  stage "offline throughput, Qwen3-8B, 2048/2048 x 128"
  timeout 300 python3 -m openinfer_server.cli bench throughput $M8 --load-format dummy --max-num-seqs 128 --max-model-len 4608 \
    --num-prompts 128 --input-len 2048 --output-len 2048 --result-file "$OUT/throughput-8b-2048.json"
fi
if has serve; then
  for servers in $API_SERVERS; do
    tag=""; [ "$servers" != 1 ] && tag="-a$servers"
    stage "served throughput, Qwen3-8B, --api-server-count $servers"
    python3 -m openinfer_server.cli serve $M8 --load-format dummy --max-num-seqs 512 \
      --max-model-len 4608 --port 8000 --api-server-count $servers \
      >> "$OUT/serve.log" 2>&1 &
    server=$!
    wait_ready $server
    # Who uses the CPUs while the server is loaded: the engine, the frontends, the clients.
    top -b -d 3 -n 8 -w 150 | grep -E "^ *PID|python|openinf" > "$OUT/top$tag.log" 2>&1 &
    timeout 200 python3 -m openinfer_server.cli bench serve --random-input-len 128 --random-output-len 128 --num-prompts 1024 \
      --max-concurrency 512 --request-rate inf --ignore-eos --tokenizer $M8 \
      --result-file "$OUT/serve-8b-128$tag.json"
    [ -z "$tag" ] && timeout 300 python3 -m openinfer_server.cli bench serve --random-input-len 2048 --random-output-len 2048 --num-prompts 128 \
      --max-concurrency 128 --request-rate inf --ignore-eos --tokenizer $M8 \
      --result-file "$OUT/serve-8b-2048.json"
    stop $server
  done
fi
if has deferred; then
  # Served throughput with load from the first second: every graph captured before ready
  # (`all`, the default) against only the start buckets (`start`, the rest when idle); each
  # process's GPU memory sampled every 0.5 s under the load (the peak printed; runs 67, 72).
  for mode in ${DEFERRED_MODES:-all start}; do
    stage "served throughput right after ready, Qwen3-8B, OPENINFER_CUDA_GRAPHS_AT_START=$mode"
    OPENINFER_CUDA_GRAPHS_AT_START=$mode python3 -m openinfer_server.cli serve $M8 --load-format dummy \
      --max-num-seqs 512 --max-model-len 4608 --port 8000 >> "$OUT/serve.log" 2>&1 &
    server=$!
    if wait_ready $server; then
      (for _ in $(seq 60); do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
         sleep 0.5; done > "$OUT/gpu-memory-$mode.log") &
      sampler=$!
      timeout 200 python3 -m openinfer_server.cli bench serve --random-input-len 128 \
        --random-output-len 128 --num-prompts 1024 --max-concurrency 512 --request-rate inf \
        --ignore-eos --tokenizer $M8 --result-file "$OUT/serve-8b-128-graphs-$mode.json" \
        | grep -E "throughput|TTFT|TPOT|Failed"
      kill $sampler 2>/dev/null
      echo "GPU memory per process, peak MiB (pid, used):"
      sort -t, -k2 -n -r "$OUT/gpu-memory-$mode.log" | sort -s -u -t, -k1,1 | head -4
    fi
    stop $server
  done
fi
if has stream1; then
  # Batch-1 TPOT as a streaming HTTP client sees it, against `bench latency` (the engine's own).
  for size in 4b 8b; do
    model=$M4; [ $size = 8b ] && model=$M8
    stage "batch-1 TPOT through the server, Qwen3-${size^^}"
    python3 -m openinfer_server.cli serve $model --load-format dummy --max-num-seqs 4 \
      --max-model-len 4096 --port 8000 >> "$OUT/serve.log" 2>&1 &
    server=$!
    wait_ready $server && timeout 120 python3 -m openinfer_server.cli bench serve \
      --random-input-len 128 --random-output-len 256 --num-prompts 8 --max-concurrency 1 \
      --request-rate inf --ignore-eos --tokenizer $model --result-file "$OUT/stream1-$size.json"
    stop $server
  done
fi
if has timeline; then
  stage "host cost and GPU idle per decode step, batch 1/64/256/512, plain and overlapped, Qwen3-8B"
  timeout 400 python3 benchmarks/device/step_timeline.py $M8 --batch 1 64 256 512 --steps 30 \
    --profile-batch 256 512 --json "$OUT/timeline-8b.json" > "$OUT/timeline.log" 2>&1
  tail -8 "$OUT/timeline.log"
fi
if has prefix; then
  stage "prefix cache: TTFT cold vs warm by prompt length, Qwen3-4B"
  timeout 300 python3 -m openinfer_server.cli bench prefix $M4 --load-format dummy --max-num-seqs 4 --max-model-len 17408 \
    --input-len 256 1024 4096 16384 --num-iters 10 --result-file "$OUT/prefix-qwen3-4b.json"
  stage "first-token step, cold and warm: wall, GPU time by op, host profile"
  timeout 150 python3 benchmarks/device/prefill_breakdown.py $M4 --prompt-len 256 4096 16384 \
    --json "$OUT/prefill-breakdown-qwen3-4b.json" > "$OUT/prefill-breakdown.log" 2>&1
fi
if has qps; then
  # About 40 s of arrivals per rate up to 8/s; past that 480 prompts (the rates beyond
  # saturation then take as long as the server needs for them). The file is rewritten after
  # each rate, so a timeout keeps the rates done.
  stage "Poisson QPS sweep, 1024/128, Qwen3-4B"
  python3 -m openinfer_server.cli serve $M4 --load-format dummy --max-num-seqs 256 \
    --max-model-len 2048 --port 8000 > "$OUT/serve-qps.log" 2>&1 &
  server=$!
  wait_ready $server && timeout 330 python3 -m openinfer_server.cli bench serve \
    --random-input-len 1024 --random-output-len 128 --ignore-eos --tokenizer $M4 \
    --request-rate 2 4 8 16 32 64 --num-prompts 80 160 320 480 480 480 \
    --result-file "$OUT/qps-qwen3-4b.json"
  stop $server
fi
if has interference; then
  # 32 short requests (128 in, 256 out) stream while an 8192-token prompt arrives every 2 s:
  # with a 2048-token step budget the long prefills are chunked, with 16384 they are not.
  for run in chunked:2048 unchunked:16384; do
    label=${run%%:*} budget=${run#*:}
    echo "=== server for the $label run" >> "$OUT/serve-interference.log"
    stage "short-request ITL while 8k prompts arrive, $label (--max-num-batched-tokens $budget), Qwen3-4B"
    python3 -m openinfer_server.cli serve $M4 --load-format dummy --max-num-seqs 64 \
      --max-model-len 9216 --max-num-batched-tokens $budget --port 8000 \
      >> "$OUT/serve-interference.log" 2>&1 &
    server=$!
    wait_ready $server && timeout 120 python3 -m openinfer_server.cli bench interference \
      --tokenizer $M4 --duration 40 --long-interval 2 --label $label \
      --result-file "$OUT/interference-$label.json"
    stop $server
  done
fi
if has structured; then
  stage "structured output: TPOT with a JSON schema on every request vs none, compile time"
  timeout 420 python3 benchmarks/device/structured_tpot.py $M8 --batch 1 64 --steps 100 \
    --json "$OUT/structured-qwen3-8b.json" 2>&1 | tail -30
fi
if has offload; then
  stage "KV offload: restore copy paths against the pinned copy floor, Qwen3-4B layout"
  timeout 120 python3 benchmarks/device/offload_copy.py --json "$OUT/offload-copy.json" 2>&1 | tail -12
  stage "KV offload: restore TTFT host/disk vs cold vs HBM, multi-turn on vs off, Qwen3-4B"
  # OFFLOAD_ARGS: e.g. --skip-multi-turn, to fit one device call with other stages
  timeout 540 python3 benchmarks/device/offload_restore.py $M4 --json "$OUT/offload-qwen3-4b.json" \
    ${OFFLOAD_ARGS:-} 2>&1 | tail -30 | tee "$OUT/offload.log"
fi
if has startup; then
  stage "what the engine process imports, by cumulative time (python -X importtime, second run)"
  python3 -c "import openinfer_core.engine.engine, openinfer_qwen3.model" >/dev/null 2>&1
  python3 -X importtime -c "import openinfer_core.engine.engine, openinfer_qwen3.model" \
    2> "$OUT/importtime.log"
  sort -t'|' -k2 -n -r "$OUT/importtime.log" | head -25
  stage "a cold start compiles every start-up kernel in its first compile-ahead round"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -m gpu tests/gpu/test_start_kernels_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/start_kernels_test.log"
  start_log() {  # $1: a startup.py JSON: each start's phase lines, as the engine logged them
    python3 - "$1" <<'PY'
import json, sys
for kind, start in json.load(open(sys.argv[1])).items():
    if isinstance(start, dict) and "log" in start:
        print(f"-- {kind} start, {start['ready_s']:.2f} s")
        keys = ("compile ahead", "imported", "KV cache", "CUDA graphs", "warm-up", "step memory", "ready")
        for line in start["log"]:
            if any(k in line for k in keys):
                print("  ", line[:230])
PY
  }
  stage "serve to ready, cold and warm Triton cache, Qwen3-4B"
  timeout 240 python3 benchmarks/device/startup.py $M4 --load-format dummy --json "$OUT/startup-qwen3-4b.json"
  start_log "$OUT/startup-qwen3-4b.json"
  stage "serve to ready, cold and warm, every CUDA graph before ready (OPENINFER_CUDA_GRAPHS_AT_START=all)"
  OPENINFER_CUDA_GRAPHS_AT_START=all timeout 240 python3 benchmarks/device/startup.py $M4 \
    --load-format dummy --json "$OUT/startup-qwen3-4b-all-graphs.json"
  start_log "$OUT/startup-qwen3-4b-all-graphs.json"
  if [ -n "${STARTUP_AB:-}" ]; then  # the A/Bs of runs 43-48
    stage "serve to ready, cold and warm, no compile-ahead (OPENINFER_COMPILE_AHEAD=0: the old default)"
    OPENINFER_COMPILE_AHEAD=0 timeout 240 python3 benchmarks/device/startup.py $M4 --load-format dummy \
      --json "$OUT/startup-qwen3-4b-no-ahead.json"
  fi
  [ "${STARTUP_REAL:-1}" = 0 ] || {
  stage "serve to ready, a real Qwen3-4B checkpoint: from the page cache, then from the disk"
  REAL=/tmp/qwen3-4b-real
  [ -f $REAL/model.safetensors.index.json ] || timeout 300 python3 - "$REAL" <<'PY'
import sys
from openinfer_qwen3.random_weights import write_random_weights
from openinfer_qwen3.shapes import write_config_folder
write_config_folder("Qwen3-4B", sys.argv[1])
write_random_weights(sys.argv[1], sys.argv[1])
PY
  timeout 240 python3 benchmarks/device/startup.py $REAL --json "$OUT/startup-qwen3-4b-real-mmap.json"
  timeout 240 python3 benchmarks/device/startup.py $REAL --cold-disk \
    --json "$OUT/startup-qwen3-4b-real-disk.json"
  [ -n "${STARTUP_AB:-}" ] && OPENINFER_WEIGHT_READ=shards timeout 240 python3 \
    benchmarks/device/startup.py $REAL --json "$OUT/startup-qwen3-4b-real-shards.json"
  }
fi
stage "summary"
python3 benchmarks/device/summary.py "$OUT"
# Only 8 files come back from a device call: past that, they come back as one archive, which
# benchmarks/collect.py reads like the folder.
# FlashInfer's JIT parts stay apart (each is near the 16 MB a file may have).
if [ "$(ls "$OUT" | wc -l)" -gt 8 ]; then
  (cd "$OUT" && ls | grep -v '^fi-jit' | tar -czf /tmp/openinfer-results.tgz -T - \
    && ls | grep -v '^fi-jit' | xargs rm -f) && mv /tmp/openinfer-results.tgz "$OUT"/
fi
