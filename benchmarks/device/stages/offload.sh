# The KV offload tiers: restore copy paths against the pinned copy floor, restore TTFT.

stage_offload() {
  stage "KV offload: restore copy paths against the pinned copy floor, Qwen3-4B layout"
  timeout 120 python3 benchmarks/device/offload_copy.py --json "$OUT/offload-copy.json" 2>&1 | tail -12
  stage "KV offload: restore TTFT host/disk vs cold vs HBM, multi-turn on vs off, Qwen3-4B"
  # OFFLOAD_ARGS: e.g. --skip-multi-turn, to fit one device call with other stages
  timeout 540 python3 benchmarks/device/offload_restore.py $M4 --json "$OUT/offload-qwen3-4b.json" \
    ${OFFLOAD_ARGS:-} 2>&1 | tail -30 | tee "$OUT/offload.log"
}
