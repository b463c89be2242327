# Qwen3-8B with FP8 weights (`--load-format dummy` of Qwen3-8B-FP8's config: e4m3
# linears with float32 block scales) kept FP8 (the default, fp8_dynamic_linear) and
# dequantized at load (OPENINFER_FP8_WEIGHTS=dequantize), beside bf16: batch 1, 128 in / 128 out, and TTFT at
# 2048 and 8192 in, where kept FP8 runs its prompt products W8A8 (OPENINFER_FP8_LINEAR=auto) or
# weight-only; the FP8 linears at Qwen3-8B's shapes for M = 1 .. 8192 (fp8_gemm.py: W8A8,
# weight-only, bf16, cuBLASLt's block-scaled FP8, W8A8 tile candidates, against the bf16 and
# FP8 matmul ceilings of the run); the FP8 linear's tests compiled, with the Qwen3
# kept-FP8 tests running the compiled kernels; the FP8 numerics gate (Qwen3-4B shapes, 6
# layers, quantized at load, against transformers fp32 with the same FP8 weights); and
# online quantization (`--quantization fp8` on the bf16 dummy): batch-1 TPOT and its drift
# from bf16 (fp8_drift.py).

stage_fp8() {
  stage "kernel tests: fp8_block_linear, its fused forms and W8A8 compiled (E8M0 and float32 scales), Qwen3 kept FP8"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" -rf --tb=short \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear.py \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear_fused.py \
    packages/openinfer-kernels/tests/kernels/test_fp8_w8a8.py \
    packages/openinfer-qwen3/tests/test_fp8_kept.py > "$OUT/fp8_tests_full.log" 2>&1
  grep -E "^E  |^FAILED|passed|failed" "$OUT/fp8_tests_full.log" | head -40
  stage "FP8 numerics gate: Qwen3-4B shapes (6 layers) online FP8 vs transformers fp32, same weights"
  OPENINFER_GPU_RESULTS=$OUT timeout 240 python3 -m pytest -p no:cacheprovider -q -s -m gpu \
    tests/gpu/test_fp8_gate_gpu.py 2>&1 | grep -E "'case'|passed|failed|Error" \
    | tee "$OUT/fp8_gate.log"
  stage "FP8 linears at Qwen3-8B's shapes, M = 1 .. 8192: W8A8 vs weight-only vs bf16, tiles"
  # The tile candidates' rows stay in the log and the JSON; the sides, the best decode tiles
  # and the ceilings print.
  timeout 400 python3 benchmarks/device/fp8_gemm.py --sweep --decode-sweep \
    --json "$OUT/fp8-gemm.json" 2>&1 | tee "$OUT/fp8-gemm.log" | grep -v " tile \| wo-tile "
  local m8fp8=/tmp/qwen3-8b-fp8
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-8B', '$m8fp8', fp8=True)"
  # keep: FP8 on the GPU (prompt products W8A8); keep-weight-only: the same, every product
  # weight-only; dequantize: the FP8 checkpoint as bf16 (the default); bf16: the bf16
  # config, the baseline.
  for side in fp8-keep fp8-keep-weight-only fp8-dequantize bf16; do
    model=$m8fp8; [ $side = bf16 ] && model=$M8
    mode=dequantize; [[ $side = fp8-keep* ]] && mode=keep
    path=auto; [ $side = fp8-keep-weight-only ] && path=weight-only
    if [ $side != fp8-keep-weight-only ]; then
      stage "batch-1 latency, Qwen3-8B, $side"
      OPENINFER_FP8_WEIGHTS=$mode OPENINFER_FP8_LINEAR=$path timeout -s ABRT 150 \
        python3 -m openinfer_server.cli bench latency $model --load-format dummy \
        --max-num-seqs 4 --max-model-len 4096 --input-len 128 --output-len 128 --num-iters 3 \
        --result-file "$OUT/latency-qwen3-8b-$side.json" | grep -E "TTFT|TPOT|floor"
    fi
    for len in 2048 8192; do
      [ $len = 8192 ] && [[ $side = *weight-only || $side = fp8-dequantize ]] && continue
      stage "TTFT at $len in, Qwen3-8B, $side"
      OPENINFER_FP8_WEIGHTS=$mode OPENINFER_FP8_LINEAR=$path timeout -s ABRT 150 \
        python3 -m openinfer_server.cli bench latency $model --load-format dummy \
        --max-num-seqs 4 --max-model-len 8320 --input-len $len --output-len 16 --num-iters 3 \
        --result-file "$OUT/ttft-$len-qwen3-8b-$side.json" | grep -E "TTFT|floor"
    done
  done
  stage "batch-1 latency, Qwen3-8B bf16 quantized at load (--quantization fp8, kept FP8)"
  timeout -s ABRT 150 python3 -m openinfer_server.cli bench latency $M8 --load-format dummy \
    --quantization fp8 --max-num-seqs 4 --max-model-len 4096 --input-len 128 \
    --output-len 128 --num-iters 3 --result-file "$OUT/latency-qwen3-8b-online-fp8.json" \
    | grep -E "TTFT|TPOT|floor"
  stage "online FP8 drift from bf16: Qwen3-8B shapes, 4 layers, dummy weights, 16 x 256 tokens"
  timeout 120 python3 benchmarks/device/fp8_drift.py --shape Qwen3-8B --layers 4 \
    --json "$OUT/fp8-drift.json" 2>&1 | tail -1
}

