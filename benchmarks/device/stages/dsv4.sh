# DeepSeek-V4: its kernels (`dsv4`) and the model at V4-Flash widths (`dsv4model`; `dsv4` runs
# both).

# A V4-Flash config folder cut to LAYERS layers (tests/gpu's `flash_config`: DeepSeek's keys,
# no quantization_config) with the tokenizer files: flash_folder DIR LAYERS.
flash_folder() {
  python3 - "$1" "$2" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "tests/gpu")
from test_tp_deepseek_v4_gpu import flash_config
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text(json.dumps(flash_config(int(sys.argv[2])) | {
    "architectures": ["DeepseekV4ForCausalLM"]}))
write_tokenizer_files(out)
PY
}

stage_dsv4() {
  dsv4_kernel_tests
  stage "DeepSeek-V4 kernels against their read floors"
  timeout 60 python3 benchmarks/device/dsv4_gemm_bench.py 2>&1 | tee "$OUT/dsv4-gemm.log" | tail -30
  stage "DeepSeek-V4 FP4 experts at decode sizes: grouped vs decode path, candidate tiles"
  timeout 180 python3 benchmarks/device/dsv4_moe_sweep.py 2>&1 | tee "$OUT/dsv4-moe-sweep.log" | tail -22
  timeout 60 python3 benchmarks/device/dsv4_attention_bench.py --json "$OUT/dsv4-attention.json" 2>&1 | tail -20
  timeout 240 python3 benchmarks/device/dsv4_mhc_bench.py 2>&1 | tee "$OUT/dsv4-mhc.log" | tail -30
  has dsv4model || stage_dsv4model  # `dsv4 dsv4model` runs the model part once
  dsv4_official_gate
}

# The correctness half of `dsv4` alone (a call short of device time): the kernel tests
# compiled, both golden gates, the small-batch linear sweep at V4-Flash's bf16 shapes and
# mHC's one-token knobs.
stage_dsv4gates() {
  dsv4_kernel_tests
  dsv4_transformers_gate
  dsv4_official_gate
  stage "small-batch linear tiles at V4-Flash's bf16 shapes (router, compressors, indexer)"
  run_ops 200 40 small-gemm-v4.json small_linear --sweep --cases V4
  stage "DeepSeek-V4 mHC at one token: the launch's knobs"
  timeout 240 python3 benchmarks/device/dsv4_mhc_bench.py 2>&1 | tee "$OUT/dsv4-mhc.log" \
    | grep -E "copy|hc_pre T=1|hc_pre triton T=64"
}

# mHC alone (a kernel change's check): its kernel tests compiled, then the one-token knobs.
stage_dsv4mhc() {
  stage "DeepSeek-V4 mHC kernel tests, compiled"
  timeout 180 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-deepseek-v4/tests/kernels/test_mhc.py \
    packages/openinfer-deepseek-v4/tests/kernels/test_mhc_push_post.py 2>&1 \
    | tail -4 | tee "$OUT/dsv4_mhc_tests.log"
  stage "DeepSeek-V4 mHC: hc_pre / hc_post against their floors, the one-token knobs"
  timeout 240 python3 benchmarks/device/dsv4_mhc_bench.py 2>&1 | tee "$OUT/dsv4-mhc.log" \
    | grep -E "copy|hc_pre|hc_post|hc_head"
}

# The official-code gate alone (carry official-dsv4; its fp32 judge needs an H200's memory).
stage_dsv4official() {
  dsv4_official_gate
}

