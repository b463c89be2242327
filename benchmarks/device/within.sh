#!/usr/bin/env bash
# gpu_check.sh under a deadline: bash benchmarks/device/within.sh SECONDS [STAGE ...]. A call
# that runs past its limit loses gpu_check's own packing of $OUT; this packs what the stages
# left (past 8 files, one openinfer-results.tgz, which benchmarks/collect.py reads) either way.
# gpu_check runs in a session of its own, so that at the deadline everything it started goes
# too (the stages' own `timeout`s put their commands in process groups of their own, which a
# signal to gpu_check's group would miss), before anything is packed.
secs=$1; shift
OUT=${OUT:-/tmp/openinfer-out}
source benchmarks/device/stages/lib.sh  # pack_results
setsid bash benchmarks/device/gpu_check.sh "$@" &
session=$!
# (A watchdog stopped early, its sleep killed, does nothing: `&&`; its shell's "Terminated"
# about that sleep goes nowhere.)
( sleep "$secs" && { echo "within.sh: ${secs} s passed, stopping the stages"
  pkill -TERM -s "$session"; sleep 10; pkill -KILL -s "$session"; } ) 2>/dev/null &
watchdog=$!
wait "$session"
rc=$?
pkill -P "$watchdog" 2>/dev/null; kill "$watchdog" 2>/dev/null
pkill -KILL -s "$session" 2>/dev/null  # anything the stages left running
pack_results
exit $rc
