# Tensor parallelism (on nvidia-h100-x2 / -x4): the all-reduce paths, the TP gate against
# transformers, batch-1 TPOT against one GPU and the per-rank read floor, served throughput,
# and a rank killed mid-stream. TP_SIZES: the TP sizes measured (default "1 2"; "1 2 4" on 4
# GPUs).

# tp_latency SIZE MODEL TP NAME [VAR=VALUE ...]: batch-1 latency at TP, 128 in / 128 out.
tp_latency() {
  local size=$1 model=$2 tp=$3 name=$4
  shift 4
  stage "batch-1 latency, Qwen3-${size^^}, TP=$tp, $name"
  env "$@" timeout "${TP_LATENCY_TIMEOUT:-300}" python3 -m openinfer_server.cli bench latency $model --load-format dummy \
    --max-num-seqs 4 --max-model-len 4096 --input-len 128 --output-len 128 --num-iters 3 \
    --tensor-parallel-size $tp --result-file "$OUT/latency-qwen3-$size-tp$tp-$name.json" \
    > "$OUT/latency-qwen3-$size-tp$tp-$name.log" 2>&1
  grep -E "TPOT|floor" "$OUT/latency-qwen3-$size-tp$tp-$name.log" \
    || tail -25 "$OUT/latency-qwen3-$size-tp$tp-$name.log"
  grep -h "all-reduce by\|RMSNorm fused\|unavailable" "$OUT/latency-qwen3-$size-tp$tp-$name.log" | head -3
}

stage_allreduce() {
  for n in ${TP_SIZES:-1 2}; do
    [ "$n" = 1 ] && continue
    stage "all-reduce on $n GPUs: NCCL, symmetric-memory one-shot and two-shot, 8 KB - 32 MB"
    timeout 240 python3 benchmarks/device/all_reduce.py --gpus $n --json "$OUT/all-reduce-$n.json" 2>&1 \
      | grep -v "^\[" | tail -45
  done
}

stage_tp() {
  stage_tplatency
  tp_gate
}

# Batch-1 TPOT of Qwen3-8B at each TP size, and the TP_VARIANTS A/Bs (`tp` without its
# gate).
stage_tplatency() {
  local tps=${TP_SIZES:-1 2}
  for tp in $tps; do
    tp_latency 8b $M8 $tp auto
  done
  # A/Bs at TP2, or at each size of TP_VARIANT_SIZES (TP_VARIANTS="OPENINFER_TP_ALL_REDUCE=nccl
  # OPENINFER_LINEAR=cublas": the all-reduce through NCCL only; the linears on cuBLAS, not the
  # shard tiles). A '+' joins settings of one variant (A=1+B=2).
  for variant in ${TP_VARIANTS:-}; do
    for tp in ${TP_VARIANT_SIZES:-2}; do
      # (file names: no '=', ',' or '+')
      tp_latency 8b $M8 $tp "${variant//[=,+]/-}" ${variant//+/ }
    done
  done
}

# The TP gate alone (the `tp` stage ends with it too).
stage_tpgate() {
  tp_gate
}

tp_gate() {
  stage "tensor-parallel gate: TP2 (CUDA graphs) against transformers, Qwen3-4B shapes and 1 KV head"
  # Logs at INFO as they come; a stuck run is stopped with SIGABRT so that faulthandler prints
  # where rank 0's threads were (a worker prints its own when rank 0 is gone).
  timeout -s ABRT ${TPGATE_TIMEOUT_S:-600} python3 -m pytest -p no:cacheprovider -q -s -m gpu \
    -o log_cli=true --log-cli-level=INFO tests/gpu/test_tp_gpu.py > "$OUT/tp_tests_full.log" 2>&1
  grep -E "^\{|passed|failed|Error|error| s$" "$OUT/tp_tests_full.log" | tail -40
}

stage_tpprofile() {
  # Rank 0's GPU time per decode step by op (collectives apart), at each TP size, for each of
  # TPPROFILE_MODELS (default "8b"; "32b" makes the Qwen3-32B config folder).
  local size model tp
  for size in ${TPPROFILE_MODELS:-8b}; do
    model=$M8
    if [ "$size" = 32b ]; then
      model=/tmp/qwen3-32b
      python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-32B', '$model')"
    fi
    for tp in ${TP_SIZES:-1 2}; do
      stage "decode step by op, Qwen3-${size^^}, TP=$tp"
      timeout 240 python3 benchmarks/device/decode_breakdown.py $model --tensor-parallel-size $tp \
        --json "$OUT/decode-breakdown-$size-tp$tp.json" > "$OUT/decode-breakdown-$size-tp$tp.log" 2>&1
      python3 - "$OUT/decode-breakdown-$size-tp$tp.json" <<'PY' || tail -20 "$OUT/decode-breakdown-$size-tp$tp.log"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"step {r['step_ms']:.2f} ms, GPU busy {r['gpu_busy_ms']:.2f} ms; marginal by op:",
      ", ".join(f"{k} {v:.2f}" for k, v in r["marginal_by_op_ms"].items()))
print("marginal by kernel:", ", ".join(f"{k[:48]} {v:.3f}"
                                       for k, v in r["marginal_top_kernels_ms"].items()))
PY
    done
  done
}

