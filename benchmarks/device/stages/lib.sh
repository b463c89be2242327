# Helpers every stage file uses; gpu_check.sh sources this first.
# The throughput-serving stages' servers capture every CUDA graph before ready, as vLLM and
# SGLang do, so that no capture falls inside a measured window (by default a server captures
# its start buckets, then the others when idle or before the first step that needs one).
# SERVE_GRAPHS=start measures the default instead.
SERVE_GRAPHS=${SERVE_GRAPHS:-all}
stage() { echo "=== $1 ($(date +%T))"; }
has() { [[ " $stages " == *" $1 "* ]]; }
# FlashInfer's JIT builds come back as fi-jit.tgz.part-* (under the 16 MB a file may have).
save_jit() { [ -d /tmp/fi-jit ] && rm -f "$OUT"/fi-jit.tgz.part-* \
  && tar -czf - -C /tmp/fi-jit . | split -b 15M - "$OUT/fi-jit.tgz.part-"; }
# Only 8 files come back from a device call: past that, $OUT's files go back as one archive,
# openinfer-results.tgz, which benchmarks/collect.py reads like the folder. FlashInfer's JIT
# parts stay apart (each is near the 16 MB a file may have); a log over 8 MB (a served run's)
# keeps its last 4 MB, so that the archive stays under that size.
pack_results() {
  find "$OUT" -maxdepth 1 -type f -name '*.log' -size +8M \
    -exec sh -c 'tail -c 4000000 "$1" > "$1.tail" && mv "$1.tail" "$1"' _ {} \;
  # A long served run's per-request lists (16,384 requests' token gaps: ~17 MB a file; run 189's
  # archive came back over the limit) were read on the device (dp_timeline.py); what comes back
  # keeps the summaries: benchmarks/collect.py's `slim`, which drops them there anyway.
  find "$OUT" -maxdepth 1 -type f -name '*.json' -size +4M -exec python3 -c '
import json, runpy, sys
slim = runpy.run_path("benchmarks/collect.py")["slim"]
json.dump(slim(json.load(open(sys.argv[1]))), open(sys.argv[1], "w"))' {} \;
  if [ "$(ls "$OUT" | grep -v '^fi-jit' | wc -l)" -gt 8 ]; then
    (cd "$OUT" && ls | grep -v '^fi-jit' | tar -czf /tmp/openinfer-results.tgz -T - \
      && ls | grep -v '^fi-jit' | xargs rm -rf) && mv /tmp/openinfer-results.tgz "$OUT"/
  fi
}
# A server runs as a background python (not a subshell) so `kill $server` reaches it.
wait_ready() {  # $1: the server's pid; until /health answers, it exits, or WAIT_READY_S (180) pass
  python3 - "$1" "${WAIT_READY_S:-180}" <<'PY'
import os, sys, time, urllib.request as u
limit = float(sys.argv[2])
end = time.monotonic() + limit
while time.monotonic() < end:
    try:
        u.urlopen("http://127.0.0.1:8000/health"); sys.exit(0)
    except OSError:
        pass
    try:
        os.kill(int(sys.argv[1]), 0)
    except OSError:
        sys.exit("the server exited before it was ready; see its log")
    time.sleep(0.2)
sys.exit(f"the server was not ready after {limit:.0f} s")
PY
}
stop() { kill -TERM "$1"; wait "$1"; }
# /tmp/site-base: /tmp/site with the openinfer packages of the baseline wheels in $1
# (benchmarks/device/ab_base.sh COMMIT makes .ab-base), for the `ab` and `basetests` stages.
# Once a run: `basetests ab` installs the same folder's wheels once (BASE_SITE_OF: the folder
# /tmp/site-base holds the wheels of in this run; a shell variable, so no earlier run's counts).
install_base() {
  [ "${BASE_SITE_OF:-}" = "$1" ] && return 0
  [ -d "$1" ] || { echo "no baseline wheels in $1 (run benchmarks/device/ab_base.sh here)"; exit 1; }
  rm -rf /tmp/site-base && cp -r /tmp/site /tmp/site-base && rm -rf /tmp/site-base/openinfer_*
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site-base \
    "$1"/openinfer_*.whl || exit 1
  BASE_SITE_OF=$1
}
# The kernel benchmarks' runner: run_ops TIMEOUT_S LINES JSON OPS [FLAG ...] runs OPS (a
# comma-separated list, or all) with the runner's FLAGs, its rows to $OUT/JSON, the last LINES
# lines of its output shown (LINES `all`: every line).
run_ops() {
  local limit=$1 lines=$2 json=$3 ops=$4
  shift 4
  if [ "$lines" = all ]; then
    timeout "$limit" python3 -m benchmarks.ops.run --ops "$ops" "$@" --json "$OUT/$json"
  else
    timeout "$limit" python3 -m benchmarks.ops.run --ops "$ops" "$@" --json "$OUT/$json" 2>&1 \
      | tail -n "$lines"
  fi
}
# The golden gate with settings: golden_with NAME TESTS VAR=VALUE ... runs pytest -m gpu on
# TESTS (a file or folder) under the VARs, the last 15 lines to $OUT/golden_tests_NAME.log.
golden_with() {
  local name=$1 tests=$2
  shift 2
  stage "golden gate, $*"
  env "$@" timeout 420 python3 -m pytest -p no:cacheprovider -q -m gpu "$tests" 2>&1 \
    | tail -15 | tee "$OUT/golden_tests_$name.log"
}
# The sampler's kernel tests (the `sampling` and `verify` stages run them compiled).
SAMPLING_TESTS="packages/openinfer-kernels/tests/kernels/test_sampling.py
  packages/openinfer-kernels/tests/kernels/test_sampling_flashinfer.py
  packages/openinfer-kernels/tests/kernels/test_top_p_sample.py"