# The FP4 experts' decode tiles at the widths a rank holds (DSV4_MOE_TP, "2 4": I / TP),
# for moe/decode.py's WIDTH_TILES (DSV4_MOE_TOKENS: the token counts, "1 4 16 64"), then the
# experts' kernel tests compiled.
stage_dsv4moe() {
  local tp
  for tp in ${DSV4_MOE_TP:-2 4}; do
    stage "DeepSeek-V4 FP4 experts at decode sizes, one rank of TP$tp (experts split by width)"
    timeout 240 python3 benchmarks/device/dsv4_moe_sweep.py --tp $tp --tokens ${DSV4_MOE_TOKENS:-1 4 16 64} 2>&1 \
      | tee "$OUT/dsv4-moe-sweep-tp$tp.log" | grep -E "^T=|^ *[0-9]+ +[0-9.]+ |DECODE_MAX|Error"
  done
  stage "DeepSeek-V4 FP4 expert kernel tests, compiled"
  timeout 240 python3 -m pytest -p no:cacheprovider -q -n 4 -m "gpu or not gpu" \
    packages/openinfer-deepseek-v4/tests/kernels/test_fp4_moe.py \
    packages/openinfer-deepseek-v4/tests/kernels/test_fp4_moe_decode.py 2>&1 \
    | tail -15 | tee "$OUT/dsv4_moe_tests.log"
}

# The FP4 experts on a prompt step (`dsv4_moe_prefill.py`): the grouped GEMMs at candidate tiles,
# DSV4_MOE_PREFILL_TOKENS (8192) tokens at a rank's width on one GPU and at TP2, against the
# run's matmul ceiling; then the grouped path's kernel tests compiled (the prompt tiles and
# V4-Flash's shapes).
stage_dsv4moeprefill() {
  stage "DeepSeek-V4 FP4 experts on a prompt step: grouped tiles against the matmul ceiling"
  timeout 150 python3 benchmarks/device/dsv4_moe_prefill.py \
    --tokens ${DSV4_MOE_PREFILL_TOKENS:-8192} --json "$OUT/dsv4-moe-prefill.json" 2>&1 \
    | tee "$OUT/dsv4-moe-prefill.log" | grep -E "^T=|ceiling:|Error"
  stage "DeepSeek-V4 grouped FP4 expert tests, compiled"
  timeout 120 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    -k "prompt_tiles or v4_flash or matches_reference" \
    packages/openinfer-deepseek-v4/tests/kernels/test_fp4_moe.py 2>&1 | tail -4 \
    | tee "$OUT/dsv4_moe_prefill_tests.log"
}

# V4-Flash's sparse attention on a prompt step (`dsv4_attention_prefill.py`): 8,192 tokens of
# one request, CSA and HCA, entries in bf16 and in the official FP8 rows (quant_sim's), 64 and
# 32 heads (one GPU, a TP2 rank), at DSV4_ATTN_PREFILL_CONTEXTS (8192 65536), the plan's tile
# and candidates, against the matmul floor of the same run.
stage_dsv4attnprefill() {
  stage "DeepSeek-V4-Flash sparse attention on a prompt step: tiles, bf16 and FP8 entries"
  timeout ${DSV4_ATTN_PREFILL_TIMEOUT_S:-240} python3 benchmarks/device/dsv4_attention_prefill.py \
    --context ${DSV4_ATTN_PREFILL_CONTEXTS:-8192 65536} --json "$OUT/dsv4-attention-prefill.json" \
    2>&1 | tee "$OUT/dsv4-attention-prefill.log" | grep -E "^T=|ceiling:|Error"
}

# Where a long V4-Flash prompt's step goes: V4-Flash widths at DSV4_PREFILL_LAYERS (3) layers on
# one GPU (DSV4_PREFILL_TP, e.g. "1 2": each tensor-parallel size, rank 0's profile;
# DSV4_PREFILL_MAX_LEN: the engine's --max-model-len), one prompt of DSV4_PREFILL_LEN (8192)
# tokens, cold (`prefill_breakdown.py`: GPU time by op and top kernels; its progress
# lines say how far it got if the deadline cuts it).
stage_dsv4prefill() {
  local d4=/tmp/dsv4-prefill tp log what="${DSV4_PREFILL_LEN:-8192}-token prompt's step by op"
  flash_folder "$d4" "${DSV4_PREFILL_LAYERS:-3}"
  for tp in ${DSV4_PREFILL_TP:-1}; do
    log="$OUT/prefill-breakdown-dsv4-tp$tp"
    stage "DeepSeek-V4-Flash widths, ${DSV4_PREFILL_LAYERS:-3} layers, TP=$tp: a $what"
    timeout ${DSV4_PREFILL_TIMEOUT_S:-400} python3 benchmarks/device/prefill_breakdown.py $d4 \
      --prompt-len ${DSV4_PREFILL_LEN:-8192} --iters 2 --cold-only --tensor-parallel-size $tp \
      ${DSV4_PREFILL_MAX_LEN:+--max-model-len $DSV4_PREFILL_MAX_LEN} \
      --json "$log.json" > "$log.log" 2>&1
    grep -E "^prompt|^  +[0-9.]+ ms|^progress" "$log.log" | head -30 || tail -20 "$log.log"
  done
}

