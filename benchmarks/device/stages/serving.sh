# Throughput offline and served, and the engine under load: graphs captured at start, host cost
# per step, the prefix cache, Poisson arrivals, long prompts beside short ones, JSON schemas.

stage_throughput() {
  stage "offline throughput, Qwen3-8B, 128/128 x 512"
  timeout 200 python3 -m openinfer_server.cli bench throughput $M8 --load-format dummy --max-num-seqs 512 --max-model-len 4608 \
    --num-prompts 512 --input-len 128 --output-len 128 --result-file "$OUT/throughput-8b-128.json"
  stage "offline throughput, Qwen3-8B, 2048/2048 x 128"
  timeout 300 python3 -m openinfer_server.cli bench throughput $M8 --load-format dummy --max-num-seqs 128 --max-model-len 4608 \
    --num-prompts 128 --input-len 2048 --output-len 2048 --result-file "$OUT/throughput-8b-2048.json"
}

stage_serve() {
  for servers in $API_SERVERS; do
    tag=""; [ "$servers" != 1 ] && tag="-a$servers"
    stage "served throughput, Qwen3-8B, --api-server-count $servers"
    OPENINFER_CUDA_GRAPHS_AT_START=$SERVE_GRAPHS python3 -m openinfer_server.cli serve $M8 \
      --load-format dummy --max-num-seqs 512 \
      --max-model-len 4608 --port 8000 --api-server-count $servers \
      >> "$OUT/serve.log" 2>&1 &
    server=$!
    if ! wait_ready $server; then
      echo "serve: no server with --api-server-count $servers (see serve.log); its benches skipped"
      stop $server
      continue
    fi
    # Who uses the CPUs while the server is loaded: the engine, the frontends, the clients.
    top -b -d 3 -n 8 -w 150 | grep -E "^ *PID|python|openinf" > "$OUT/top$tag.log" 2>&1 &
    timeout 200 python3 -m openinfer_server.cli bench serve --random-input-len 128 --random-output-len 128 --num-prompts 1024 \
      --max-concurrency 512 --request-rate inf --ignore-eos --tokenizer $M8 \
      --result-file "$OUT/serve-8b-128$tag.json"
    [ -z "$tag" ] && timeout 300 python3 -m openinfer_server.cli bench serve --random-input-len 2048 --random-output-len 2048 --num-prompts 128 \
      --max-concurrency 128 --request-rate inf --ignore-eos --tokenizer $M8 \
      --result-file "$OUT/serve-8b-2048.json"
    stop $server
  done
}

