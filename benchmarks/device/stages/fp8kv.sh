# The FP8 KV cache (`--kv-cache-dtype fp8`: e4m3 pages, per-tensor scales 1.0 with dummy
# weights) beside the bf16 one, Qwen3-8B: the fp8-KV kernel tests compiled (store, the split
# and prefill kernels and both backends against the torch reference, Qwen3-8B shapes), batch-1
# TPOT at 128 in / 128 out, and served 2048 in / 2048 out at concurrency 128 (the serve
# stage's flags; KV-bound in bf16, the run the FP8 KV cache is for). Under 8 minutes.

stage_fp8kv() {
  stage "kernel tests: FP8 KV cache compiled (kv_append, qk_norm_rope_append, attention)"
  timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-kernels/tests/kernels/test_kv_fp8.py 2>&1 | tail -5 \
    | tee "$OUT/fp8kv_tests.log"
  local kv
  for kv in fp8 auto; do
    stage "batch-1 latency, Qwen3-8B, --kv-cache-dtype $kv"
    timeout -s ABRT 120 python3 -m openinfer_server.cli bench latency $M8 --load-format dummy \
      --kv-cache-dtype $kv --max-num-seqs 4 --max-model-len 4096 --input-len 128 \
      --output-len 128 --num-iters 5 --result-file "$OUT/latency-qwen3-8b-kv-$kv.json" \
      | grep -E "TTFT|TPOT|floor"
  done
  # FP8KV_SERVED: which caches to serve (default both; "fp8" alone when the call is short of
  # time and the bf16 figure comes from an earlier run on the same GPU).
  for kv in ${FP8KV_SERVED:-fp8 auto}; do
    stage "served 2048/2048 at concurrency 128, Qwen3-8B, --kv-cache-dtype $kv"
    OPENINFER_CUDA_GRAPHS_AT_START=$SERVE_GRAPHS python3 -m openinfer_server.cli serve $M8 \
      --load-format dummy --kv-cache-dtype $kv \
      --max-num-seqs 512 --max-model-len 4608 --port 8000 >> "$OUT/serve-fp8kv.log" 2>&1 &
    local server=$!
    if ! wait_ready $server; then
      echo "fp8kv: no server with --kv-cache-dtype $kv (see serve-fp8kv.log); skipped"
      stop $server
      continue
    fi
    grep "KV cache:" "$OUT/serve-fp8kv.log" | tail -1
    timeout 150 python3 -m openinfer_server.cli bench serve --random-input-len 2048 \
      --random-output-len 2048 --num-prompts 128 --max-concurrency 128 --request-rate inf \
      --ignore-eos --tokenizer $M8 --result-file "$OUT/serve-8b-2048-kv-$kv.json"
    stop $server
  done
}
