# Correctness on the GPU: kernel tests compiled, the golden gate against transformers.

stage_tests() {
  stage "kernel tests, compiled, every size"
  # Only the folders this tree has (`basetests` runs an older tree's).
  timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    $(ls -d packages/openinfer-kernels/tests packages/openinfer-deepseek-v4/tests/kernels \
      packages/openinfer-offload/tests 2>/dev/null) 2>&1 | tail -25 | tee "$OUT/kernel_tests.log"
  # The DeepSeek-V4 and Qwen3.5 gates run in their lines' stages (dsv4model, dsv4gates, qwen35).
  stage "golden gate vs transformers (Qwen3-4B shapes, bf16)"
  timeout 420 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu \
    --ignore=tests/gpu/test_golden_deepseek_v4_gpu.py --ignore=tests/gpu/test_golden_qwen35_gpu.py \
    --ignore=tests/gpu/test_official_deepseek_v4_gpu.py 2>&1 | tail -40 | tee "$OUT/golden_tests.log"
}

stage_basetests() {
  # `tests` on the baseline that benchmarks/device/ab_base.sh put in .ab-base (its wheels and
  # its test files): the "before" of a change, on the same machine as its "after". Logs go to
  # $OUT/base/.
  local base=${AB_BASE:-.ab-base}
  [ -f "$base/tree.tar" ] || { echo "basetests: no $base/tree.tar (run ab_base.sh here)"; exit 1; }
  install_base "$base"
  rm -rf /tmp/base-tree && mkdir -p /tmp/base-tree "$OUT/base"
  tar -xf "$base/tree.tar" -C /tmp/base-tree
  local out=$OUT/base
  (cd /tmp/base-tree && OUT=$out OPENINFER_GPU_RESULTS=$out PYTHONPATH=/tmp/site-base stage_tests)
}

stage_gate() {
  # A quicker gate for a kernel change than `tests`: the golden gate and the kernel tests of
  # the step's norm, rotary, attention, linear and embedding kernels (GATE_TESTS to name
  # others), compiled.
  stage "golden gate vs transformers (Qwen3-4B shapes, bf16)"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu \
    --ignore=tests/gpu/test_golden_deepseek_v4_gpu.py --ignore=tests/gpu/test_golden_qwen35_gpu.py \
    --ignore=tests/gpu/test_start_kernels_gpu.py \
    --ignore=tests/gpu/test_tp_gpu.py --ignore=tests/gpu/test_tp_deepseek_v4_gpu.py \
    --ignore=tests/gpu/test_official_deepseek_v4_gpu.py 2>&1 \
    | tail -30 | tee "$OUT/golden_tests.log"
  stage "kernel tests: norms, q/k norm + rotary, attention, linear, embedding, compiled"
  local k=packages/openinfer-kernels/tests/kernels
  timeout 240 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    ${GATE_TESTS:-$k/test_rms_norm.py $k/test_qk_norm_rope.py $k/test_paged_attention_triton.py \
      $k/test_gemm.py $k/test_embedding.py} 2>&1 | tail -8 | tee "$OUT/gate_kernel_tests.log"
}

stage_verify() {
  # The sampler's kernels and the start-up compile round, compiled (their CPU tests run in CI).
  stage "kernel tests: sampling, compiled; nothing compiles after start-up's round"
  timeout 400 python3 -m pytest -p no:cacheprovider -q -m "gpu or not gpu" $SAMPLING_TESTS \
    tests/gpu/test_start_kernels_gpu.py 2>&1 | tail -8 | tee "$OUT/verify_tests.log"
}

stage_pdl() {
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
    golden_with pdl tests/gpu OPENINFER_LINEAR=triton OPENINFER_PDL=1
  fi
}

