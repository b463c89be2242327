# Tensor parallelism (on nvidia-h200-x2): TP=2 against one GPU, Qwen3 and DeepSeek-V4.

stage_tp() {
  local m32=/tmp/qwen3-32b
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-32B', '$m32')"
  stage "tensor parallelism: TP=2 against one GPU, Qwen3-8B shapes, teacher-forced"
  timeout 400 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu/test_tp_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/tp_tests.log"
  stage "tensor and expert parallelism: DeepSeek-V4 (3 layers against one GPU; all 43 layers served)"
  timeout 900 python3 -m pytest -p no:cacheprovider -q -s -m gpu tests/gpu/test_tp_deepseek_v4_gpu.py \
    2>&1 | tail -15 | tee "$OUT/tp_dsv4_tests.log"
  for size in 8b 32b; do
    model=$M8; [ "$size" = 32b ] && model=$m32
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
}
