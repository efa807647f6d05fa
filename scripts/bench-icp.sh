#!/usr/bin/env bash
# ICP overhead benchmark, the worst case of the Summary Cache paper's Table 2: four caches as
# mutual siblings, a workload in which no remote hit is possible (every node asks for URLs no
# other node ever asks for, and none twice), against the same four caches with cooperation
# off. Measures UDP datagrams, server CPU and client latency per request, for meshcache and,
# in the same run, for four Squid 5.7 instances configured alike.
#
# Configurations (all sixteen servers run for the whole measurement, each on its own
# 127.0.0.x, HTTP on :3128, ICP on :3130, meshcache's admin on :3180):
#   mc-none     meshcache, 127.0.0.11-14, [cooperation] protocol = "none", no peers
#   mc-icp      meshcache, 127.0.0.21-24, protocol = "icp", the other three as [[peer]] siblings
#   squid-none  Squid,     127.0.0.31-34, no cache_peer
#   squid-icp   Squid,     127.0.0.41-44, the other three as cache_peer siblings (ICP v2)
# plus the origin emulator (meshcache lab origin) on 127.0.0.1.
#
# Follows shared/BENCHMARKING.md: the sixteen servers are pinned to core 1, each single
# threaded (TOKIO_WORKER_THREADS=1; Squid workers 1, squid -N); the load generators (one wrk
# per node, wrk -t1 -cN) and the origin on core 0; rounds interleave the four configurations;
# medians and paired (same round) differences and ratios; CPU from /proc/PID/stat (utime+stime
# of the four server process trees); UDP datagrams from /proc/net/snmp inside a fresh network
# namespace (unshare -n), cross-checked with the servers' own ICP counters; steal and other
# processes' CPU from /proc/stat; the machine must be quiet before each measured run.
#
# Usage: scripts/bench-icp.sh [options]
#   --duration SECS    each measured run (default 15)
#   --rounds N         interleaved rounds per origin delay (default 3)
#   --delays LIST      origin delays in ms, comma-separated: one load level each (default 0,10;
#                      0 = closed loop at full speed, the servers' core saturated; 10 = the
#                      origin answers after 10 ms, which bounds the load well below saturation)
#   --connections N    wrk connections per node (default 4)
#   --configs LIST     subset of mc-none,mc-icp,squid-none,squid-icp (default all four)
#   --store-mb N       each node's memory cache in MiB (default 32: replacement runs, as in
#                      the paper)
#   --out DIR          results directory (default target/bench-icp/<UTC timestamp>)
#   --bin PATH         meshcache binary (default: build target/release/meshcache)
#   --no-build         do not run cargo build (use the existing binary)
#   --no-netns         do not run inside `unshare -n` (the UDP counts then include others')
#   --origin-port N    the origin's port on 127.0.0.1 (default 18090)
#   --note TEXT        a line added to the results' header
#   --quiet-budget S   seconds (default 120) this run may spend in total waiting for other
#                      processes' CPU use to drop before a measured run, and re-doing runs
#                      disturbed by it (other CPU > 15% of a core); 0 disables
#   --no-floor         do not measure the floor (below)
#   --floor-bin PATH   the floor example (default: build target/release/examples/floor)
# The floor: after the four configurations, every round also runs meshcache-dcm's floor example
# on core 1 (four processes on 127.0.0.51-54 doing nothing but the datagrams of ICP searches:
# a query to each sibling, a MISS_NOFETCH back, encoded and decoded with meshcache-wire), with
# ICP and without, at the load of that round's mc-icp run (closed loop with the same
# connections at delay 0, else the same searches a second). Its icp - none is the least extra
# CPU per request any implementation can have here; floor / Squid's overhead is the least the
# target's ratio can be on this machine.
# Defaults take about 8 minutes (at most 10 with the quiet budget). Installs wrk, squid, curl, jq
# when missing (apt).
# Output: a Markdown report on stdout and in OUT/results.md; every run in OUT/raw.csv and
# OUT/results.json; the generated configs, servers' logs and access-log tallies in OUT/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR="$REPO/scripts/bench"
ICP_DIR="$BENCH_DIR/icp"
ORIG_ARGS=("$@")
: "${BENCH_ICP_CMD:=scripts/bench-icp.sh${*:+ $*}}"
export BENCH_ICP_CMD
BENCH_TAG=bench-icp
# shellcheck source=bench/lib.sh
. "$BENCH_DIR/lib.sh"

DURATION=15
ROUNDS=3
DELAYS=0,10
CONNS=4
CONFIGS=mc-none,mc-icp,squid-none,squid-icp
STORE_MB=32
OUT=""
BIN=""
BUILD=1
NETNS=1
ORIGIN_PORT=18090
NOTE=""
QUIET_BUDGET=120
FLOOR=1
FLOOR_BIN=""

while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --delays) DELAYS=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --store-mb) STORE_MB=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; BUILD=0; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-netns) NETNS=0; shift ;;
    --origin-port) ORIGIN_PORT=$2; shift 2 ;;
    --note) NOTE=$2; shift 2 ;;
    --quiet-budget) QUIET_BUDGET=$2; shift 2 ;;
    --no-floor) FLOOR=0; shift ;;
    --floor-bin) FLOOR_BIN=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 && $DURATION -le 120 ]] || die "--duration: 1..120 seconds"
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 20 ]] || die "--rounds: 1..20"
[[ $CONNS =~ ^[0-9]+$ && $CONNS -ge 1 && $CONNS -le 256 ]] || die "--connections: 1..256"
[[ $STORE_MB =~ ^[0-9]+$ && $STORE_MB -ge 1 && $STORE_MB -le 1024 ]] || die "--store-mb: 1..1024"
[[ $DELAYS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--delays: comma-separated milliseconds"
[[ $ORIGIN_PORT =~ ^[0-9]+$ && $ORIGIN_PORT -ge 1024 && $ORIGIN_PORT -le 65535 ]] || die "--origin-port: 1024..65535"
[[ $QUIET_BUDGET =~ ^[0-9]+$ ]] || die "--quiet-budget: seconds"
IFS=, read -r -a DELAY_LIST <<<"$DELAYS"
IFS=, read -r -a CONFIG_LIST <<<"$CONFIGS"
for d in "${DELAY_LIST[@]}"; do [ "$d" -le 1000 ] || die "--delays: at most 1000 ms"; done
for c in "${CONFIG_LIST[@]}"; do
  case "$c" in mc-none|mc-icp|squid-none|squid-icp) ;; *) die "--configs: unknown configuration $c" ;; esac
done
has_config() { [[ ",$CONFIGS," == *",$1,"* ]]; }
has_squid() { has_config squid-none || has_config squid-icp; }

# ---------------------------------------------------------------- install, build (outside netns)
if [ -z "${BENCH_ICP_IN_NETNS:-}" ]; then
  declare -A need=([wrk]=wrk [curl]=curl [jq]=jq [taskset]=util-linux [ip]=iproute2 [timeout]=coreutils)
  has_squid && need[squid]=squid
  bench_install_missing need
  if [ "$BUILD" = 1 ]; then
    log "cargo build --release -p meshcache"
    (cd "$REPO" && cargo build --release -p meshcache)
    if [ "$FLOOR" = 1 ] && [ -z "$FLOOR_BIN" ]; then
      log "cargo build --release -p meshcache-dcm --example floor"
      (cd "$REPO" && cargo build --release -p meshcache-dcm --example floor)
    fi
  fi
