# Qwen3-8B with FP8 weights (`--load-format dummy` of Qwen3-8B-FP8's config: e4m3
# linears with float32 block scales) kept FP8 (OPENINFER_FP8_WEIGHTS=keep, fp8_block_linear)
# and dequantized at load (the default), beside bf16, batch 1, 128 in / 128 out; and the FP8
# linear's tests compiled, with the Qwen3 kept-FP8 decode test running the compiled kernel.

stage_fp8() {
  stage "kernel tests: fp8_block_linear compiled (E8M0 and float32 scales), Qwen3 kept FP8"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear.py \
    packages/openinfer-qwen3/tests/test_fp8_kept.py 2>&1 | tail -5 | tee "$OUT/fp8_tests.log"
  local m8fp8=/tmp/qwen3-8b-fp8
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-8B', '$m8fp8', fp8=True)"
  # keep: FP8 on the GPU; dequantize: the FP8 checkpoint as bf16 (the default); bf16: the
  # bf16 config, the baseline.
  for side in fp8-keep fp8-dequantize bf16; do
    stage "batch-1 latency, Qwen3-8B, $side"
    model=$m8fp8; [ $side = bf16 ] && model=$M8
    mode=dequantize; [ $side = fp8-keep ] && mode=keep
    OPENINFER_FP8_WEIGHTS=$mode timeout -s ABRT 150 python3 -m openinfer_server.cli bench latency \
      $model --load-format dummy --max-num-seqs 4 --max-model-len 4096 --input-len 128 \
      --output-len 128 --num-iters 5 --result-file "$OUT/latency-qwen3-8b-$side.json" \
      | grep -E "TTFT|TPOT|floor"
  done
}