stage_fp8ttft() {
  # Where kept FP8's first-token time goes (GPU kernel time by op, prefill_breakdown.py):
  # Qwen3-8B FP8, 2048 and 8192 tokens.
  local m8fp8=/tmp/qwen3-8b-fp8
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-8B', '$m8fp8', fp8=True)"
  stage "which W8A8 product kept FP8's prompt products take (cuBLASLt or Triton), and why"
  OPENINFER_FP8_WEIGHTS=keep timeout 150 python3 - "$m8fp8" > "$OUT/fp8-dispatch.log" 2>&1 <<'PY'
import sys
from collections import Counter
import torch
import openinfer_kernels.fp8_linear.scaled_mm as sm
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
seen = Counter()
applies = sm.scaled_mm_applies
def probe(xq, x_scale, w, scale, out_dtype):
    ok = applies(xq, x_scale, w, scale, out_dtype)
    seen[(ok, tuple(xq.shape), tuple(x_scale.stride()), str(scale.dtype), str(out_dtype),
          tuple(w.shape), torch.cuda.is_current_stream_capturing())] += 1
    return ok
sm.scaled_mm_applies = probe
engine = Engine(EngineConfig(model=sys.argv[1], load_format="dummy", max_model_len=4096,
                             max_num_seqs=4))
engine.add_request(GenerateRequest("p", tuple(range(1000, 3048)),
                                   SamplingParams(max_tokens=2, temperature=0.0)))
while engine.has_work():
    engine.step()
print("W8A8 products seen:", sum(seen.values()), "cuBLASLt:",
      sum(n for key, n in seen.items() if key[0]))
for key, n in sorted(seen.items(), key=lambda kv: -kv[1])[:10]:
    print(n, key)
PY
  tail -12 "$OUT/fp8-dispatch.log"
  stage "where kept FP8's TTFT goes: Qwen3-8B FP8, 2048 and 8192 tokens"
  OPENINFER_FP8_WEIGHTS=keep timeout 200 python3 benchmarks/device/prefill_breakdown.py $m8fp8 \
    --prompt-len 2048 8192 --iters 3 --json "$OUT/prefill-breakdown-qwen3-8b-fp8.json" \
    > "$OUT/prefill-breakdown-8b-fp8.log" 2>&1
  head -60 "$OUT/prefill-breakdown-8b-fp8.log"
}

