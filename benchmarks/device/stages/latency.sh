# Batch-1 latency: the engine's own (`bench latency`), against a baseline (`ab`), through the
# server (`stream1`), and with the split-K sum fused into the norm (`fusion`).

stage_latency() {
  stage "batch-1 latency, Qwen3-4B"
  timeout -s ABRT 180 python3 -m openinfer_server.cli bench latency $M4 --load-format dummy --max-num-seqs 4 --max-model-len 4096 \
    --input-len 128 --output-len 256 --num-iters 5 --result-file "$OUT/latency-qwen3-4b.json"
  stage "decode breakdown, Qwen3-4B"
  timeout -s ABRT 120 python3 benchmarks/device/decode_breakdown.py $M4 --json "$OUT/breakdown-qwen3-4b.json"
  stage "TTFT 128 / 2048 and TPOT, Qwen3-8B"
  timeout 180 python3 -m openinfer_server.cli bench latency $M8 --load-format dummy --max-num-seqs 4 --max-model-len 4096 \
    --input-len 128 2048 --output-len 64 --num-iters 10 --result-file "$OUT/latency-qwen3-8b.json"
}

stage_ab() {
  # This tree against a baseline on the same machine, runs interleaved (base, new, base, new,
  # ...): AB_BASE names a folder of the baseline's openinfer wheels (benchmarks/device/ab_base.sh
  # COMMIT makes .ab-base), carried with the call. First the import time of the engine's
  # modules (AB_IMPORT_RUNS fresh interpreters a side), then batch-1 latency, AB_CASES: 4b
  # (TPOT), 8b (TPOT, TTFT at 2048), 8b-long (TTFT at 8192); AB_OPS: kernel ops of
  # benchmarks/ops too (a comma-separated list, or all).
  install_base "${AB_BASE:-.ab-base}"
  stage "A/B import time of the engine's modules, ${AB_IMPORT_RUNS:-5} fresh interpreters a side"
  python3 benchmarks/device/import_ab.py --runs "${AB_IMPORT_RUNS:-5}" --site base=/tmp/site-base \
    --site new=/tmp/site --json "$OUT/ab-import.json"
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
  if [ -n "${AB_OPS:-}" ]; then
    stage "A/B kernel ops: $AB_OPS"
    run_ops 500 40 ab-ops.json "$AB_OPS" --base-dir /tmp/site-base --rounds "${AB_ROUNDS:-2}"
  fi
}

stage_fusion() {
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
}

stage_stream1() {
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
}
