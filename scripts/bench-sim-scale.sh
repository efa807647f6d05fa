#!/usr/bin/env bash
# Memory and speed of the simulator per protocol as the mesh grows (docs/simulator.md,
# "Up to 1,000 caches").
#
#   scripts/bench-sim-scale.sh [--sizes "100 300 1000"] [--protocols "none icp ..."] [--rounds N]
#                              [--out DIR] [--no-build]
#
# One trace (2,000 clients × 100 requests, half the new URLs shared), then for each size and
# protocol `meshcache sim run` under GNU time: the whole command's wall time, its maximum
# resident set size, and the simulator's own requests per second (its event loop). ICP runs with
# the aggregate model (`icp-aggregate`) unless `icp` is named, multicast likewise
# (`multicast-aggregate`, only the holder whose HIT comes first gets the group's query as an
# event; `multicast` for a copy per member). Prints a Markdown table and writes
# it to OUT/results.md. The default matrix takes about 5 minutes; `icp` (a datagram per event) and
# `multicast` at 1,000 caches add about 8 and 2 minutes.
set -euo pipefail

sizes="100 300 1000"
protocols="none icp-aggregate summary digest directory multicast-aggregate carp"
rounds=1
out=target/bench-sim-scale
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) sizes="$2"; shift 2 ;;
        --protocols) protocols="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "bench-sim-scale: unknown argument $1" >&2; exit 2 ;;
    esac
done

command -v /usr/bin/time >/dev/null || { echo "bench-sim-scale: needs GNU time (apt install time)" >&2; exit 1; }
cd "$(dirname "$0")/.."
[ "$build" = 1 ] && cargo build --release -q -p meshcache
bin=target/release/meshcache
mkdir -p "$out"
trace="$out/t.trace"
[ -f "$trace" ] || "$bin" workload generate --clients 2000 --requests-per-client 100 --shared 0.5 \
    --out "$trace" >/dev/null

table="$out/results.md"
{
    echo "| caches | protocol | round | wall s | max RSS MB | simulated req/s | hit ratio |"
    echo "| ---: | --- | ---: | ---: | ---: | ---: | --- |"
} >"$table"
for n in $sizes; do
    for p in $protocols; do
        args=(--set "mesh.caches=$n")
        case "$p" in
            icp-aggregate) args+=(--set protocol.name=icp --set 'protocol.icp_model="aggregate"') ;;
            multicast-aggregate) args+=(--set protocol.name=multicast --set 'protocol.icp_model="aggregate"') ;;
            *) args+=(--set "protocol.name=$p") ;;
        esac
        for r in $(seq 1 "$rounds"); do
            /usr/bin/time -f "%e %M" -o "$out/time.txt" "$bin" sim run --trace "$trace" "${args[@]}" \
                >"$out/run.txt" 2>&1
            read -r wall rss <"$out/time.txt"
            rps=$(grep -o '[0-9]* requests/s' "$out/run.txt" | cut -d' ' -f1)
            hit=$(grep -o '^hit ratio [0-9.]* %' "$out/run.txt" | cut -d' ' -f3)
            echo "| $n | $p | $r | $wall | $((rss / 1024)) | $rps | $hit % |" | tee -a "$table"
        done
    done
done
echo "results: $table"