stage_fp8fused() {
  # The W8A8 product's activation quantization fused into the kernel that makes the
  # activation (fp8_linear/quant_fused.py): its kernel tests and the kept-FP8 Qwen3 tests
  # compiled, then TTFT at 2048 and 8192 in, Qwen3-8B FP8 kept, fused (the default) and apart
  # (OPENINFER_FP8_FUSED_QUANT=0) in turns, batch-1 TPOT, then where a fused 2048-token first
  # step goes.
  local m8fp8=/tmp/qwen3-8b-fp8 round side len
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-8B', '$m8fp8', fp8=True)"
  stage "fused activation quantization: kernel tests and kept-FP8 Qwen3 tests, compiled"
  timeout 240 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" -rf --tb=short \
    packages/openinfer-kernels/tests/kernels/test_fp8_quant_fused.py \
    packages/openinfer-kernels/tests/kernels/test_fp8_w8a8.py \
    packages/openinfer-qwen3/tests/test_fp8_kept.py > "$OUT/fp8fused_tests.log" 2>&1
  grep -E "^E  |^FAILED|passed|failed" "$OUT/fp8fused_tests.log" | head -20
  for round in 1 2; do
    for side in fused apart; do
      for len in 2048 8192; do
        stage "TTFT at $len in, Qwen3-8B FP8 kept, quantization $side, round $round"
        OPENINFER_FP8_FUSED_QUANT=$([ $side = fused ] && echo 1 || echo 0) timeout -s ABRT 150 \
          python3 -m openinfer_server.cli bench latency $m8fp8 --load-format dummy \
          --max-num-seqs 4 --max-model-len 8320 --input-len $len --output-len 16 --num-iters 3 \
          --result-file "$OUT/ttft-$len-qwen3-8b-fp8-$side-r$round.json" | grep -E "Median TTFT"
      done
    done
  done
  stage "batch-1 latency, Qwen3-8B FP8 kept (its decode products take no fused quantization)"
  timeout -s ABRT 150 python3 -m openinfer_server.cli bench latency $m8fp8 --load-format dummy \
    --max-num-seqs 4 --max-model-len 4096 --input-len 128 --output-len 128 --num-iters 3 \
    --result-file "$OUT/latency-qwen3-8b-fp8-keep.json" | grep -E "TPOT|floor"
  stage "where a fused FP8 2048-token first step goes (top kernels)"
  timeout 150 python3 benchmarks/device/prefill_breakdown.py $m8fp8 --prompt-len 2048 --iters 3 \
    --json "$OUT/prefill-breakdown-qwen3-8b-fp8-fused.json" > "$OUT/prefill-breakdown-8b-fp8-fused.log" 2>&1
  grep -E "^prompt|^  +[0-9.]+ ms" "$OUT/prefill-breakdown-8b-fp8-fused.log" | head -20
}

stage_fp8serve() {
  # Qwen3-8B FP8 (kept, the default) at batch: offline 128/128 x 512 beside the bf16
  # checkpoint's in the same call, then served FP8SERVE_PROMPTS (4096) x 128/128 at
  # concurrency 512 behind FP8SERVE_API_SERVERS frontends (default: the last of API_SERVERS)
  # (issue 34: >= 20,000 output tok/s offline,
  # served within 0.95x of it). 1,024 prompts are two waves of 512: their ramp-up and drain
  # weigh on the figure as the offline run's single wave does not.
  local m8fp8=/tmp/qwen3-8b-fp8 model side
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-8B', '$m8fp8', fp8=True)"
  stage "W8A8 kernel tests compiled (cuBLASLt at row counts no 4 divides, as served steps have)"
  timeout 120 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" -rf --tb=short \
    packages/openinfer-kernels/tests/kernels/test_fp8_w8a8.py > "$OUT/fp8serve_tests.log" 2>&1
  grep -E "^FAILED|passed|failed" "$OUT/fp8serve_tests.log" | tail -8
  for side in fp8 bf16; do
    model=$m8fp8; [ $side = bf16 ] && model=$M8
    stage "offline throughput, Qwen3-8B $side, 128/128 x 512"
    timeout 200 python3 -m openinfer_server.cli bench throughput $model --load-format dummy \
      --max-num-seqs 512 --max-model-len 4608 --num-prompts 512 --input-len 128 \
      --output-len 128 --result-file "$OUT/throughput-8b-$side-128.json" 2>&1 | tail -6
  done
  local prompts=${FP8SERVE_PROMPTS:-4096} servers=${FP8SERVE_API_SERVERS:-${API_SERVERS##* }}
  stage "served throughput, Qwen3-8B FP8, $prompts x 128/128 at concurrency 512, $servers frontend(s)"
  OPENINFER_CUDA_GRAPHS_AT_START=$SERVE_GRAPHS python3 -m openinfer_server.cli serve $m8fp8 \
    --load-format dummy --max-num-seqs 512 --api-server-count $servers \
    --max-model-len 4608 --port 8000 >> "$OUT/serve-fp8.log" 2>&1 &
  local server=$!
  if wait_ready $server; then
    timeout 200 python3 -m openinfer_server.cli bench serve --random-input-len 128 \
      --random-output-len 128 --num-prompts $prompts --max-concurrency 512 --request-rate inf \
      --ignore-eos --tokenizer $m8fp8 --result-file "$OUT/serve-8b-fp8-128.json" \
      | grep -E "throughput|TTFT|TPOT|Failed"
  else
    echo "fp8serve: no server (see serve-fp8.log)"
  fi
  stop $server
}
