# Embeddings (task embed): embeddings per second at Qwen3-0.6B's shapes, 512-token inputs, over
# a sweep of batch sizes, beside the bf16 matmul ceiling of the same run.

stage_embed() {
  stage "embeddings, Qwen3-0.6B shapes, 512 tokens, batch sweep"
  timeout 300 python3 benchmarks/device/embed_bench.py --input-len 512 --batches 1,8,32,128,256 \
    --json "$OUT/embed-0.6b-512.json"
}