stage_dp() {
  # Data parallelism, Qwen3-8B on 2 GPUs with the `serve` stage's per-engine flags: served
  # 128/128 at concurrency 1024 by one engine (DP1) and by two, one per GPU (DP2), behind the
  # same DP_API_SERVERS frontends (one frontend streams ~15k tokens/s, less than DP2 makes).
  # DP_PROMPTS requests (8192): with 4096 the DP2 run lasted 19 s, four request lifetimes, so
  # its ramp-up and drain weighed ~10 % of it. Then 2-turn conversations whose second turns
  # should hit the prefix cache, under both; then one DP2 replica killed under load: its
  # streams end with an error within 15 s, the others finish, the server exits 1 and no
  # openinfer process is left. DP_SIZES (1 2), DP_CLIENTS (--client-processes values, a bench
  # each; 0, the bench's choice) and DP_EXTRAS=0 (the throughput alone) narrow a run.
  local gpus servers=${DP_API_SERVERS:-4} dp pid clients
  gpus=$(nvidia-smi -L | wc -l)
  if [ "$gpus" -lt 2 ]; then echo "dp: needs 2 GPUs, this machine shows $gpus; skipped"; return; fi
  for dp in ${DP_SIZES:-1 2}; do
    stage "served throughput, Qwen3-8B, 128/128 at concurrency 1024, --data-parallel-size $dp"
    echo "=== --data-parallel-size $dp" >> "$OUT/serve-dp.log"
    OPENINFER_CUDA_GRAPHS_AT_START=$SERVE_GRAPHS python3 -m openinfer_server.cli serve $M8 \
      --load-format dummy --max-num-seqs 512 \
      --max-model-len 4608 --port 8000 --data-parallel-size $dp --api-server-count $servers \
      >> "$OUT/serve-dp.log" 2>&1 &
    server=$!
    if ! wait_ready $server; then
      echo "dp: no server with --data-parallel-size $dp (see serve-dp.log); its benches skipped"
      stop $server
      continue
    fi
    for clients in ${DP_CLIENTS:-0}; do
      # DP_CLIENTS: --client-processes values, one bench each (0: the bench's own choice).
      local tag="dp$dp" flags=""
      if [ "$clients" != 0 ]; then tag="dp$dp-c$clients"; flags="--client-processes $clients"; fi
      # Each replica's running and waiting requests, sampled through the bench.
      python3 benchmarks/device/replica_balance.py --seconds 300 \
        --json "$OUT/replica-balance-$tag.json" > "$OUT/replica-balance-$tag.log" 2>&1 &
      local balance=$!
      # Each role's CPU (engines, frontends, bench client) over 10 s once the load has ramped up.
      python3 benchmarks/device/process_cpu.py --delay 8 --seconds 10 \
        --json "$OUT/process-cpu-$tag.json" > "$OUT/process-cpu-$tag.log" 2>&1 &
      local cpu=$!
      timeout 300 python3 -m openinfer_server.cli bench serve --random-input-len 128 \
        --random-output-len 128 --num-prompts ${DP_PROMPTS:-8192} --max-concurrency 1024 \
        --request-rate inf --ignore-eos --tokenizer $M8 --result-file "$OUT/serve-8b-128-$tag.json" \
        $flags | grep -E "throughput|TTFT|TPOT|Failed|client processes"
      kill $balance 2>/dev/null; wait $balance 2>/dev/null
      wait $cpu 2>/dev/null
      cat "$OUT/replica-balance-$tag.log" "$OUT/process-cpu-$tag.log"
      # The requests the client held in flight against those the engines held, second by
      # second (the gap: on their way in or out), and the throughput at the limit alone.
      python3 benchmarks/device/dp_timeline.py "$OUT/serve-8b-128-$tag.json" \
        "$OUT/replica-balance-$tag.json" --json "$OUT/dp-timeline-$tag.json" \
        > "$OUT/dp-timeline-$tag.log" 2>&1
      head -2 "$OUT/dp-timeline-$tag.log"
    done
    if [ "${DP_EXTRAS:-1}" = 0 ]; then  # the throughput alone: no multi-turn run, no kill
      stop $server
      continue
    fi
    stage "2-turn conversations, --data-parallel-size $dp: second turns' prefix-cache hits"
    timeout 200 python3 benchmarks/device/multiturn_cache.py --conversations 256 \
      --concurrency 128 --first-len 1024 --next-len 128 --output-len 64 \
      --json "$OUT/multiturn-dp$dp.json"
    if [ "$dp" = 1 ]; then
      stop $server
      continue
    fi
    stage "one replica killed under load, --data-parallel-size 2"
    pid=$(grep -o "replica engine pids \[[0-9, ]*\]" "$OUT/serve-dp.log" | tail -1 \
      | grep -o "[0-9][0-9]*" | tail -1)
    timeout 200 python3 benchmarks/device/replica_kill.py --pid "$pid" --streams 128 \
      --output-len 500 --json "$OUT/replica-kill-dp2.json"
    for _ in $(seq 90); do kill -0 $server 2>/dev/null || break; sleep 1; done
    if kill -0 $server 2>/dev/null; then
      echo "dp: the server still runs 90 s after the kill"
      stop $server
    else
      wait $server
      echo "server exit status $? (1 expected)"
    fi
    echo "openinfer processes left: $(ps -eo comm | grep -c '^openinfer')"
  done
}