stage_prefetch() {
  # The L2 prefetch of weights before `pdl_enter` (OPENINFER_PDL_PREFETCH_MB): the linear kernel
  # tests compiled with it on, then batch-1 TPOT of Qwen3-4B / 8B (bf16) and Qwen3-8B kept FP8
  # at each budget in PREFETCH_MBS (0 = off first: the baseline of the same call), the sides
  # interleaved over PREFETCH_ROUNDS rounds; TP_SIZES > 1 adds Qwen3-8B at those TP sizes.
  local mbs=${PREFETCH_MBS:-0 24} rounds=${PREFETCH_ROUNDS:-2} m8fp8=/tmp/qwen3-8b-fp8 r mb tp
  stage "linear kernel tests, compiled, OPENINFER_PDL_PREFETCH_MB=24"
  OPENINFER_PDL_PREFETCH_MB=24 timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 \
    -m "gpu or not gpu" packages/openinfer-kernels/tests/kernels/test_gemm.py \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear.py 2>&1 | tail -3 \
    | tee "$OUT/prefetch_kernel_tests.log"
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-8B', '$m8fp8', fp8=True)"
  for r in $(seq "$rounds"); do
    for mb in $mbs; do
      for run in 4b:$M4 8b:$M8 8b-fp8:$m8fp8; do
        stage "batch-1 latency, Qwen3-${run%%:*}, OPENINFER_PDL_PREFETCH_MB=$mb (round $r)"
        OPENINFER_PDL_PREFETCH_MB=$mb timeout 180 python3 -m openinfer_server.cli bench latency \
          ${run#*:} --load-format dummy --max-num-seqs 4 --max-model-len 4096 --input-len 128 \
          --output-len 256 --num-iters 3 \
          --result-file "$OUT/latency-qwen3-${run%%:*}-prefetch$mb-r$r.json" | grep -E "TPOT|floor"
      done
      for tp in ${TP_SIZES:-1}; do
        [ "$tp" = 1 ] || tp_latency 8b $M8 $tp "prefetch$mb-r$r" OPENINFER_PDL_PREFETCH_MB=$mb
      done
    done
  done
}

stage_preload() {
  # The decode-size kernels' reads ahead of their PDL wait (OPENINFER_PDL_PRELOAD, pdl.py):
  # their tests and the decode attention tests compiled with all on (real PDL), then batch-1
  # TPOT of Qwen3-8B bf16 and kept FP8 at each setting of PRELOADS ("0 1": off, the baseline of
  # the same call, then all; a kernel's name, or a comma list, for one at a time); TP_SIZES > 1
  # adds Qwen3-8B at those TP sizes (the push add-norm's preload); PRELOAD_BREAKDOWN, below.
  local m8fp8=/tmp/qwen3-8b-fp8 pre run tp
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-8B', '$m8fp8', fp8=True)"
  stage "PDL preload tests and decode attention tests, compiled, OPENINFER_PDL_PRELOAD=1"
  OPENINFER_PDL_PRELOAD=all timeout 240 python3 -m pytest -p no:cacheprovider -q -n 8 \
    -m "gpu or not gpu" -rf --tb=short packages/openinfer-kernels/tests/kernels/test_pdl_reads.py \
    packages/openinfer-kernels/tests/kernels/test_paged_attention_triton.py \
    packages/openinfer-kernels/tests/kernels/test_kv_fp8.py > "$OUT/preload_tests.log" 2>&1
  grep -E "^E  |^FAILED|passed|failed" "$OUT/preload_tests.log" | head -20
  for pre in ${PRELOADS:-0 1}; do
    for run in 8b:$M8 8b-fp8:$m8fp8; do
      stage "batch-1 latency, Qwen3-${run%%:*}, OPENINFER_PDL_PRELOAD=$pre"
      OPENINFER_PDL_PRELOAD=$pre timeout 150 python3 -m openinfer_server.cli bench latency \
        ${run#*:} --load-format dummy --max-num-seqs 4 --max-model-len 4096 --input-len 128 \
        --output-len 128 --num-iters 3 \
        --result-file "$OUT/latency-qwen3-${run%%:*}-preload-${pre//,/-}.json" \
        | grep -E "TPOT|floor"
    done
    for tp in ${TP_SIZES:-1}; do
      [ "$tp" = 1 ] || tp_latency 8b $M8 $tp "preload-${pre//,/-}" OPENINFER_PDL_PRELOAD=$pre
    done
  done
  # PRELOAD_BREAKDOWN (a PRELOADS setting): the decode step of both by kernel at it, against
  # the weight-read floor (where kept FP8's time above its floor goes).
  [ -n "${PRELOAD_BREAKDOWN:-}" ] || return 0
  for run in 8b:$M8 8b-fp8:$m8fp8; do
    stage "batch-1 decode step by kernel, Qwen3-${run%%:*}, OPENINFER_PDL_PRELOAD=$PRELOAD_BREAKDOWN"
    OPENINFER_PDL_PRELOAD=$PRELOAD_BREAKDOWN timeout 150 python3 benchmarks/device/decode_breakdown.py \
      ${run#*:} --json "$OUT/breakdown-qwen3-${run%%:*}.json" > "$OUT/breakdown-qwen3-${run%%:*}.log" 2>&1
    tail -25 "$OUT/breakdown-qwen3-${run%%:*}.log"
  done
}