stage_tpfused() {
  # FlashInfer's all-reduce + residual add + RMSNorm fusion (carry .fi, from
  # benchmarks/device/flashinfer_pack.sh): batch-1 TPOT without the fusion and with it in the
  # same call (TP1 first, the baseline), then the micro-benchmark at Qwen3-8B's and 32B's hidden
  # sizes, 32B with the fusion and the TP gate with it. The fused module's JIT build (minutes,
  # the first time) comes back as fi-jit.tgz.part-*: copied into .fi/, a later call skips it.
  # add_norm.py times our own fusion (one Triton kernel over the all-reduce's symmetric memory,
  # no FlashInfer needed) beside FlashInfer's; its batch-1 TPOT and the gate with it:
  #   tp_latency 8b $M8 2 triton OPENINFER_TP_FUSED_NORM=triton
  #   OPENINFER_TP_FUSED_NORM=triton tp_gate
  # and its own 2/4-GPU check: pytest -m gpu tests/gpu/test_tp_add_norm_gpu.py.
  local m32=/tmp/qwen3-32b
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-32B', '$m32')"
  tp_latency 8b $M8 1 auto
  tp_latency 8b $M8 2 unfused OPENINFER_TP_FUSED_NORM=off
  # The first fused start builds FlashInfer's trtllm_comm module: more than 300 s on 16 cores.
  TP_LATENCY_TIMEOUT=540 tp_latency 8b $M8 2 fused OPENINFER_TP_FUSED_NORM=flashinfer
  save_jit
  for h in ${TPTRITON_HIDDEN:-4096 5120}; do
    stage "all-reduce + add + RMSNorm on 2 GPUs, fused (FlashInfer, Triton) against unfused, hidden $h"
    timeout 400 python3 benchmarks/device/add_norm.py --gpus 2 --hidden $h \
      --json "$OUT/add-norm-$h.json" 2>&1 | grep -v "^\[" | tail -16
  done
  tp_latency 32b $m32 2 fused OPENINFER_TP_FUSED_NORM=flashinfer
  OPENINFER_TP_FUSED_NORM=flashinfer tp_gate
}