# V4-Flash's indexer on a prompt step (`dsv4_indexer_bench.py`): the scores kernel at each of
# DSV4_INDEXER_TILES (query tokens a program[:entries a tile[:warps]]; default the bench's) and
# the ordered top-k by sorting and by radix select, at T:C (tokens:context) DSV4_INDEXER_CASES
# (default 8192:8192 8192:65536 8192:524288 1:524288), keys in bf16 and FP4, against the
# matmul floor of the same run.
stage_dsv4indexer() {
  stage "DeepSeek-V4-Flash indexer on a prompt step: scores by tile, top-512 by sort and select"
  timeout ${DSV4_INDEXER_TIMEOUT_S:-300} python3 benchmarks/device/dsv4_indexer_bench.py --fp4 \
    ${DSV4_INDEXER_TILES:+--tiles $DSV4_INDEXER_TILES} \
    --cases ${DSV4_INDEXER_CASES:-8192:8192 8192:65536 8192:524288 1:524288} \
    --json "$OUT/dsv4-indexer.json" 2>&1 | tee "$OUT/dsv4-indexer.log" | grep -E "^T=|Error|rror:"
}

dsv4_kernel_tests() {
  stage "DeepSeek-V4 kernel tests (its own and the shared FP8 linear), compiled, every size"
  timeout 180 python3 -m pytest -p no:cacheprovider -q -n 8 -m "gpu or not gpu" \
    packages/openinfer-deepseek-v4/tests/kernels \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear.py \
    packages/openinfer-kernels/tests/kernels/test_fp8_linear_fused.py 2>&1 \
    | tail -25 | tee "$OUT/dsv4_kernel_tests.log"
}

dsv4_transformers_gate() {
  stage "DeepSeek-V4 golden gate vs transformers (V4-Flash widths, 3 layers, FP8/FP4 weights, bf16)"
  timeout 300 python3 -m pytest -p no:cacheprovider -q -s -m gpu \
    tests/gpu/test_golden_deepseek_v4_gpu.py 2>&1 | tail -40 | tee "$OUT/dsv4_golden.log"
}

# The golden gate against DeepSeek's official inference/model.py (fetched, never committed): a
# person copies its inference/ files into official-dsv4/ (git-ignored) at the repository root,
# and the device call must carry ["official-dsv4", ".whl"]. Without the folder the gate fails
# and says so.
dsv4_official_gate() {
  stage "DeepSeek-V4 golden gate vs the official inference code (V4-Flash widths, 3 layers, bf16)"
  OPENINFER_DSV4_OFFICIAL=$PWD/official-dsv4 timeout 600 python3 -m pytest -p no:cacheprovider \
    -q -s -m gpu tests/gpu/test_official_deepseek_v4_gpu.py 2>&1 | tail -40 \
    | tee "$OUT/dsv4_official_golden.log"
}

stage_dsv4model() {
  dsv4_transformers_gate
  stage "DeepSeek-V4 decode step, kernel by kernel (3 layers, batch 1 and 64)"
  timeout 150 python3 benchmarks/device/dsv4_profile.py --json "$OUT/dsv4-profile.json" 2>&1 \
    | tee "$OUT/dsv4-profile.log" | tail -70
  stage "DeepSeek-V4 launches per layer and decode time, eager and graphed (V4-Flash widths)"
  timeout 240 python3 benchmarks/device/dsv4_launches.py --batches 1,64 --json "$OUT/dsv4-launches.json" 2>&1 | tee "$OUT/dsv4-launches.log" | tail -25
  stage "DeepSeek-V4 decode time per layer, batch 1 and 64 (V4-Flash widths)"
  timeout 150 python3 benchmarks/device/dsv4_decode.py --layers ${DSV4_LAYERS:-6} \
    --json "$OUT/dsv4-decode.json" 2>&1 | tail -8
  # V4-Flash cut to DSV4_BENCH_LAYERS layers (all 43 need two H200s): the engine's own
  # batch-1 latency with CUDA graphs against the weight-read floor of the same layers.
  local d4=/tmp/dsv4-flash-cut
  python3 - "$d4" "${DSV4_BENCH_LAYERS:-12}" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "tests/gpu")
