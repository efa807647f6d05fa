#!/usr/bin/env bash
# The simulator's speed, measured against libCacheSim in the same run.
#
#   scripts/bench-sim.sh [--rounds N] [--out DIR] [--no-build] [--single-only]
#
# 1. Single-cache LRU replay: the same 2-million-request trace (the Summary Cache benchmark
#    model, 1,000 clients) through `meshcache sim run` (one cache, serial replay) and through
#    libCacheSim's LRU (PyPI `libcachesim`, installed into a venv under the output directory),
#    cache = 10 % of the unique bytes. Rounds interleave the two, both pinned to core 1; the
#    script checks that both report the same miss ratio (same trace, same policy) and prints
#    medians and the ratio.
# 2. A 100-cache ICP mesh on 1 million requests (1,000 clients, closed loop), pinned to core 1:
#    simulated requests per second of wall time, with the aggregate ICP model and with one
#    event per datagram, rounds interleaved.
#
# What each side times: meshcache its replay loop after parsing and interning the trace
# (`wall_seconds` in its results); libCacheSim its `process_trace` over its own binary trace
# format (`oracleGeneral`, written once beforehand), which includes reading that file.
set -euo pipefail

rounds=3
out=target/bench-sim
build=1
icp=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --single-only) icp=0; shift ;;
        *) echo "usage: $0 [--rounds N] [--out DIR] [--no-build] [--single-only]" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
mkdir -p "$out"
if [ "$build" = 1 ]; then
    cargo build --release -p meshcache
fi
bin=target/release/meshcache
pin="taskset -c 1"
command -v taskset >/dev/null || pin=""

if [ ! -x "$out/venv/bin/python" ]; then
    python3 -m venv "$out/venv"
    "$out/venv/bin/pip" install --quiet libcachesim
fi

trace="$out/benchmark-2m.trace"
if [ ! -s "$trace" ]; then
    $bin workload generate --clients 1000 --requests-per-client 2000 --hit-ratio 0.5 \
        --groups 4 --shared 0.3 --seed 1 --out "$trace" > "$out/trace.txt"
fi
cache=$(awk '/^suggested cache:/ {print $3}' "$out/trace.txt")
echo "trace: $trace, cache $cache bytes (10 % of the unique bytes)"

cat > "$out/lcs.py" <<'EOF'
import json, struct, sys, time, os
import libcachesim as lcs
trace, cache = sys.argv[1], int(sys.argv[2])
binary = trace + ".oracleGeneral"
if not os.path.exists(binary):
    ids, records = {}, bytearray()
    with open(trace) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            _, _, size, url = line.split(" ", 3)
            records += struct.pack("<IQIq", 0, ids.setdefault(url, len(ids) + 1), int(size), -1)
    with open(binary, "wb") as f:
        f.write(records)
n = os.path.getsize(binary) // 24
reader = lcs.TraceReader(binary, lcs.TraceType.ORACLE_GENERAL_TRACE)
start = time.perf_counter()
miss, byte_miss = lcs.LRU(cache_size=cache).process_trace(reader)
seconds = time.perf_counter() - start
print(json.dumps({"requests": n, "miss_ratio": miss, "byte_miss_ratio": byte_miss,
                  "seconds": seconds, "requests_per_second": n / seconds}))
EOF

single() {
    $pin $bin sim run --trace "$trace" --json --set mesh.caches=1 --set protocol.name=none \
        --set replay.mode=serial --set mesh.cache_size="$cache" \
        --set mesh.max_object_size="$cache" 2>/dev/null
}
lcs() {
    $pin "$out/venv/bin/python" "$out/lcs.py" "$trace" "$cache"
}

lcs > /dev/null  # writes libCacheSim's binary trace once
: > "$out/single.jsonl"
for i in $(seq 1 "$rounds"); do
    single | python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"requests": r["answered"]["requests"], "miss_ratio": 1 - r["hit_ratio"], "byte_miss_ratio": 1 - r["byte_hit_ratio"], "seconds": r["wall_seconds"], "requests_per_second": r["requests_per_second"], "who": "meshcache"}))' >> "$out/single.jsonl"
    lcs | python3 -c 'import json,sys; r=json.load(sys.stdin); r["who"]="libcachesim"; print(json.dumps(r))' >> "$out/single.jsonl"
done
python3 - "$out/single.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {w: [r for r in rows if r["who"] == w] for w in ("meshcache", "libcachesim")}
for w, rs in by.items():
    rates = [r["requests_per_second"] for r in rs]
    print(f"{w:12} LRU: miss ratio {rs[0]['miss_ratio']:.6f}, byte miss ratio {rs[0]['byte_miss_ratio']:.6f}, "
          f"requests/s median {statistics.median(rates):,.0f} (rounds {', '.join(f'{x:,.0f}' for x in rates)})")
m, l = by["meshcache"][0], by["libcachesim"][0]
if abs(m["miss_ratio"] - l["miss_ratio"]) > 1e-6:
    print(f"MISS RATIOS DIFFER: {m['miss_ratio']} vs {l['miss_ratio']}")
ratio = statistics.median(r["requests_per_second"] for r in by["meshcache"]) / statistics.median(
    r["requests_per_second"] for r in by["libcachesim"])
print(f"meshcache / libCacheSim: {ratio:.2f}x")
EOF

[ "$icp" = 1 ] || exit 0
icp_trace="$out/benchmark-1m.trace"
if [ ! -s "$icp_trace" ]; then
    $bin workload generate --clients 1000 --requests-per-client 1000 --groups 100 --shared 0.3 \
        --seed 1 --out "$icp_trace" > /dev/null
fi
for i in $(seq 1 "$rounds"); do
    for model in aggregate datagrams; do
        $pin $bin sim run --trace "$icp_trace" --set mesh.caches=100 --set protocol.name=icp \
            --set protocol.icp_model=$model 2>/dev/null |
            grep -E "^(hit ratio|inter-cache|latency|simulated)" |
            sed "s/^/100-cache ICP ($model), round $i: /"
    done
done
