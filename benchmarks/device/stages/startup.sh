# Start-up: what the engine imports, the compile-ahead round, serve to ready cold and warm.

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

stage_startup() {
  stage "what the engine process imports, by cumulative time (python -X importtime, second run)"
  python3 -c "import openinfer_core.engine.engine, openinfer_qwen3.model" >/dev/null 2>&1
  python3 -X importtime -c "import openinfer_core.engine.engine, openinfer_qwen3.model" \
    2> "$OUT/importtime.log"
  sort -t'|' -k2 -n -r "$OUT/importtime.log" | head -25
  stage "a cold start compiles every start-up kernel in its first compile-ahead round"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -m gpu tests/gpu/test_start_kernels_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/start_kernels_test.log"
  stage "serve to ready, cold and warm Triton cache, Qwen3-4B"
  timeout 240 python3 benchmarks/device/startup.py $M4 --load-format dummy --json "$OUT/startup-qwen3-4b.json"
  start_log "$OUT/startup-qwen3-4b.json"
  stage "serve to ready, cold and warm, every CUDA graph before ready (OPENINFER_CUDA_GRAPHS_AT_START=all)"
  OPENINFER_CUDA_GRAPHS_AT_START=all timeout 240 python3 benchmarks/device/startup.py $M4 \
    --load-format dummy --json "$OUT/startup-qwen3-4b-all-graphs.json"
  start_log "$OUT/startup-qwen3-4b-all-graphs.json"
  if [ -n "${STARTUP_AB:-}" ]; then  # the start-up A/Bs: no compile-ahead, shard-by-shard reads
    stage "serve to ready, cold and warm, no compile-ahead (OPENINFER_COMPILE_AHEAD=0: the old default)"
    OPENINFER_COMPILE_AHEAD=0 timeout 240 python3 benchmarks/device/startup.py $M4 --load-format dummy \
      --json "$OUT/startup-qwen3-4b-no-ahead.json"
  fi
  [ "${STARTUP_REAL:-1}" = 0 ] && return
  stage "serve to ready, a real Qwen3-4B checkpoint: from the page cache, then from the disk"
  local real=/tmp/qwen3-4b-real
  [ -f $real/model.safetensors.index.json ] || timeout 300 python3 - "$real" <<'PY'
import sys
from openinfer_qwen3.random_weights import write_random_weights
from openinfer_qwen3.shapes import write_config_folder
write_config_folder("Qwen3-4B", sys.argv[1])
write_random_weights(sys.argv[1], sys.argv[1])
PY
  timeout 240 python3 benchmarks/device/startup.py $real --json "$OUT/startup-qwen3-4b-real-mmap.json"
  timeout 240 python3 benchmarks/device/startup.py $real --cold-disk \
    --json "$OUT/startup-qwen3-4b-real-disk.json"
  [ -n "${STARTUP_AB:-}" ] && OPENINFER_WEIGHT_READ=shards timeout 240 python3 \
    benchmarks/device/startup.py $real --json "$OUT/startup-qwen3-4b-real-shards.json"
  return 0
}