from dsv4_transformers import transformers_config
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
config = json.loads(transformers_config(int(sys.argv[2])).to_json_string())
config["architectures"] = ["DeepseekV4ForCausalLM"]
(out / "config.json").write_text(json.dumps(config))
write_tokenizer_files(out)
PY
  stage "DeepSeek-V4 batch-1 latency, ${DSV4_BENCH_LAYERS:-12} of V4-Flash's layers"
  timeout 240 python3 -m openinfer_server.cli bench latency $d4 --load-format dummy --max-num-seqs 4 \
    --max-model-len 4096 --input-len 128 2048 --output-len 64 --num-iters 3 \
    --result-file "$OUT/latency-dsv4-cut.json" 2>&1 | tail -12
  # The same with the official FP8 / FP4 rounding inside the forward (quant_sim.py; on by
  # default for DeepSeek's quantized release configs, off for this transformers-written one).
  stage "DeepSeek-V4 batch-1 latency, the same layers, OPENINFER_DSV4_QUANT_SIM=on"
  OPENINFER_DSV4_QUANT_SIM=on timeout 240 python3 -m openinfer_server.cli bench latency $d4 \
    --load-format dummy --max-num-seqs 4 --max-model-len 4096 --input-len 128 2048 \
    --output-len 64 --num-iters 3 --result-file "$OUT/latency-dsv4-cut-quantsim.json" 2>&1 | tail -12
}