stage_deferred() {
  # Served throughput with load from the first second: every graph captured before ready
  # (`all`, the default) against only the start buckets (`start`, the rest when idle); each
  # process's GPU memory sampled every 0.5 s under the load (the peak printed).
  for mode in ${DEFERRED_MODES:-all start}; do
    stage "served throughput right after ready, Qwen3-8B, OPENINFER_CUDA_GRAPHS_AT_START=$mode"
    OPENINFER_CUDA_GRAPHS_AT_START=$mode python3 -m openinfer_server.cli serve $M8 --load-format dummy \
      --max-num-seqs 512 --max-model-len 4608 --port 8000 >> "$OUT/serve.log" 2>&1 &
    server=$!
    if wait_ready $server; then
      (for _ in $(seq 60); do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
         sleep 0.5; done > "$OUT/gpu-memory-$mode.log") &
      sampler=$!
      timeout 200 python3 -m openinfer_server.cli bench serve --random-input-len 128 \
        --random-output-len 128 --num-prompts 1024 --max-concurrency 512 --request-rate inf \
        --ignore-eos --tokenizer $M8 --result-file "$OUT/serve-8b-128-graphs-$mode.json" \
        | grep -E "throughput|TTFT|TPOT|Failed"
      kill $sampler 2>/dev/null
      echo "GPU memory per process, peak MiB (pid, used):"
      sort -t, -k2 -n -r "$OUT/gpu-memory-$mode.log" | sort -s -u -t, -k1,1 | head -4
    fi
    stop $server
  done
}

stage_timeline() {
  stage "host cost and GPU idle per decode step, batch 1/64/256/512, plain and overlapped, Qwen3-8B"
  timeout 400 python3 benchmarks/device/step_timeline.py $M8 --batch 1 64 256 512 --steps 30 \
    --profile-batch 256 512 --json "$OUT/timeline-8b.json" > "$OUT/timeline.log" 2>&1
  tail -8 "$OUT/timeline.log"
}

stage_prefix() {
  stage "prefix cache: TTFT cold vs warm by prompt length, Qwen3-4B"
  timeout 300 python3 -m openinfer_server.cli bench prefix $M4 --load-format dummy --max-num-seqs 4 --max-model-len 17408 \
    --input-len 256 1024 4096 16384 --num-iters 10 --result-file "$OUT/prefix-qwen3-4b.json"
  stage "first-token step, cold and warm: wall, GPU time by op, host profile"
  timeout 150 python3 benchmarks/device/prefill_breakdown.py $M4 --prompt-len 256 4096 16384 \
    --json "$OUT/prefill-breakdown-qwen3-4b.json" > "$OUT/prefill-breakdown.log" 2>&1
}

stage_qps() {
  # About 40 s of arrivals per rate up to 8/s; past that 480 prompts (the rates beyond
  # saturation then take as long as the server needs for them). The file is rewritten after
  # each rate, so a timeout keeps the rates done.
  stage "Poisson QPS sweep, 1024/128, Qwen3-4B"
  python3 -m openinfer_server.cli serve $M4 --load-format dummy --max-num-seqs 256 \
    --max-model-len 2048 --port 8000 > "$OUT/serve-qps.log" 2>&1 &
  server=$!
  wait_ready $server && timeout 330 python3 -m openinfer_server.cli bench serve \
    --random-input-len 1024 --random-output-len 128 --ignore-eos --tokenizer $M4 \
    --request-rate 2 4 8 16 32 64 --num-prompts 80 160 320 480 480 480 \
    --result-file "$OUT/qps-qwen3-4b.json"
  stop $server
}

stage_interference() {
  # 32 short requests (128 in, 256 out) stream while an 8192-token prompt arrives every 2 s:
  # with a 2048-token step budget the long prefills are chunked, with 16384 they are not.
  for run in chunked:2048 unchunked:16384; do
    label=${run%%:*} budget=${run#*:}
    echo "=== server for the $label run" >> "$OUT/serve-interference.log"
    stage "short-request ITL while 8k prompts arrive, $label (--max-num-batched-tokens $budget), Qwen3-4B"
    python3 -m openinfer_server.cli serve $M4 --load-format dummy --max-num-seqs 64 \
      --max-model-len 9216 --max-num-batched-tokens $budget --port 8000 \
      >> "$OUT/serve-interference.log" 2>&1 &
    server=$!
    wait_ready $server && timeout 120 python3 -m openinfer_server.cli bench interference \
      --tokenizer $M4 --duration 40 --long-interval 2 --label $label \
      --result-file "$OUT/interference-$label.json"
    stop $server
  done
}

stage_structured() {
  stage "structured output: TPOT with a JSON schema on every request vs none, compile time"
  timeout 420 python3 benchmarks/device/structured_tpot.py $M8 --batch 1 64 --steps 100 \
    --json "$OUT/structured-qwen3-8b.json" 2>&1 | tail -30
}
