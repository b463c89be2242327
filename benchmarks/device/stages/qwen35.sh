# Qwen3.5 (the hybrid line: Gated DeltaNet + full attention, flash-linear-attention's kernels):
# its package's tests compiled (fla against the torch references, and the CPU tests), the bf16
# golden gate against transformers, and the engine's numbers at Qwen3.5-4B's shapes with dummy
# weights: batch-1 TPOT against the weight-read floor, TTFT at 2048 and 8192 tokens, offline
# throughput 128/128 x 512 beside the run's ceilings. Its timeouts add up to 9 minutes.

stage_qwen35() {
  local q35=/tmp/qwen35-4b
  python3 -c "import fla, transformers.models.qwen3_5; print('fla', fla.__version__)" \
    || { echo "qwen35: fla-core or transformers' qwen3_5 missing (run prepare.sh here)"; return; }
  stage "Qwen3.5 package tests, compiled: fla kernels vs torch references, and the CPU tests"
  # test_served.py serves on CPU through the openai client, which the image lacks.
  timeout 120 python3 -m pytest -p no:cacheprovider -q -n 4 -m "gpu or not gpu" \
    packages/openinfer-qwen35/tests --ignore=packages/openinfer-qwen35/tests/test_served.py \
    2>&1 | tail -15 | tee "$OUT/qwen35_tests.log"
  stage "Qwen3.5 golden gate vs transformers (4B widths, 8 layers, bf16)"
  timeout 200 python3 -m pytest -p no:cacheprovider -q -s -m gpu \
    tests/gpu/test_golden_qwen35_gpu.py 2>&1 | grep -E "case|passed|failed|Error" | tail -20 \
    | tee "$OUT/qwen35_golden.log"
  python3 - "$q35" <<'PY'
import sys
from openinfer_qwen35.shapes import write_config_folder
write_config_folder("Qwen3.5-4B", sys.argv[1])
PY
  stage "batch-1 TPOT (against the weight-read floor) and TTFT at 128 / 2048 / 8192, Qwen3.5-4B"
  timeout -s ABRT 120 python3 -m openinfer_server.cli bench latency $q35 --load-format dummy \
    --max-num-seqs 4 --max-model-len 8448 --input-len 128 2048 8192 --output-len 128 \
    --num-iters 3 --result-file "$OUT/latency-qwen35-4b.json" 2>&1 | grep -E "TTFT|TPOT|floor|input"
  stage "offline throughput, Qwen3.5-4B, 128/128 x 512"
  timeout 100 python3 -m openinfer_server.cli bench throughput $q35 --load-format dummy \
    --max-num-seqs 512 --max-model-len 2048 --num-prompts 512 --input-len 128 --output-len 128 \
    --result-file "$OUT/throughput-qwen35-4b-128.json" 2>&1 | tail -8
}