stage_dsv4full() {
  # V4-Flash at full size (43 layers, FP8 linears and FP4 routed experts, dummy weights) over
  # every GPU of the machine (tensor parallel; DSV4_EP=1 adds --enable-expert-parallel): the
  # engine's batch-1 latency against the per-rank read floor of what a decode step reads, then
  # served, after a first pass of its own: batch-64 TPOT (64 requests of 1024/128 at
  # concurrency 64) and 1,024 prompts of
  # 1024/128 at concurrency 256, with the KV cache's size as the engine logs it; then the
  # longest context the KV cache fits, admitted (`longest_context.py`; DSV4_LONGEST_TIMEOUT_S:
  # its limit, 400 s); `profile`: rank 0's decode step by op and kernel
  # (`decode_breakdown.py`); `gate`: TP2 against one GPU at 3
  # layers (tests/gpu/test_tp_deepseek_v4_gpu.py); `batch`: DSV4_BATCH (64) requests decoding
  # together (`bench latency --batch-size`). An engine start each; DSV4FULL_PARTS picks them
  # (default "latency serve longest").
  local d4=/tmp/dsv4-flash tp ep="" part longest_runs=0
  tp=$(nvidia-smi -L | wc -l)
  [ "${DSV4_EP:-0}" = 1 ] && ep=--enable-expert-parallel
  flash_folder "$d4" 43
  for part in ${DSV4FULL_PARTS:-latency serve longest}; do
    if [ "$part" = longest ]; then
      # No --max-model-len: the engine lowers the model's 1M to what the KV cache holds (and
      # logs it); one prompt of that length, admitted or not. Named twice ("longest longest"),
      # the second runs on the first's Triton cache (a warm start): -1, -2 in the file names.
      longest_runs=$((longest_runs + 1))
      local name="dsv4-flash-longest-$longest_runs"
      stage "DeepSeek-V4-Flash (43 layers): the longest context admitted, TP=$tp, run $longest_runs"
      OPENINFER_CUDA_GRAPHS_AT_START=$SERVE_GRAPHS python3 -m openinfer_server.cli serve $d4 \
        --load-format dummy --tensor-parallel-size $tp \
        $ep --max-num-seqs 4 --port 8000 > "$OUT/serve-$name.log" 2>&1 &
      server=$!
      if WAIT_READY_S=420 wait_ready $server; then
        grep -E "KV cache:|max_model_len lowered|engine ready in" "$OUT/serve-$name.log" | tail -3
        timeout ${DSV4_LONGEST_TIMEOUT_S:-400} python3 benchmarks/device/longest_context.py \
          --json "$OUT/$name.json"
      else
        echo "dsv4full: no server (see serve-$name.log)"
        tail -20 "$OUT/serve-$name.log"
      fi
      stop $server
      continue
    fi
    if [ "$part" = gate ]; then
      # TP2 (and TP2 with expert parallelism) against one GPU, 3 layers at V4-Flash widths,
      # teacher-forced: the tensor-parallel paths (the pushed all-reduce fused with hc_post
      # among them) within the one-GPU gate's bounds; and TP2 with the fused hc_post + hc_pre
      # against the same engine without it, position by position.
      # DSV4_GATE_K: the cases (default both; "tp2-ep" the expert-parallel one alone). The
      # whole log stays in $OUT (a stuck run prints where each thread was, SIGABRT).
      stage "DeepSeek-V4 TP2 and TP2+EP against one GPU (3 layers, V4-Flash widths)"
      timeout -s ABRT ${DSV4_GATE_TIMEOUT_S:-400} python3 -m pytest -p no:cacheprovider -q -s \
        -m gpu -o log_cli=true --log-cli-level=INFO \
        -k "(matches_one_gpu and (${DSV4_GATE_K:-tp2})) or post_pre_against_plain" \
        tests/gpu/test_tp_deepseek_v4_gpu.py > "$OUT/dsv4_tp_gate.log" 2>&1
      grep -E "^\{|passed|failed|Error" "$OUT/dsv4_tp_gate.log" | tail -8
      continue
    fi
    if [ "$part" = profile ]; then
      # Rank 0's batch-1 decode step by op and kernel (CUDA graphs), the collectives apart.
      stage "DeepSeek-V4-Flash (43 layers) decode step by op, rank 0 of TP=$tp"
      timeout 400 python3 benchmarks/device/decode_breakdown.py $d4 --tensor-parallel-size $tp \
        --steps 30 --json "$OUT/decode-breakdown-dsv4-flash-tp$tp.json" \
        > "$OUT/decode-breakdown-dsv4-flash-tp$tp.log" 2>&1
      python3 - "$OUT/decode-breakdown-dsv4-flash-tp$tp.json" <<'PY' \
        || tail -20 "$OUT/decode-breakdown-dsv4-flash-tp$tp.log"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"step {r['step_ms']:.2f} ms, GPU busy {r['gpu_busy_ms']:.2f} ms, "
      f"{r['gpu_work_items_per_step']:.0f} GPU work items a step; marginal by op:",
      ", ".join(f"{k} {v:.2f}" for k, v in r["marginal_by_op_ms"].items()))
for k, v in r["marginal_top_kernels_ms"].items():
    print(f"  {v:7.3f} ms  {k}")