stage_tptriton() {
  # Our own all-reduce + add + RMSNorm (OPENINFER_TP_FUSED_NORM=triton: one Triton kernel over
  # the all-reduce's symmetric memory; no FlashInfer, no JIT wait), and its push form
  # (OPENINFER_TP_FUSED_NORM=push, up to 64 rows, the rows their own flags; push-flags:
  # OPENINFER_TP_PUSH_SIGNAL=flags). First their own 2/4-GPU
  # check (a hang there stops the stage before anything waits on it), the micro-benchmark
  # beside the unfused path, then batch-1 TPOT of Qwen3-8B at each TP size unfused and fused
  # in the same call (TP1 first, the baseline), and the TP gate with the fusion.
  local tps=${TP_SIZES:-1 2} tp h mode pick modes=""
  # The split linears' in-kernel sum and the split attention's in-kernel merge (split_k.py's
  # counts) first: their memory ordering is only real on a GPU, and every step takes them.
  stage "split-K shares summed by the last share, compiled: bitwise against the sum kernel"
  timeout 240 python3 -m pytest -p no:cacheprovider -q -m "gpu or not gpu" -k last_share \
    packages/openinfer-kernels/tests/kernels/test_gemm.py \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear.py \
    packages/openinfer-kernels/tests/kernels/test_paged_attention_triton.py 2>&1 | tail -3
  # mode:the test ids it selects (push-flags's ids hold "flags"; push's the rest of "push")
  # TPTRITON_CHECKS: the modes checked (and so timed), default all four.
  for pick in "triton:triton" "push:push and not flags" "push-flags:flags" "linear:linear"; do
    mode=${pick%%:*}
    [[ " ${TPTRITON_CHECKS:-triton push push-flags linear} " == *" $mode "* ]] || continue
    stage "Triton all-reduce + add + RMSNorm ($mode): its GPU check"
    timeout -s ABRT 280 python3 -m pytest -p no:cacheprovider -q -m gpu -rfE --tb=short \
      -k "${pick#*:}" tests/gpu/test_tp_add_norm_gpu.py > "$OUT/tp_add_norm_tests_$mode.log" 2>&1
    grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$OUT/tp_add_norm_tests_$mode.log" | tail -20
    grep -q " passed" "$OUT/tp_add_norm_tests_$mode.log" \
      && ! grep -q "failed" "$OUT/tp_add_norm_tests_$mode.log" && modes="$modes $mode"
  done
  [[ " $modes " == *" triton "* ]] \
    || { echo "tptriton: the one-shot kernel's own check did not pass; nothing else run"; return; }
  local most=2 g fusions
  for g in $tps; do [ "$g" -gt "$most" ] && most=$g; done
  # add_norm.py times the all-reduce + add + norm alone: the pushing linear (`linear`) has a
  # product in it, so it is timed by its TPOT only.
  fusions=$(echo $modes | tr ' ' '\n' | grep -vx linear | paste -sd, -)
  for h in ${TPTRITON_HIDDEN:-4096 5120}; do
    stage "all-reduce + add + RMSNorm on $most GPUs, fused ($fusions) against unfused, hidden $h"
    timeout 300 python3 benchmarks/device/add_norm.py --gpus $most --hidden $h \
      --fused $fusions --json "$OUT/add-norm-triton-$h-x$most.json" 2>&1 | grep -v "^\[" | tail -16
  done
  # TPTRITON_HIDDEN: the micro-benchmark's widths (default "4096 5120");
  # TPTRITON_TPOT: the paths timed at each TP size past 1 (each only where its check passed);
  # TPTRITON_GATE: the path the TP gate runs with (`none`: no gate; default `auto`'s choice).
  local timed=${TPTRITON_TPOT:-unfused triton push push-flags linear} name
  for tp in $tps; do
    if [ "$tp" = 1 ]; then
      tp_latency 8b $M8 1 auto
      continue
    fi
    for name in $timed; do
      case $name in
        unfused) tp_latency 8b $M8 $tp unfused OPENINFER_TP_FUSED_NORM=off ;;
        push-flags) [[ " $modes " == *" push-flags "* ]] && tp_latency 8b $M8 $tp push-flags \
          OPENINFER_TP_FUSED_NORM=push OPENINFER_TP_PUSH_SIGNAL=flags ;;
        *) [[ " $modes " == *" $name "* ]] \
          && tp_latency 8b $M8 $tp $name OPENINFER_TP_FUSED_NORM=$name ;;
      esac
    done
  done
  case ${TPTRITON_GATE:-auto} in
    none) ;;
    push-flags) OPENINFER_TP_GATE_FP32=0 OPENINFER_TP_FUSED_NORM=push \
      OPENINFER_TP_PUSH_SIGNAL=flags tp_gate ;;
    *) OPENINFER_TP_GATE_FP32=0 OPENINFER_TP_FUSED_NORM=${TPTRITON_GATE:-auto} tp_gate ;;
  esac
}