fi
export PATH="$PATH:/usr/sbin:/sbin"
[ -n "$BIN" ] || BIN="$REPO/target/release/meshcache"
[ -x "$BIN" ] || die "no meshcache binary at $BIN"
BIN=$(readlink -f "$BIN")
# The revision and the binary as the run starts (someone may commit or rebuild while it runs).
[ -n "${BENCH_ICP_REV:-}" ] || BENCH_ICP_REV=$(bench_revision "$REPO")
export BENCH_ICP_REV
: "${BENCH_ICP_BIN_NOTE:=$(bench_binary_note "$BIN")}"
export BENCH_ICP_BIN_NOTE
BIN_NOTE=$BENCH_ICP_BIN_NOTE
if [ "$FLOOR" = 1 ]; then
  [ -n "$FLOOR_BIN" ] || FLOOR_BIN="$REPO/target/release/examples/floor"
  [ -x "$FLOOR_BIN" ] || die "no floor binary at $FLOOR_BIN (build it, give --floor-bin, or --no-floor)"
  FLOOR_BIN=$(readlink -f "$FLOOR_BIN")
fi

if [ "$NETNS" = 1 ]; then
  bench_enter_netns BENCH_ICP_IN_NETNS "${BASH_SOURCE[0]}" "${ORIG_ARGS[@]}" --no-build --bin "$BIN" ${FLOOR_BIN:+--floor-bin "$FLOOR_BIN"}
fi
NETNS_USED=no
if [ -n "${BENCH_ICP_IN_NETNS:-}" ]; then
  ip link set lo up
  NETNS_USED=yes
fi

# ---------------------------------------------------------------- setup
# Configuration -> g, the tens digit of its nodes' last address byte (127.0.0.<g>1..<g>4).
declare -A GROUP=([mc-none]=1 [mc-icp]=2 [squid-none]=3 [squid-icp]=4)
node_ip() { echo "127.0.0.${GROUP[$1]}$2"; }   # config node(1..4)
node_name() { echo "$1-n$2"; }
product_of() { case "$1" in mc-*) echo meshcache ;; *) echo squid ;; esac; }

if (exec 3<>"/dev/tcp/127.0.0.1/$ORIGIN_PORT") 2>/dev/null; then die "port $ORIGIN_PORT is in use (try --origin-port)"; fi
for c in "${CONFIG_LIST[@]}"; do
  for i in 1 2 3 4; do
    if (exec 3<>"/dev/tcp/$(node_ip "$c" "$i")/3128") 2>/dev/null; then die "$(node_ip "$c" "$i"):3128 is in use"; fi
  done
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ -n "$OUT" ] || OUT="$REPO/target/bench-icp/$STAMP"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/bench-icp.XXXXXX)
chmod 755 "$WORK"
RAW="$OUT/raw.csv"
CLK_TCK=$(getconf CLK_TCK)
ulimit -n 65536 2>/dev/null || ulimit -n 8192 2>/dev/null || true

declare -A PID_OF=()
STARTED=()   # PIDs this script started, in start order
WRK_PIDS=()

save_logs() { # copy configs, logs and access-log tails to OUT
  cp -r "$WORK/conf" "$OUT/" 2>/dev/null || true
  mkdir -p "$OUT/logs" "$OUT/wrk"
  cp "$WORK"/wrk-*.txt "$OUT/wrk/" 2>/dev/null || true
  local f name
  for f in "$WORK"/*.log "$WORK"/*/*.log; do
    [ -f "$f" ] || continue
    name=${f#"$WORK"/}
    name=${name//\//-}
    case "$f" in
      *access.log) tail -n 20 "$f" >"$OUT/logs/$name.tail" ;;
      *) cp "$f" "$OUT/logs/$name" ;;
    esac
  done
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local pid
  for pid in "${WRK_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  bench_stop_pids "${STARTED[@]}"
  if [ -d "$WORK" ]; then
    save_logs
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

USER_LINE=""
if [ "$(id -u)" = 0 ] && id proxy >/dev/null 2>&1; then USER_LINE="cache_effective_user proxy"; fi

fill() { # template name ip -> stdout
  sed -e "s|@DIR@|$WORK|g" -e "s|@NAME@|$2|g" -e "s|@IP@|$3|g" -e "s|@STORE_MB@|$STORE_MB|g" \
    -e "s|@USER_LINE@|$USER_LINE|g" -e "s|@PROTOCOL@|${4:-none}|g" "$1"
}

wait_tcp() { # ip port name pid
  local i
  for ((i = 0; i < 200; i++)); do
    if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
    kill -0 "$4" 2>/dev/null || die "$3 exited at startup (logs in $WORK/$3)"
    sleep 0.1
  done
  die "$3 did not listen on $1:$2 within 20 s"
}

start() { # name core ip port cmd... (in the background, pinned)
  local name=$1 core=$2 ip=$3 port=$4
  shift 4
  taskset -c "$core" "$@" >"$WORK/$name/stdout.log" 2>"$WORK/$name/stderr.log" </dev/null &
  local pid=$!
  STARTED+=("$pid")
  PID_OF[$name]=$pid
  wait_tcp "$ip" "$port" "$name" "$pid"
}

mkdir -p "$WORK/conf" "$WORK/origin"
TOKIO_ENV=(env TOKIO_WORKER_THREADS=1 MESHCACHE_LOG=warn)
start origin 0 127.0.0.1 "$ORIGIN_PORT" "${TOKIO_ENV[@]}" "$BIN" lab origin --listen "127.0.0.1:$ORIGIN_PORT"
log "origin running (pid ${PID_OF[origin]}, 127.0.0.1:$ORIGIN_PORT, core 0)"
ORIGIN="http://127.0.0.1:$ORIGIN_PORT"

for c in "${CONFIG_LIST[@]}"; do
  for i in 1 2 3 4; do
    name=$(node_name "$c" "$i")
    ip=$(node_ip "$c" "$i")
    mkdir -p "$WORK/$name"
    case "$c" in
      mc-*)
        conf="$WORK/conf/$name.toml"
        if [ "$c" = mc-icp ]; then
          fill "$ICP_DIR/meshcache.toml.in" "$name" "$ip" icp >"$conf"
          for j in 1 2 3 4; do
            [ "$j" = "$i" ] && continue
            printf '\n[[peer]]\nname = "%s"\nrole = "sibling"\nhttp = "%s:3128"\nicp = "%s:3130"\n' \
              "$(node_name "$c" "$j")" "$(node_ip "$c" "$j")" "$(node_ip "$c" "$j")" >>"$conf"
          done
        else
          fill "$ICP_DIR/meshcache.toml.in" "$name" "$ip" none >"$conf"
        fi
        start "$name" 1 "$ip" 3128 "${TOKIO_ENV[@]}" "$BIN" run -c "$conf"
        ;;
      squid-*)
        conf="$WORK/conf/$name.conf"
        [ -n "$USER_LINE" ] && chown proxy: "$WORK/$name"
        fill "$ICP_DIR/squid.conf.in" "$name" "$ip" >"$conf"
        if [ "$c" = squid-icp ]; then
          echo "# the other three nodes, ICP siblings (no cache digests, no netdb exchange)" >>"$conf"
          for j in 1 2 3 4; do
            [ "$j" = "$i" ] && continue
            echo "cache_peer $(node_ip "$c" "$j") sibling 3128 3130 name=$(node_name "$c" "$j") no-digest no-netdb-exchange" >>"$conf"
          done
        fi
        squid -k parse -f "$conf" >"$WORK/$name/parse.log" 2>&1 || { cat "$WORK/$name/parse.log" >&2; die "$conf does not parse"; }
        start "$name" 1 "$ip" 3128 squid -N -n "bicp${c//[^a-z]/}$i" -f "$conf"
        ;;
    esac
  done
  log "$c: 4 nodes running (pids $(for i in 1 2 3 4; do printf '%s ' "${PID_OF[$(node_name "$c" "$i")]}"; done)on core 1)"