PY
      continue
    fi
    if [ "$part" = batch ]; then
      # DSV4_BATCH (64) requests of 128 tokens added together, 64 tokens each: the batch's
      # TPOT with every request decoding (`bench latency --batch-size`).
      local b=${DSV4_BATCH:-64}
      stage "DeepSeek-V4-Flash (43 layers) batch-$b latency, TP=$tp ${ep:-(experts split by width)}"
      timeout 420 python3 -m openinfer_server.cli bench latency $d4 --load-format dummy \
        --tensor-parallel-size $tp $ep --max-num-seqs $b --max-model-len 4096 --input-len 128 \
        --output-len 64 --batch-size $b --num-iters 2 --num-iters-warmup 1 \
        --result-file "$OUT/latency-dsv4-flash-tp$tp${ep:+-ep}-bs$b.json" \
        > "$OUT/latency-dsv4-flash-tp$tp${ep:+-ep}-bs$b.log" 2>&1
      grep -E "TPOT|TTFT|floor|KV cache:" "$OUT/latency-dsv4-flash-tp$tp${ep:+-ep}-bs$b.log" \
        || tail -30 "$OUT/latency-dsv4-flash-tp$tp${ep:+-ep}-bs$b.log"
      continue
    fi
    if [ "$part" = latency ]; then
      # DSV4FULL_VARIANTS: A/Bs after the default, each VAR=VALUE (e.g.
      # "OPENINFER_DSV4_STACK=0 OPENINFER_DSV4_PUSH_POST=0"), the same command with it set, or
      # a flag (e.g. "--enable-expert-parallel"), the same command with it added; a '+' joins
      # settings of one variant (A=1+B=2).
      local variant name vars flags
      for variant in default ${DSV4FULL_VARIANTS:-}; do
        vars=() flags=() name=""
        case $variant in
          default) ;;
          --*) flags=("$variant") name="-${variant#--}" ;;
          *) read -ra vars <<< "${variant//+/ }"
             name="-${variant//[=,+]/-}" ;;  # (a file name: no '=', ',' or '+')
        esac
        stage "DeepSeek-V4-Flash (43 layers) batch-1 latency, TP=$tp ${ep:-(experts split by width)} $variant"
        env "${vars[@]}" timeout 420 python3 -m \
          openinfer_server.cli bench latency $d4 --load-format dummy \
          --tensor-parallel-size $tp $ep "${flags[@]}" --max-num-seqs 4 --max-model-len 4096 --input-len 128 \
          --output-len 64 --num-iters 3 --result-file "$OUT/latency-dsv4-flash-tp$tp$name.json" \
          > "$OUT/latency-dsv4-flash-tp$tp$name.log" 2>&1
        grep -E "TPOT|TTFT|floor|KV cache:" "$OUT/latency-dsv4-flash-tp$tp$name.log" \
          || tail -30 "$OUT/latency-dsv4-flash-tp$tp$name.log"
      done
      continue
    fi
    stage "DeepSeek-V4-Flash (43 layers) served, TP=$tp ${ep:-(experts split by width)}"
    OPENINFER_CUDA_GRAPHS_AT_START=$SERVE_GRAPHS python3 -m openinfer_server.cli serve $d4 \
      --load-format dummy --tensor-parallel-size $tp \
      $ep --max-num-seqs 256 --max-model-len 8192 --port 8000 > "$OUT/serve-dsv4-flash.log" 2>&1 &
    server=$!
    if ! WAIT_READY_S=420 wait_ready $server; then
      echo "dsv4full: no server (see serve-dsv4-flash.log)"; tail -20 "$OUT/serve-dsv4-flash.log"
      stop $server; continue
    fi
    grep -E "KV cache:|bytes a token|per token" "$OUT/serve-dsv4-flash.log" | tail -3
    # A first pass (kept apart as -first): the first requests after a start have stalled for
    # seconds (run 225: 442 against 916 tok/s for the next 64 new prompts). Each run its own
    # seed, so no run's prompts are in the prefix cache from another's. DSV4FULL_SERVE_RUNS:
    # the runs, each PROMPTS:CONCURRENCY[:first].
    local seed=0
    for run in ${DSV4FULL_SERVE_RUNS:-64:64:first 64:64 1024:256}; do
      seed=$((seed + 1))
      local n=${run%%:*} rest=${run#*:} c tag
      c=${rest%%:*} tag=c$c; [ "${rest#*:}" = first ] && tag=c$c-first
      stage "served 1024/128, $n prompts at concurrency $c ($tag, seed $seed)"
      timeout 300 python3 -m openinfer_server.cli bench serve --random-input-len 1024 \
        --random-output-len 128 --num-prompts $n --max-concurrency $c --seed $seed \
        --request-rate inf --ignore-eos --tokenizer $d4 \
        --result-file "$OUT/serve-dsv4-flash-$tag.json" | grep -E "throughput|TTFT|TPOT|Failed"
    done
    stop $server
  done
}
