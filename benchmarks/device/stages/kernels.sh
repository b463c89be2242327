# Kernel benchmarks (benchmarks/ops: `python3 -m benchmarks.ops.run --list` names the ops), the
# tile searches behind the launchers' fixed settings, and the paths the kernels replaced.

stage_ops() {
  # OPS: a comma-separated list of ops (default all); OPS_ARGS: more runner flags (--sweep).
  stage "kernel ops: ${OPS:-all}"
  run_ops 540 80 ops.json "${OPS:-all}" ${OPS_ARGS:-}
}

stage_attention() {
  stage "decode attention: split counts and tiles"
  run_ops 240 14 decode-attention.json paged_decode --sweep
}

stage_prefillattn() {
  # Prompt attention's tile settings and launch order (Qwen3-8B heads, 2048 / 8192 tokens).
  stage "prompt attention tiles, Triton split and prefill kernels"
  run_ops 500 14 prefill-attention.json prefill_attention --sweep
}

stage_tiles() {
  stage "o_proj / down + add-norm, split-K sum in the norm: tiles for SUM_FUSED_TILES"
  run_ops 480 30 fused-sum-gemm.json linear_add_norm --sweep
}

stage_tptiles() {
  # One rank's linear shards at tensor-parallel sizes 2 and 4 (gemm/tiles.py has the nearest
  # one-GPU tile for them, unswept): every Triton tile against cuBLAS at one row. One GPU.
  stage "small-batch linear tiles, Qwen3-8B / 32B shards at TP2 and TP4 (sweep)"
  run_ops 400 80 small-gemm-tp.json small_linear --sweep --cases /tp
}

stage_gemm() {
  stage "small-batch linear tiles against cuBLAS and the read floor, Qwen3-4B/8B shapes"
  run_ops 300 60 small-gemm.json small_linear --sweep
  # The default is the Triton small-batch linear with PDL (the tests stage): the gate and the
  # step once more on the path it replaced, cuBLAS without PDL.
  golden_with cublas tests/gpu OPENINFER_LINEAR=cublas OPENINFER_PDL=0
  stage "decode breakdown, Qwen3-4B, OPENINFER_LINEAR=cublas OPENINFER_PDL=0"
  OPENINFER_LINEAR=cublas OPENINFER_PDL=0 timeout 120 python3 benchmarks/device/decode_breakdown.py \
    $M4 --json "$OUT/breakdown-qwen3-4b-cublas.json"
}

stage_ttft() {
  stage "where TTFT goes: first-token steps of 2048 and 8192 tokens, Qwen3-8B"
  timeout 200 python3 benchmarks/device/prefill_breakdown.py $M8 --prompt-len 2048 8192 \
    --iters 3 --json "$OUT/prefill-breakdown-qwen3-8b.json" > "$OUT/prefill-breakdown-8b.log" 2>&1
  grep -E "^prompt|^timeline" "$OUT/prefill-breakdown-8b.log"
  stage "the elementwise kernels of a layer against their bytes (Qwen3-8B heads)"
  timeout 120 python3 benchmarks/device/norm_bench.py --json "$OUT/norm-bench.json"
  stage "o_proj / down + add + norm: the residual in cuBLAS's epilogue or in the norm kernel"
  run_ops 120 all residual-gemm.json residual_add_norm
}

stage_sampling() {
  # Sampling cost per step by batch and parameters: the Sampler (Triton race kernels, a sort
  # for top-k / top-p) against FlashInfer's sampling where .fi is carried.
  for kind in ${SAMPLING_KINDS:-triton flashinfer}; do
    stage "sampling, us per step, OPENINFER_SAMPLING=$kind"
    OPENINFER_SAMPLING=$kind run_ops 300 40 "sampling-$kind.json" sampling
  done
  save_jit
  stage "kernel tests: sampling, compiled"
  timeout 200 python3 -m pytest -p no:cacheprovider -q -m "gpu or not gpu" $SAMPLING_TESTS 2>&1 \
    | tail -3 | tee "$OUT/sampling_tests.log"
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
}

stage_flashinfer() {
  if [ -n "${FI_GOLDEN:-}" ]; then
    # Every step on FlashInfer's kernels, so the gate covers them (no CUDA graphs then).
    golden_with flashinfer tests/gpu/test_golden_qwen3_gpu.py \
      OPENINFER_ATTENTION_BACKEND=flashinfer OPENINFER_FLASHINFER_EVERY_STEP=1
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
    run_ops 300 all attention-ab.json attention_backends
  fi
}