done

# ---------------------------------------------------------------- counters
curl_via() { # proxy-ip url -> body
  curl -s --noproxy '' -x "http://$1:3128" --max-time 5 "$2"
}
# One line per configuration: the sum over its four nodes of
# "requests hits queries_sent replies_sent queries_recv replies_recv late denied dropped"
# (requests and hits as the server counts them; ICP datagrams as it counts them; late: replies
# that came after the search had ended, meshcache's per-peer "late", Squid's per-peer IGNORED).
server_counters() { # config
  local c=$1 i ip
  for i in 1 2 3 4; do
    ip=$(node_ip "$c" "$i")
    case "$c" in
      mc-*)
        curl -s --noproxy '*' --max-time 5 "http://$ip:3180/stats" | jq -r '[.requests, .hits,
          .icp.queries_sent, .icp.replies_sent, .icp.queries_received, .icp.replies_received,
          ([.peers[].stats.late] | add // 0), .icp.denied, .icp.dropped] | @tsv' ;;
      squid-*)
        { curl_via "$ip" "http://$(node_name "$c" "$i"):3128/squid-internal-mgr/counters"
          [ "$c" = squid-none ] || curl_via "$ip" "http://$(node_name "$c" "$i"):3128/squid-internal-mgr/server_list"
        } | awk -F' = ' '
          { v[$1] = $2 }
          /^IGNORED *:/ { split($0, a, ":"); ignored += a[2] }
          END { print v["client_http.requests"] + 0, v["client_http.hits"] + 0, v["icp.queries_sent"] + 0,
                v["icp.replies_sent"] + 0, v["icp.queries_recv"] + 0, v["icp.replies_recv"] + 0,
                ignored + 0, 0, 0 }' ;;
    esac
  done | awk '{ for (i = 1; i <= NF; i++) s[i] += $i; n = NF } END { for (i = 1; i <= n; i++) printf "%s%d", (i > 1 ? " " : ""), s[i]; print "" }'
}
net_counters() { # UDP "InDatagrams OutDatagrams RcvbufErrors NoPorts InErrors", TCP "OutSegs" (/proc/net/snmp)
  awk '$1 == "Udp:" || $1 == "Tcp:" { p = $1; if (!(p in h)) { for (i = 2; i <= NF; i++) name[p, i] = $i; h[p] = 1 } else for (i = 2; i <= NF; i++) v[p, name[p, i]] = $i }
       END { print v["Udp:", "InDatagrams"] + 0, v["Udp:", "OutDatagrams"] + 0, v["Udp:", "RcvbufErrors"] + 0, v["Udp:", "NoPorts"] + 0, v["Udp:", "InErrors"] + 0, v["Tcp:", "OutSegs"] + 0 }' /proc/net/snmp
}
config_pids() { local i; for i in 1 2 3 4; do printf '%s ' "${PID_OF[$(node_name "$1" "$i")]}"; done; }

# ---------------------------------------------------------------- warm-up
# Every node must have heard from every sibling (a peer never heard from is queried but not
# waited for, by meshcache and Squid alike): a few sequential requests per node, checked.
peers_heard() { # config -> number of (node, sibling) pairs in which the node has heard the sibling
  local c=$1 i ip
  for i in 1 2 3 4; do
    ip=$(node_ip "$c" "$i")
    case "$c" in
      mc-icp) curl -s --noproxy '*' --max-time 5 "http://$ip:3180/stats" | jq '[.peers[] | select(.icp_alive)] | length' ;;
      squid-icp) curl_via "$ip" "http://$(node_name "$c" "$i"):3128/squid-internal-mgr/server_list" |
        awk '/^[ \t]*PINGS ACKED/ { split($0, a, ":"); if (a[2] + 0 > 0) n++ } END { print n + 0 }' ;;
    esac
  done | awk '{ s += $1 } END { print s + 0 }'
}
warm_config() { # config
  local c=$1 k i ip heard=0 code
  for ((k = 1; k <= 5; k++)); do
    for i in 1 2 3 4; do
      ip=$(node_ip "$c" "$i")
      code=$(curl -s --noproxy '' -x "http://$ip:3128" --max-time 5 -o /dev/null -w '%{http_code}' \
        "$ORIGIN/warm-$c-n$i/$k?size=1024&cc=max-age%3D600") || true
      [ "$code" = 200 ] || die "$(node_name "$c" "$i"): warm-up request answered ${code:-nothing}"
      sleep 0.1
    done
    case "$c" in *-none) return 0 ;; esac
    [ "$k" -ge 2 ] || continue
    heard=$(peers_heard "$c")
    [ "$heard" = 12 ] && break
  done
  [ "$heard" = 12 ] || die "$c: only $heard of 12 sibling relations alive after warm-up (logs in $WORK)"
  log "$c: every node has heard from its 3 siblings"
}

