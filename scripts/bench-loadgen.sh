#!/usr/bin/env bash
# Is the lab's client emulator fast enough not to be the bottleneck? Against the origin emulator
# alone (pinned to core 1, one worker thread), interleaves wrk (-t1, core 0) and
# `meshcache lab load --origin` (one worker thread, core 0), same connections, same duration,
# same URL, for 1 KiB and 10 KiB bodies, and prints the request rates and their ratio per round.
# The lab's target: at least 80% of wrk's rate.
#
# Usage: scripts/bench-loadgen.sh [--rounds N] [--duration SECS] [--connections N] [--bin PATH]
# Installs wrk if missing (apt). Runs in a network namespace of its own when it can.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_TAG=bench-loadgen
# shellcheck source=bench/lib.sh
. "$REPO/scripts/bench/lib.sh"

ROUNDS=3
DURATION=10
CONNS=50
BIN=""
ORIG_ARGS=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) die "unknown option $1" ;;
  esac
done

declare -A need=([wrk]=wrk [taskset]=util-linux)
bench_install_missing need
if [ -z "$BIN" ]; then
  (cd "$REPO" && cargo build --release -q -p meshcache) || die "build failed"
  BIN="$REPO/target/release/meshcache"
fi
bench_enter_netns BENCH_LOADGEN_NETNS "$0" "${ORIG_ARGS[@]}" --bin "$BIN"
ip link set lo up 2>/dev/null || true

PORT=18570
TOKIO_WORKER_THREADS=1 taskset -c 1 "$BIN" lab origin --listen "127.0.0.1:$PORT" >/dev/null 2>&1 &
ORIGIN=$!
trap 'bench_stop_pids $ORIGIN' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done

echo "| size | round | wrk req/s | lab load req/s | ratio |"
echo "| ---: | ---: | ---: | ---: | ---: |"
for size in 1024 10240; do
  url="http://127.0.0.1:$PORT/obj?size=$size"
  ratios=()
  for round in $(seq "$ROUNDS"); do
    w=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" "$url" | awk '/Requests\/sec/ { print $2 }')
    m=$(taskset -c 0 "$BIN" lab load --origin --url "$url" --connections "$CONNS" \
      --duration "${DURATION}s" --json | awk -F': ' '/"req_per_s"/ { gsub(/,/, "", $2); print $2 }')
    r=$(awk -v a="$m" -v b="$w" 'BEGIN { printf "%.2f", a / b }')
    ratios+=("$r")
    printf '| %s | %s | %.0f | %.0f | %s |\n' "$size" "$round" "$w" "$m" "$r"
  done
  med=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  echo "| $size | median | | | **$med** |"
done
