#!/usr/bin/env bash
# Summary Cache's CPU overhead for one node that has a core of its own, as each proxy had a
# machine of its own in the paper: node a alone on core 1; its three peers (b, c, d), the
# origin and the clients on core 0. Four live nodes, each with 10 clients of its own (600
# requests each, 25 % inherent hit ratio, disjoint streams), a 50 ms origin. Each round runs
# `none` then `summary`; node a's CPU is its threads' scheduler account over its clients' pass.
#
#   scripts/bench-summary-alone.sh [--rounds N] [--bin PATH]     (about 1 minute a round)
#
# Prints node a's CPU per run and, per round, the summary run's overhead over the plain one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5
BIN=target/release/meshcache
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--bin PATH]" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release first" >&2; exit 1; }
BIN=$(realpath "$BIN")
command -v taskset >/dev/null || { echo "needs taskset (util-linux)" >&2; exit 1; }
DIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT

declare -A IP=([a]=127.0.0.21 [b]=127.0.0.22 [c]=127.0.0.23 [d]=127.0.0.24)
ORIGIN=127.0.1.1:18181
"$BIN" workload generate --clients 10 --requests-per-client 600 --hit-ratio 0.25 --groups 1 \
  --seed 2001 --out "$DIR/trace" >/dev/null
for n in a b c d; do
  sed "s#http://group[0-9].lab/#http://$n.lab:18181/#" "$DIR/trace" >"$DIR/trace-$n"
done

config() { # NAME PROTOCOL
  local name=$1 proto=$2 ip=${IP[$1]}
  cat <<EOT
name = "$name"
[http]
listen = ["$ip:3128"]
allow = ["127.0.0.0/8"]
[admin]
listen = "$ip:3180"
[store]
memory = 29551356
[upstream]
source_address = "$ip"
[dns.hosts]
"a.lab" = "127.0.1.1"
"b.lab" = "127.0.1.1"
"c.lab" = "127.0.1.1"
"d.lab" = "127.0.1.1"
[cooperation]
protocol = "$proto"
icp_listen = "$ip:3130"
EOT
  if [ "$proto" != none ]; then
    for m in a b c d; do
      [ "$m" = "$name" ] && continue
      printf '[[peer]]\nname = "%s"\nrole = "sibling"\nhttp = "%s:3128"\nicp = "%s:3130"\n' \
        "$m" "${IP[$m]}" "${IP[$m]}"
    done
  fi
}

runtime_ns() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {printf "%.0f", s}'; }

taskset -c 0 "$BIN" lab origin --listen "$ORIGIN" --delay 50ms --cache-control max-age=86400 \
  >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5
for r in $(seq 1 "$ROUNDS"); do
  declare -A CPU=()
  for proto in none summary; do
    NODES=()
    for n in a b c d; do
      config "$n" "$proto" >"$DIR/$n.toml"
      core=0; [ "$n" = a ] && core=1
      MESHCACHE_LOG=warn TOKIO_WORKER_THREADS=1 taskset -c "$core" "$BIN" run -c "$DIR/$n.toml" \
        >"$DIR/$n.out" 2>&1 &
      NODES+=($!); PIDS+=($!)
    done
    A=${NODES[0]}
    sleep 2.5
    before=$(runtime_ns "$A")
    LOADS=()
    for n in a b c d; do
      timeout 300 taskset -c 0 "$BIN" lab load --trace "$DIR/trace-$n" --proxy "${IP[$n]}:3128" \
        --json >"$DIR/load-$n.json" 2>/dev/null &
      LOADS+=($!)
    done
    wait "${LOADS[@]}"
    after=$(runtime_ns "$A")
    CPU[$proto]=$(( (after - before) / 1000000 ))
    kill "${NODES[@]}" 2>/dev/null || true
    wait "${NODES[@]}" 2>/dev/null || true
    echo "round $r $proto: node a ${CPU[$proto]} ms of CPU"
  done
  awk -v a="${CPU[none]}" -v b="${CPU[summary]}" -v r="$r" \
    'BEGIN { printf "round %d overhead: %+.1f %%\n", r, (b / a - 1) * 100 }'
done