# ---------------------------------------------------------------- one run
# All four nodes of CONFIG loaded at once, one wrk each; appends one row to $RAW when measured.
run_one() { # delay round config phase tag
  local delay=$1 round=$2 c=$3 phase=$4 tag=$5 i ip dur=$DURATION
  [ "$phase" = measure ] || dur=3
  local pids srv0 srv1 cs0 cs1 org0 org1 st0 st1 w0 w1 t0 t1 u0 u1 k0 k1 rc
  pids=$(config_pids "$c")
  k0=$(server_counters "$c")
  u0=$(net_counters)
  srv0=$(tree_ticks_split $pids)
  cs0=$(ctx_switches $pids)
  org0=$(tree_ticks "${PID_OF[origin]}")
  st0=$(cpu_stat)
  self_child_ticks; w0=$SELF_CT
  t0=$EPOCHREALTIME
  WRK_PIDS=()
  for i in 1 2 3 4; do
    ip=$(node_ip "$c" "$i")
    BENCH_PREFIX="$ORIGIN/$tag-n$i/" BENCH_HOST="127.0.0.1:$ORIGIN_PORT" BENCH_DELAY_MS=$delay BENCH_CONNS=$CONNS \
      timeout -k 5 $((dur + 30)) taskset -c 0 wrk -t1 -c"$CONNS" -d"${dur}s" -s "$ICP_DIR/unique-urls.lua" \
      "http://$ip:3128" >"$WORK/wrk-$tag-n$i.txt" 2>&1 &
    WRK_PIDS+=($!)
  done
  rc=0
  for i in 0 1 2 3; do wait "${WRK_PIDS[i]}" || rc=$?; done
  t1=$EPOCHREALTIME
  WRK_PIDS=()
  self_child_ticks; w1=$SELF_CT
  st1=$(cpu_stat)
  org1=$(tree_ticks "${PID_OF[origin]}")
  srv1=$(tree_ticks_split $pids)
  cs1=$(ctx_switches $pids)
  u1=$(net_counters)
  k1=$(server_counters "$c")
  if [ "$rc" != 0 ]; then
    for i in 1 2 3 4; do cat "$WORK/wrk-$tag-n$i.txt" >&2; done
    die "wrk failed against $c (exit $rc)"
  fi
  for i in 1 2 3 4; do
    grep -q '^BENCH histogram_us' "$WORK/wrk-$tag-n$i.txt" || { cat "$WORK/wrk-$tag-n$i.txt" >&2; die "no figures from wrk against $(node_name "$c" "$i")"; }
  done
  [ "$phase" = measure ] || return 0

  # Latency: the four nodes' histograms (as measured: wrk's synthetic samples taken out by
  # unique-urls.lua) pooled; requests per second from wrk's own run times (their done() work
  # comes after); every request must have its latency sample (none beyond wrk's timeout).
  local lat
  lat=$(for i in 1 2 3 4; do cat "$WORK/wrk-$tag-n$i.txt"; done | awk '
    /^BENCH requests/ { n = $3; req += n }
    /^BENCH errors/ { err += $3 + $4 + $5 + $6 + $7 }
    /^BENCH duration_us/ { if ($3 > 0) rps += n * 1e6 / $3; dur += $3; k++ }
    /^BENCH measured/ { if ($3 != n) lost += n - $3 }
    /^BENCH histogram_us/ { for (i = 3; i <= NF; i++) { split($i, a, ":"); print "H", a[1], a[2] } }
    END { print "S", req, err, rps, (k ? dur / k / 1e6 : 0), lost + 0 }' | sort -k1,1 -k2,2n | awk '
    $1 == "H" { v[++k] = $2; w[k] = $3; tot += $3; sum += $2 * $3 }
    $1 == "S" { req = $2; err = $3; rps = $4; dur = $5; lost = $6 }
    END { c = 0; p50 = ""; p99 = ""
          for (i = 1; i <= k; i++) { c += w[i]; if (p50 == "" && c >= 0.5 * tot) p50 = v[i]; if (p99 == "" && c >= 0.99 * tot) p99 = v[i] }
          printf "%d %d %.1f %s %s %d %.2f %.6f %d\n", req, err, (tot > 0 ? sum / tot : 0), p50, p99, v[k], rps, dur, lost }')
  local req err mean p50 p99 max rps wdur lost
  read -r req err mean p50 p99 max rps wdur lost <<<"$lat"
  [ "$req" -gt 0 ] || die "no requests completed against $c"
  [ "$lost" = 0 ] || log "  $c: $lost requests without a latency sample (beyond wrk's timeout)"

  local su0 ss0 su1 ss1 s00 t00 b00 s10 t10 b10 s01 t01 b01 s11 t11 b11
  read -r su0 ss0 <<<"$srv0"
  read -r su1 ss1 <<<"$srv1"
  read -r s00 t00 b00 s10 t10 b10 <<<"$st0"
  read -r s01 t01 b01 s11 t11 b11 <<<"$st1"
  awk -v delay="$delay" -v round="$round" -v config="$c" -v product="$(product_of "$c")" \
    -v req="$req" -v err="$err" -v mean="$mean" -v p50="$p50" -v p99="$p99" -v max="$max" \
    -v rps="$rps" -v wdur="$wdur" -v tag="$tag" -v cs="$((cs1 - cs0))" -v t0="$t0" -v t1="$t1" -v hz="$CLK_TCK" -v su="$((su1 - su0))" -v ss="$((ss1 - ss0))" \
    -v org="$((org1 - org0))" -v wrk="$((w1 - w0))" \
    -v busy0="$((b01 - b00))" -v busy1="$((b11 - b10))" -v tt0="$((t01 - t00))" -v tt1="$((t11 - t10))" \
    -v st0="$((s01 - s00))" -v st1="$((s11 - s10))" -v u0="$u0" -v u1="$u1" -v k0="$k0" -v k1="$k1" 'BEGIN {
      wall = t1 - t0
      split(u0, a, " "); split(u1, b, " "); for (i = 1; i <= 6; i++) ud[i] = b[i] - a[i]
      split(k0, a, " "); split(k1, b, " "); for (i = 1; i <= 9; i++) kd[i] = b[i] - a[i]
      srv_ms = (su + ss) * 1000 / hz; org_ms = org * 1000 / hz; wrk_ms = wrk * 1000 / hz
      other = (busy0 + busy1 - su - ss - org - wrk) * 1000 / hz; if (other < 0) other = 0
      printf "%d,%d,%s,%s,%d,%.3f,%.1f,%d,%.3f,%.3f,%.3f,%.3f,", delay, round, config, product, req, wdur, rps, err, mean / 1000, p50 / 1000, p99 / 1000, max / 1000
      printf "%.1f,%.1f,%.1f,%.2f,%.1f,", srv_ms, su * 1000 / hz, ss * 1000 / hz, srv_ms * 1000 / req, srv_ms / 10 / wdur
      printf "%.1f,%.1f,%.1f,%.1f,%.2f,%.2f,%.1f,", org_ms, wrk_ms, (tt0 > 0 ? 100 * busy0 / tt0 : 0), (tt1 > 0 ? 100 * busy1 / tt1 : 0), (tt0 > 0 ? 100 * st0 / tt0 : 0), (tt1 > 0 ? 100 * st1 / tt1 : 0), other / 10 / wall
      printf "%d,%d,%.3f,%.3f,%d,%d,%d,", ud[1], ud[2], ud[1] / req, ud[2] / req, ud[3], ud[4], ud[5]
      printf "%d,%d,%.4f,%d,%d,%d,%d,%d,%d,%d,%.6f,%.6f,%s,%d,%.3f,%d,%.3f\n", kd[1], kd[2], (kd[1] > 0 ? kd[2] / kd[1] : 0), kd[3], kd[4], kd[5], kd[6], kd[7], kd[8], kd[9], t0, t1, tag, cs, cs / req, ud[6], ud[6] / req }' >>"$RAW"
  tail -n 1 "$RAW" | awk -F, '{ printf "  %-10s delay %3d ms round %d: %6d req (%6.0f/s)  latency mean %7.3f p50 %7.3f p99 %7.3f ms  cpu %6.2f us/req (srv %3.0f%%)  core0 %3.0f%% core1 %3.0f%%  udp out %.2f/req  hits %.4f  other %.0f%%  errors %d\n",
    $3, $1, $2, $5, $7, $9, $10, $11, $16, $17, $20, $21, $28, $34, $24, $8 }' >&2
}
ctx_switches() { # voluntary + involuntary context switches of the PIDs' threads, summed
  local pid
  for pid in "$@"; do cat /proc/"$pid"/task/*/status 2>/dev/null; done |
    awk '/^(voluntary|nonvoluntary)_ctxt_switches:/ { s += $2 } END { print s + 0 }'
}
tree_ticks_split() { # "user sys" ticks (with children's) of the PIDs' process trees
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v roots="$*" '
    { pid = $1; n = split($0, part, "[)] "); split(part[n], f, " ")
      par[pid] = f[2]; ut[pid] = f[12] + f[14]; stt[pid] = f[13] + f[15] }
    END { n = split(roots, r, " "); for (i = 1; i <= n; i++) tree[r[i]] = 1; grew = 1
          while (grew) { grew = 0; for (p in par) if (!(p in tree) && (par[p] in tree)) { tree[p] = 1; grew = 1 } }
          u = 0; s = 0; for (p in tree) if (p in ut) { u += ut[p]; s += stt[p] }; print u, s }'
}

OTHER_MAX=${BENCH_ICP_OTHER_MAX:-15}
QUIET_SPENT=0
# A measured run, re-done (at most twice, within the budget, with fresh URLs) when other
# processes used more than OTHER_MAX % of a core during it.
measure() { # delay round config
  local attempt other
  for attempt in 1 2 3; do
    wait_quiet
    run_one "$1" "$2" "$3" measure "d$1-r$2a$attempt-$3"
    other=$(tail -n 1 "$RAW" | awk -F, '{ printf "%d", $24 }')
    if [ "$other" -le "$OTHER_MAX" ] || [ $attempt = 3 ] || [ "$QUIET_SPENT" -ge "$QUIET_BUDGET" ]; then
      [ "$other" -le "$OTHER_MAX" ] || log "  (kept a run with $other% other CPU: retries or quiet budget used up)"
      return 0
    fi
    log "  other processes used $other% of a core during that run: re-doing it"
    sed -i '$d' "$RAW"
    QUIET_SPENT=$((QUIET_SPENT + DURATION))
  done
}

FLOOR_CSV="$OUT/floor.csv"
# The floor of one round: the floor example with ICP and without, at that round's mc-icp load.
run_floor() { # delay round
  local delay=$1 round=$2 load proto line rate
  if [ "$delay" = 0 ]; then
    load=(--concurrency "$CONNS" --requests 20000)
  else
    # The searches a second of this round's mc-icp nodes (each miss is one search), 5 s' worth.
    rate=$(awk -F, -v d="$delay" -v r="$round" '$1 == d && $2 == r && $3 == "mc-icp" { printf "%.0f", $7 / 4 }' "$RAW")
    [ -n "$rate" ] && [ "$rate" -gt 0 ] || rate=300
    load=(--rate "$rate" --requests $((rate * 5)))
  fi
  for proto in icp none; do
    wait_quiet
    line=$(timeout -k 5 150 "$FLOOR_BIN" --cpu 1 --first 127.0.0.51 --port 3130 --timeout 120 "${load[@]}" --protocol "$proto") ||
      die "the floor example failed (delay $delay, round $round, $proto)"
    echo "$line" | awk -v d="$delay" -v r="$round" '{ for (i = 1; i <= NF; i++) { split($i, a, "="); v[a[1]] = a[2] }
      printf "%d,%d,%s,%s,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f\n", d, r, v["protocol"], v["load"], v["requests"], v["lost"], v["wall_s"],
        v["cpu_us_per_request"], v["user_us"], v["sys_us"], v["run_us"], v["voluntary_per_request"], v["involuntary_per_request"] }' >>"$FLOOR_CSV"
    tail -n 1 "$FLOOR_CSV" | awk -F, '{ printf "  floor-%-4s delay %3d ms round %d: %6d searches (%s, %d lost)  cpu %6.2f us/search (user %.2f, sys %.2f; run %.2f)  switches %.3f/search\n", $3, $1, $2, $5, $4, $6, $8, $9, $10, $11, $12 + $13 }' >&2
  done
}

# ---------------------------------------------------------------- run
echo "delay_ms,round,config,product,requests,wrk_s,rps,errors,lat_mean_ms,lat_p50_ms,lat_p99_ms,lat_max_ms,server_cpu_ms,server_user_ms,server_sys_ms,server_cpu_us_per_req,server_cpu_pct,origin_cpu_ms,wrk_cpu_ms,core0_busy_pct,core1_busy_pct,steal_cpu0_pct,steal_cpu1_pct,other_cpu_pct,udp_in,udp_out,udp_in_per_req,udp_out_per_req,udp_rcvbuf_errors,udp_noports,udp_in_errors,srv_requests,srv_hits,hit_ratio,icp_queries_sent,icp_replies_sent,icp_queries_recv,icp_replies_recv,icp_late,icp_denied,icp_dropped,t_start,t_end,tag,server_ctx_switches,server_ctx_switches_per_req,tcp_out_segs,tcp_out_segs_per_req" >"$RAW"
[ "$FLOOR" = 0 ] || echo "delay_ms,round,protocol,load,searches,lost,wall_s,cpu_us_per_search,user_us_per_search,sys_us_per_search,run_us_per_search,voluntary_per_search,involuntary_per_search" >"$FLOOR_CSV"
T_START=$EPOCHSECONDS
for c in "${CONFIG_LIST[@]}"; do warm_config "$c"; done
for delay in "${DELAY_LIST[@]}"; do
  log "origin delay $delay ms: a 3-second unrecorded run per configuration, then $ROUNDS rounds of ${DURATION} s"
  for c in "${CONFIG_LIST[@]}"; do run_one "$delay" 0 "$c" warm "d$delay-warm-$c"; done
  for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${CONFIG_LIST[@]}"; do measure "$delay" "$r" "$c"; done
    [ "$FLOOR" = 0 ] || run_floor "$delay" "$r"
  done
done
T_END=$EPOCHSECONDS

# Peer state at the end (meshcache's per-peer RTT and counters; Squid's server_list).
for c in "${CONFIG_LIST[@]}"; do
  for i in 1 2 3 4; do
    ip=$(node_ip "$c" "$i")
    case "$c" in
      mc-icp) curl -s --noproxy '*' --max-time 5 "http://$ip:3180/stats" >"$OUT/stats-$(node_name "$c" "$i").json" || true ;;
      mc-none) curl -s --noproxy '*' --max-time 5 "http://$ip:3180/stats" >"$OUT/stats-$(node_name "$c" "$i").json" || true ;;
      squid-*)
        curl_via "$ip" "http://$(node_name "$c" "$i"):3128/squid-internal-mgr/counters" >"$OUT/counters-$(node_name "$c" "$i").txt" || true
        [ "$c" = squid-none ] || curl_via "$ip" "http://$(node_name "$c" "$i"):3128/squid-internal-mgr/server_list" >"$OUT/server_list-$(node_name "$c" "$i").txt" || true ;;
    esac
  done
done

# Stop the servers (Squid writes out its buffered log on the way), then tally the access logs:
# result codes and hierarchy codes (the peer address cut off) per configuration.
bench_stop_pids "${STARTED[@]}"
STARTED=()
for c in "${CONFIG_LIST[@]}"; do
  for i in 1 2 3 4; do cat "$WORK/$(node_name "$c" "$i")/access.log" 2>/dev/null; done |
    awk -v c="$c" '$6 != "ICP_QUERY" { split($4, rc, "/"); split($9, h, "/"); r[rc[1] "/" rc[2]]++; hier[h[1]]++; n++ }
      END { for (k in r) printf "%s,result,%s,%d,%.4f\n", c, k, r[k], r[k] / n; for (k in hier) printf "%s,hierarchy,%s,%d,%.4f\n", c, k, hier[k], hier[k] / n }' |
    sort -t, -k1,1 -k2,2 -k4,4nr
done >"$OUT/access-log-tally.csv"
# The same per measured run (the run's tag is the first path segment of its URLs), joined to
# raw.csv: requests logged, searches ended by timeout (TIMEOUT_ prefix), HIER_DIRECT,
# SIBLING_HIT and other hierarchy codes.
for c in "${CONFIG_LIST[@]}"; do
  for i in 1 2 3 4; do cat "$WORK/$(node_name "$c" "$i")/access.log" 2>/dev/null; done |
    awk '$6 != "ICP_QUERY" { n = split($7, u, "/"); if (n < 4) next; t = u[4]; sub(/-n[0-9]+$/, "", t)
           split($9, h, "/"); lines[t]++
           if (h[1] ~ /^TIMEOUT_/) to[t]++
           if (h[1] ~ /HIER_DIRECT$/) direct[t]++; else if (h[1] ~ /SIBLING_HIT$/) sib[t]++; else other[t]++ }
         END { for (t in lines) printf "%s %d %d %d %d %d\n", t, lines[t], to[t], direct[t], sib[t], other[t] }'
done >"$WORK/run-tally.txt"
awk -F, -v OFS=, 'NR == FNR { split($0, a, " "); tl[a[1]] = a[2] "," a[3] "," a[4] "," a[5] "," a[6]; next }
  FNR == 1 { print $0, "log_requests,log_timeouts,log_direct,log_sibling_hits,log_other_hier"; next }
  { print $0, (($44) in tl ? tl[$44] : ",,,,") }' "$WORK/run-tally.txt" "$RAW" >"$WORK/raw.csv"
cp "$WORK/raw.csv" "$RAW"
# What the servers complained about.
: >"$OUT/complaints.txt"
for c in "${CONFIG_LIST[@]}"; do
  for i in 1 2 3 4; do
    name=$(node_name "$c" "$i")
    for f in "$WORK/$name/stderr.log" "$WORK/$name/cache.log"; do
      [ -f "$f" ] || continue
      grep -iE 'warn|error|fatal|assert|panic' "$f" | sed "s|^|$name: |" >>"$OUT/complaints.txt" || true
    done
  done
done

# ---------------------------------------------------------------- report
CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
WRK_V=$(wrk -v 2>&1 | head -n 1 | awk '{ print $2 }' || true)
SQUID_V=$( (squid -v 2>/dev/null || true) | head -n 1 | awk '{ print $NF }')
MESH_V=$("$BIN" --version 2>/dev/null || echo meshcache)
REV_NOTE="repository at $BENCH_ICP_REV"
AWK_MEDIAN='
  function median(list,   n, a, i, j, x) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    if (n == 0) return ""
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function add(k, v) { vals[k] = (k in vals) ? vals[k] " " v : v }'

{
  echo "# ICP overhead benchmark (4 siblings, worst case): $STAMP"
  echo
  echo "- command: \`$BENCH_ICP_CMD\`"
  echo "- revision: $REV_NOTE; $MESH_V; Squid $SQUID_V; wrk $WRK_V"
  echo "- meshcache binary: $BIN_NOTE"
  [ -z "$NOTE" ] || echo "- note: $NOTE"
  echo "- machine: $(nproc) CPUs, $CPU_MODEL, kernel $(uname -r); network namespace: $NETNS_USED"
  echo "- nodes: 4 per configuration, mutual siblings in the ICP ones; each single-threaded (meshcache TOKIO_WORKER_THREADS=1; Squid workers 1, squid -N), memory cache $STORE_MB MiB each, access log buffered; all 16 on core 1, running throughout (idle when not measured)"
  echo "- load: per node one wrk -t1 -c$CONNS -d${DURATION}s on core 0 asking for URLs no node ever asked before (sizes cycling 2..10 KiB, Cache-Control: max-age=600), all four nodes of a configuration at once; origin emulator on core 0, answering after the given delay"
  echo "- rounds: $ROUNDS interleaved rounds of [${CONFIGS//,/, }] per origin delay; medians below; run took $((T_END - T_START)) s, of which $QUIET_SPENT s waiting for a quiet machine or re-doing disturbed runs (budget $QUIET_BUDGET s)"
  echo "- CPU: utime+stime of the 4 server processes (all threads) over the run, per request; latency: client-side (wrk, its coordinated-omission 'correction' undone), the four nodes pooled; UDP datagrams and TCP segments: /proc/net/snmp deltas in the namespace (each loopback datagram or segment counts once out and once in; TCP includes the client and origin connections); 'core0/core1' busy % of each core; 'other' = busy time on both cores not charged to the servers, wrk or the origin, in % of one core"
  echo
  awk -F, -v configs="$CONFIGS" -v conns="$CONNS" "$AWK_MEDIAN"'
    NR > 1 {
      k = $1 SUBSEP $3
      add(k SUBSEP "req", $5); add(k SUBSEP "rps", $7); add(k SUBSEP "err", $8); add(k SUBSEP "mean", $9); add(k SUBSEP "p50", $10); add(k SUBSEP "p99", $11)
      add(k SUBSEP "cpu", $16); add(k SUBSEP "usr", $14 * 1000 / $5); add(k SUBSEP "sys", $15 * 1000 / $5); add(k SUBSEP "srv", $17)
      add(k SUBSEP "c0", $20); add(k SUBSEP "c1", $21); add(k SUBSEP "oth", $24); add(k SUBSEP "st0", $22); add(k SUBSEP "st1", $23)
      add(k SUBSEP "uo", $28); add(k SUBSEP "uio", $27 + $28); add(k SUBSEP "rcvbuf", $29); add(k SUBSEP "hit", $34)
      add(k SUBSEP "icpo", ($35 + $36) / $5); add(k SUBSEP "to", $50 + 0); add(k SUBSEP "tcp", $48); add(k SUBSEP "late", $39); add(k SUBSEP "cs", $46)
      mean[$1, $2, $3] = $9; cpu[$1, $2, $3] = $16; p50[$1, $2, $3] = $10; p99[$1, $2, $3] = $11
      usr[$1, $2, $3] = $14 * 1000 / $5; sys[$1, $2, $3] = $15 * 1000 / $5
      if (!($1 in seen)) { seen[$1] = 1; delays[++nd] = $1 }
      if ($2 > maxr) maxr = $2
    }
    function m(d, c, what) { return median(vals[d SUBSEP c SUBSEP what]) }
    function has(d, c) { return ((d SUBSEP c SUBSEP "req") in vals) }
    function pct(a, b) { return (b > 0) ? sprintf("%+.0f %%", 100 * (a - b) / b) : "-" }
    # Per round: X(icp) - X(none) of one product (prefix "mc" or "squid"), as a list.
    function diffs(arr, d, p,   r, l) {
      l = ""
      for (r = 1; r <= maxr; r++) if (((d, r, p "-icp") in arr) && ((d, r, p "-none") in arr)) l = l " " arr[d, r, p "-icp"] - arr[d, r, p "-none"]
      return l
    }
    function rel(arr, d, p,   r, l) {
      l = ""
      for (r = 1; r <= maxr; r++) if (((d, r, p "-icp") in arr) && ((d, r, p "-none") in arr) && arr[d, r, p "-none"] > 0) l = l " " 100 * (arr[d, r, p "-icp"] - arr[d, r, p "-none"]) / arr[d, r, p "-none"]
      return l
    }
    function fmtl(l, f,   n, a, i, o) { n = split(l, a, " "); o = ""; for (i = 1; i <= n; i++) o = o (i > 1 ? ", " : "") sprintf(f, a[i]); return o }
    END {
      nc = split(configs, C, ",")
      split("mc squid", P, " "); split("meshcache Squid", PN, " ")
      for (i = 1; i <= nd; i++) {
        d = delays[i]
        if (d == 0) printf "## Saturated: origin answers at once (closed loop, %d connections per node)\n\n", conns
        else printf "## Paced: origin answers after %d ms (%d connections per node)\n\n", d, conns
        # Table 2 of the paper: no ICP, ICP, overhead; per request.
        print "| product | cooperation | hit ratio | client latency, mean ms | user CPU µs/req | system CPU µs/req | CPU µs/req | UDP datagrams/req (out + in) | TCP segments/req (out + in) |"
        print "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for (p = 1; p <= 2; p++) {
          a = P[p] "-icp"; b = P[p] "-none"
          if (has(d, b)) printf "| %s | no ICP | %.4f | %.3f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", PN[p], m(d, b, "hit"), m(d, b, "mean"), m(d, b, "usr"), m(d, b, "sys"), m(d, b, "cpu"), m(d, b, "uio"), 2 * m(d, b, "tcp")
          if (has(d, a)) printf "| %s | ICP | %.4f | %.3f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", PN[p], m(d, a, "hit"), m(d, a, "mean"), m(d, a, "usr"), m(d, a, "sys"), m(d, a, "cpu"), m(d, a, "uio"), 2 * m(d, a, "tcp")
          if (has(d, a) && has(d, b)) {
            om[p] = median(diffs(mean, d, P[p])); oc[p] = median(diffs(cpu, d, P[p]))
            printf "| %s | **overhead** | | **%+.0f %%** (%+.3f ms) | %+.0f %% (%+.1f) | %+.0f %% (%+.1f) | **%+.0f %%** (%+.1f) | %+.2f | %s |\n", PN[p], \
              median(rel(mean, d, P[p])), om[p], median(rel(usr, d, P[p])), median(diffs(usr, d, P[p])), \
              median(rel(sys, d, P[p])), median(diffs(sys, d, P[p])), median(rel(cpu, d, P[p])), oc[p], m(d, a, "uio") - m(d, b, "uio"), pct(m(d, a, "tcp"), m(d, b, "tcp"))
          }
        }
        print ""
        print "Overheads are icp − none of the same product within each round (paired), median over the rounds; the other rows are medians."
        print ""
        if (has(d, "mc-icp") && has(d, "mc-none") && has(d, "squid-icp") && has(d, "squid-none")) {
          rc = ""; rm = ""
          for (r = 1; r <= maxr; r++) if (((d, r, "mc-icp") in cpu) && ((d, r, "mc-none") in cpu) && ((d, r, "squid-icp") in cpu) && ((d, r, "squid-none") in cpu)) {
            sc = cpu[d, r, "squid-icp"] - cpu[d, r, "squid-none"]; sm = mean[d, r, "squid-icp"] - mean[d, r, "squid-none"]
            if (sc > 0) rc = rc " " (cpu[d, r, "mc-icp"] - cpu[d, r, "mc-none"]) / sc
            if (sm > 0) rm = rm " " (mean[d, r, "mc-icp"] - mean[d, r, "mc-none"]) / sm
          }
          rcm = (rc == "") ? "" : median(rc); rmm = (rm == "") ? "" : median(rm)
          print "| target: meshcache'"'"'s ICP overhead ≤ ½ of Squid'"'"'s | meshcache | Squid | meshcache / Squid (per round) | verdict |"
          print "| --- | ---: | ---: | ---: | --- |"
          printf "| extra CPU per request | %.1f µs | %.1f µs | **%s** (%s) | %s |\n", oc[1], oc[2], (rcm == "" ? "-" : sprintf("%.2f", rcm)), fmtl(rc, "%.2f"), (rcm == "" ? "undetermined" : (rcm <= 0.5 ? "met" : "**not met**"))
          printf "| extra mean latency per request | %.3f ms | %.3f ms | **%s** (%s) | %s |\n", om[1], om[2], (rmm == "" ? "-" : sprintf("%.2f", rmm)), fmtl(rm, "%.2f"), (rmm == "" ? "undetermined" : (rmm <= 0.5 ? "met" : "**not met**"))
          print ""
        }
        print "Details (medians):"
        print ""
        print "| configuration | requests | req/s | latency mean / p50 / p99 ms | CPU µs/req | servers CPU % | core0 / core1 busy % | context switches/req | UDP out/req (kernel) | ICP datagrams sent/req (servers) | searches timed out | late replies | errors | other CPU % |"
        print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for (j = 1; j <= nc; j++) {
          c = C[j]; if (!has(d, c)) continue
          printf "| %s | %d | %.0f | %.3f / %.3f / %.3f | %.1f | %.0f | %.0f / %.0f | %.2f | %.3f | %.3f | %d | %d | %d | %.1f |\n", c, m(d, c, "req"), m(d, c, "rps"), m(d, c, "mean"), m(d, c, "p50"), m(d, c, "p99"), m(d, c, "cpu"), m(d, c, "srv"), m(d, c, "c0"), m(d, c, "c1"), m(d, c, "cs"), m(d, c, "uo"), m(d, c, "icpo"), m(d, c, "to"), m(d, c, "late"), m(d, c, "err"), m(d, c, "oth")
        }
        print ""
        print "| product | extra p50 ms | extra p99 ms | extra CPU per round µs/req | extra mean latency per round ms |"
        print "| --- | ---: | ---: | --- | --- |"
        for (p = 1; p <= 2; p++) if (has(d, P[p] "-icp") && has(d, P[p] "-none"))
          printf "| %s | %+.3f | %+.3f | %s | %s |\n", PN[p], median(diffs(p50, d, P[p])), median(diffs(p99, d, P[p])), fmtl(diffs(cpu, d, P[p]), "%+.1f"), fmtl(diffs(mean, d, P[p]), "%+.3f")
        print ""
      }
    }' "$RAW"
  if [ "$FLOOR" = 1 ] && [ -s "$FLOOR_CSV" ]; then
    echo "## The floor: ICP's datagrams and nothing else"
    echo
    echo "The floor example (meshcache-dcm) on core 1 after each round's four configurations: four processes on 127.0.0.51-54, each one epoll loop and one UDP socket, sending the round's searches (a QUERY to each of three siblings; each sibling answers MISS_NOFETCH) with no proxy around them, and the same loop without ICP. Extra CPU = icp − none of the same round; it is the least extra CPU per request that any implementation of ICP can have on this machine, and floor / Squid's overhead the least the target's ratio can be."
    echo
    echo "| origin delay | floor load | floor CPU µs/search, icp / none | floor extra µs/req (per round) | meshcache extra | Squid extra | floor / Squid (per round) | meshcache − floor | Squid − floor |"
    echo "| ---: | --- | ---: | --- | ---: | ---: | --- | ---: | ---: |"
    awk -F, "$AWK_MEDIAN"'
      FNR == 1 { file++; next }
      file == 1 { cpu[$1, $2, $3] = $16; if (!($1 in seen)) { seen[$1] = 1; delays[++nd] = $1 }; if ($2 > maxr) maxr = $2; next }
      file == 2 { f[$1, $2, $3] = $8; load[$1] = $4; lost[$1] += $6 }
      END {
        for (i = 1; i <= nd; i++) {
          d = delays[i]; fl = ""; fr = ""; me = ""; sq = ""; mf = ""; sf = ""
          for (r = 1; r <= maxr; r++) {
            if (!(((d, r, "icp") in f) && ((d, r, "none") in f))) continue
            x = f[d, r, "icp"] - f[d, r, "none"]; fl = fl " " x; add("fi" d, f[d, r, "icp"]); add("fn" d, f[d, r, "none"])
            if (((d, r, "squid-icp") in cpu) && ((d, r, "squid-none") in cpu)) {
              s = cpu[d, r, "squid-icp"] - cpu[d, r, "squid-none"]; sq = sq " " s; sf = sf " " s - x
              if (s > 0) fr = fr " " x / s
            }
            if (((d, r, "mc-icp") in cpu) && ((d, r, "mc-none") in cpu)) { m = cpu[d, r, "mc-icp"] - cpu[d, r, "mc-none"]; me = me " " m; mf = mf " " m - x }
          }
          if (fl == "") continue
          printf "| %d ms | %s%s | %.1f / %.1f | **%.1f** (%s) | %s | %s | **%s** (%s) | %s | %s |\n", d, load[d], (lost[d] ? sprintf(", %d lost", lost[d]) : ""),
            median(vals["fi" d]), median(vals["fn" d]), median(fl), fmtl(fl, "%.1f"),
            (me == "" ? "-" : sprintf("%.1f", median(me))), (sq == "" ? "-" : sprintf("%.1f", median(sq))),
            (fr == "" ? "-" : sprintf("%.2f", median(fr))), fmtl(fr, "%.2f"),
            (mf == "" ? "-" : sprintf("%+.1f", median(mf))), (sf == "" ? "-" : sprintf("%+.1f", median(sf)))
        }
      }
      function fmtl(l, fm,   n, a, i, o) { n = split(l, a, " "); o = ""; for (i = 1; i <= n; i++) o = o (i > 1 ? ", " : "") sprintf(fm, a[i]); return o }' "$RAW" "$FLOOR_CSV"
    echo
    echo "A floor / Squid ratio above 0.5 means that the target cannot be met here by any implementation that sends ICP's datagrams; below it, the room left is (0.5 − floor / Squid) × Squid's overhead. Raw numbers: floor.csv."
    echo
  fi
  echo "## Access logs (all runs, warm-ups included): hierarchy codes"
  echo
  echo "| configuration | code | requests | share |"
  echo "| --- | --- | ---: | ---: |"
  awk -F, '$2 == "hierarchy" { printf "| %s | %s | %d | %.4f |\n", $1, $3, $4, $5 }' "$OUT/access-log-tally.csv"
  echo
  echo "Result codes: access-log-tally.csv. Server complaints (warning/error lines in cache.log and stderr): $(wc -l <"$OUT/complaints.txt") (complaints.txt)."
  echo
  echo "Raw numbers: raw.csv and results.json beside this file."
} >"$OUT/results.md"

# results.json: the metadata and every measured run.
awk -F, -v stamp="$STAMP" -v rev="$REV_NOTE" -v cpu="$CPU_MODEL" -v nproc="$(nproc)" \
  -v kernel="$(uname -r)" -v squid="$SQUID_V" -v wrk="$WRK_V" -v mesh="$MESH_V" \
  -v dur="$DURATION" -v rounds="$ROUNDS" -v conns="$CONNS" -v netns="$NETNS_USED" -v cmd="$BENCH_ICP_CMD" \
  -v bin="$BIN_NOTE" -v note="$NOTE" -v delays="$DELAYS" -v configs="$CONFIGS" -v store="$STORE_MB" '
  function q(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
  NR == 1 { n = split($0, H, ","); next }
  { row = ""; for (i = 1; i <= n; i++) { v = $i; s = (v != "" && v !~ /^-?[0-9]+(\.[0-9]+)?$/); if (v == "") v = "null"; row = row (i > 1 ? ", " : "") q(H[i]) ": " (s ? q(v) : v) }
    rows = rows (rows == "" ? "" : ",\n") "    {" row "}" }
  END {
    printf "{\n  \"date\": %s,\n  \"command\": %s,\n  \"revision\": %s,\n  \"binary\": %s,\n  \"note\": %s,\n  \"meshcache\": %s,\n  \"squid\": %s,\n  \"wrk\": %s,\n", q(stamp), q(cmd), q(rev), q(bin), q(note), q(mesh), q(squid), q(wrk)
    printf "  \"machine\": {\"nproc\": %d, \"cpu\": %s, \"kernel\": %s},\n", nproc, q(cpu), q(kernel)
    printf "  \"config\": {\"duration_s\": %d, \"rounds\": %d, \"connections_per_node\": %d, \"nodes\": 4, \"wrk_threads\": 1, \"origin_delays_ms\": [%s], \"configs\": %s, \"store_mib\": %d, \"sizes\": \"2..10 KiB cycling\", \"netns\": %s, \"server_core\": 1, \"load_core\": 0},\n", dur, rounds, conns, delays, q(configs), store, q(netns)
    printf "  \"runs\": [\n%s\n  ]\n}\n", rows
  }' "$RAW" >"$OUT/results.json"

cat "$OUT/results.md"
log "results in $OUT"