stage_tpunfused() {
  # Batch-1 TPOT of Qwen3-8B at TP=2 without the fusion: tpfused's baseline, for a call that
  # cannot also fit FlashInfer's JIT build.
  tp_latency 8b $M8 2 unfused OPENINFER_TP_FUSED_NORM=off
}

stage_tp32() {
  # Qwen3-32B batch-1 TPOT at each TP size past 1; TP32_VARIANTS: A/Bs at each of them, each
  # VAR=VALUE (e.g. "OPENINFER_PDL_PRELOAD=push OPENINFER_PDL_PRELOAD=linear,push"; a '+'
  # joins settings of one variant).
  local m32=/tmp/qwen3-32b tps=${TP_SIZES:-1 2} variant
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-32B', '$m32')"
  for tp in $tps; do
    [ "$tp" = 1 ] && continue
    tp_latency 32b $m32 $tp auto
    for variant in ${TP32_VARIANTS:-}; do
      tp_latency 32b $m32 $tp "${variant//[=,+]/-}" ${variant//+/ }  # (no '=', ',', '+')
    done
  done
}

stage_tpserve() {
  # The rank kill first (short), then the served figures.
  local m32=/tmp/qwen3-32b
  python3 -c "from openinfer_qwen3.shapes import write_config_folder as w; w('Qwen3-32B', '$m32')"
  stage "a tensor-parallel rank killed mid-stream: Qwen3-8B, TP=2, the rank on GPU 1"
  python3 -m openinfer_server.cli serve $M8 --load-format dummy --tensor-parallel-size 2 \
    --max-num-seqs 16 --max-model-len 4608 --port 8000 >> "$OUT/serve-tp-kill.log" 2>&1 &
  server=$!
  if wait_ready $server; then
    # The rank on GPU 1 is the worker process: every stream must end with an error within 15 s.
    timeout 200 python3 benchmarks/device/replica_kill.py \
      --pid "$(nvidia-smi --id=1 --query-compute-apps=pid --format=csv,noheader | head -1)" \
      --streams 16 --output-len 2000 --json "$OUT/kill-tp-rank.json"
    for _ in $(seq 30); do kill -0 $server 2>/dev/null || break; sleep 1; done
    kill -0 $server 2>/dev/null && echo "the server still runs 30 s after its rank died" \
      || echo "the server stopped after its rank died"
    echo "GPU processes left: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
  fi
  kill -9 $server 2>/dev/null; wait $server 2>/dev/null
  tail -5 "$OUT/serve-tp-kill.log"
  stage "served throughput, Qwen3-32B, TP=2: 128/128 at concurrency 256, 2048/2048 at 64"
  OPENINFER_CUDA_GRAPHS_AT_START=$SERVE_GRAPHS python3 -m openinfer_server.cli serve $m32 \
    --load-format dummy --tensor-parallel-size 2 \
    --max-num-seqs 256 --max-model-len 4608 --port 8000 >> "$OUT/serve-tp.log" 2>&1 &
  server=$!
  if wait_ready $server; then
    timeout 200 python3 -m openinfer_server.cli bench serve --random-input-len 128 \
      --random-output-len 128 --num-prompts 1024 --max-concurrency 256 --request-rate inf \
      --ignore-eos --tokenizer $m32 --result-file "$OUT/serve-32b-tp2-128.json" \
      | grep -E "throughput|TTFT|TPOT|Failed"
    timeout 300 python3 -m openinfer_server.cli bench serve --random-input-len 2048 \
      --random-output-len 2048 --num-prompts 128 --max-concurrency 64 --request-rate inf \
      --ignore-eos --tokenizer $m32 --result-file "$OUT/serve-32b-tp2-2048.json" \
      | grep -E "throughput|TTFT|TPOT|Failed"
  else
    echo "tpserve: no server (see serve-tp.log)"; tail -30 "$OUT/serve-tp.log"
  fi
  stop $server
}
