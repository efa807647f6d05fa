#!/usr/bin/env bash
# Cache-hit benchmark: throughput, latency (p50/p99) and server CPU per 1,000 requests of
# meshcache, Squid (memory cache) and nginx proxy_cache serving one cached object, and of the
# origin emulator served directly (the ceiling), all in one run, interleaved, on this machine.
#
# Follows shared/BENCHMARKING.md: servers pinned to core 1 with one worker each, wrk pinned to
# core 0; rounds interleave [origin, meshcache, squid, nginx]; medians and paired ratios; CPU
# from /proc/PID/stat (utime+stime of the whole process tree); steal time from /proc/stat; the
# hits are proven by the origin's per-URL counter not moving during a proxy's run; the whole
# measurement runs in a fresh network namespace (unshare -n) when the machine allows it.
#
# Usage: scripts/bench-hits.sh [options]
#   --duration SECS    each wrk run (default 10)
#   --rounds N         interleaved rounds per size (default 3)
#   --sizes LIST       object sizes in bytes, comma-separated (default 1024,10240,102400)
#   --connections N    wrk connections (default 50)
#   --targets LIST     subset of origin,meshcache,squid,nginx (default all four)
#   --out DIR          results directory (default target/bench-hits/<UTC timestamp>)
#   --bin PATH         meshcache binary (default: build target/release/meshcache)
#   --no-build         do not run cargo build (use the existing binary)
#   --no-netns         do not run inside `unshare -n`
#   --port-base N      ports N..N+4 on 127.0.0.1 (default 18080)
#   --perf             also record `perf record -g` of meshcache's last run per size into OUT
#   --perf-dwarf       as --perf, with DWARF call graphs (`--call-graph dwarf,8192`): callers of
#                      functions in a release build without frame pointers; larger files
#                      (perf slows that run down, by about a third at 1 KiB)
#   --note TEXT        a line added to the results' header (e.g. which tree the binary is from)
#   --quiet-budget S   on a shared machine: seconds (default 120) this run may spend in total
#                      waiting for other processes' CPU use to drop before a measured run, and
#                      re-doing runs disturbed by it (other CPU > 15% of a core); 0 disables
# Defaults take about 8 minutes (at most 10 with the quiet budget). Installs wrk, squid, nginx-light, curl when missing (apt).
# Output: a Markdown table on stdout and in OUT/results.md; raw numbers in OUT/raw.csv and
# OUT/results.json; the generated configs and the servers' logs in OUT/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR="$REPO/scripts/bench"
ORIG_ARGS=("$@")
# The command as the user typed it (kept across the re-run inside the network namespace).
: "${BENCH_HITS_CMD:=scripts/bench-hits.sh${*:+ $*}}"
export BENCH_HITS_CMD

DURATION=10
ROUNDS=3
SIZES=1024,10240,102400
CONNS=50
TARGETS=origin,meshcache,squid,nginx
OUT=""
BIN=""
BUILD=1
NETNS=1
PORT_BASE=18080
PERF=0
CALLGRAPH=-g
NOTE=""
QUIET_BUDGET=120

BENCH_TAG=bench-hits
# shellcheck source=bench/lib.sh
. "$BENCH_DIR/lib.sh"

while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --targets) TARGETS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; BUILD=0; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-netns) NETNS=0; shift ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --perf) PERF=1; shift ;;
    --perf-dwarf) PERF=1; CALLGRAPH="--call-graph dwarf,8192"; shift ;;
    --note) NOTE=$2; shift 2 ;;
    --quiet-budget) QUIET_BUDGET=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 && $DURATION -le 120 ]] || die "--duration: 1..120 seconds"
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 20 ]] || die "--rounds: 1..20"
[[ $CONNS =~ ^[0-9]+$ && $CONNS -ge 1 && $CONNS -le 2000 ]] || die "--connections: 1..2000"
[[ $QUIET_BUDGET =~ ^[0-9]+$ ]] || die "--quiet-budget: seconds"
[[ $SIZES =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--sizes: comma-separated byte counts"
IFS=, read -r -a SIZE_LIST <<<"$SIZES"
IFS=, read -r -a TARGET_LIST <<<"$TARGETS"
for t in "${TARGET_LIST[@]}"; do
  case "$t" in origin|meshcache|squid|nginx) ;; *) die "--targets: unknown target $t" ;; esac
done
for s in "${SIZE_LIST[@]}"; do [ "$s" -le 1048576 ] || die "--sizes: at most 1 MiB (Squid's memory object limit here)"; done
has_target() { [[ ",$TARGETS," == *",$1,"* ]]; }

# ---------------------------------------------------------------- install, build (outside netns)
if [ -z "${BENCH_HITS_IN_NETNS:-}" ]; then
  declare -A need=([wrk]=wrk [curl]=curl [taskset]=util-linux [ip]=iproute2 [timeout]=coreutils)
  has_target squid && need[squid]=squid
  has_target nginx && need[nginx]=nginx-light
  [ "$PERF" = 1 ] && need[perf]=linux-perf
  bench_install_missing need
  if [ "$BUILD" = 1 ]; then
    log "cargo build --release -p meshcache"
    (cd "$REPO" && cargo build --release -p meshcache)
  fi
fi
export PATH="$PATH:/usr/sbin:/sbin"
[ -n "$BIN" ] || BIN="$REPO/target/release/meshcache"
[ -x "$BIN" ] || die "no meshcache binary at $BIN"
BIN=$(readlink -f "$BIN")
# The revision as the run starts (someone may commit while it runs).
[ -n "${BENCH_HITS_REV:-}" ] || BENCH_HITS_REV=$(bench_revision "$REPO")
export BENCH_HITS_REV
REV_NOTE="repository at $BENCH_HITS_REV"
# Noted now: a concurrent cargo build may replace the file while the benchmark runs.
: "${BENCH_HITS_BIN_NOTE:=$(bench_binary_note "$BIN")}"
export BENCH_HITS_BIN_NOTE
BIN_NOTE=$BENCH_HITS_BIN_NOTE

# Re-run this script inside a fresh network namespace (only its own traffic on lo).
if [ "$NETNS" = 1 ]; then
  bench_enter_netns BENCH_HITS_IN_NETNS "${BASH_SOURCE[0]}" "${ORIG_ARGS[@]}" --no-build --bin "$BIN"
fi
NETNS_USED=no
if [ -n "${BENCH_HITS_IN_NETNS:-}" ]; then
  ip link set lo up
  NETNS_USED=yes
fi

# ---------------------------------------------------------------- setup
ORIGIN_PORT=$PORT_BASE
MESHCACHE_PORT=$((PORT_BASE + 1))
MESHCACHE_ADMIN_PORT=$((PORT_BASE + 2))
SQUID_PORT=$((PORT_BASE + 3))
NGINX_PORT=$((PORT_BASE + 4))
for p in $ORIGIN_PORT $MESHCACHE_PORT $MESHCACHE_ADMIN_PORT $SQUID_PORT $NGINX_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "port $p is in use (try --port-base)"; fi
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ -n "$OUT" ] || OUT="$REPO/target/bench-hits/$STAMP"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/bench-hits.XXXXXX)
chmod 755 "$WORK"
RAW="$OUT/raw.csv"
CLK_TCK=$(getconf CLK_TCK)
ulimit -n 65536 2>/dev/null || ulimit -n 8192 2>/dev/null || true

declare -A PID_OF=()
STARTED=()   # PIDs this script started, in start order
WRK_PID=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ -n "$WRK_PID" ] && kill "$WRK_PID" 2>/dev/null || true
  bench_stop_pids "${STARTED[@]}"
  # Keep the servers' logs and configs with the results; drop the caches.
  if [ -d "$WORK" ]; then
    cp -r "$WORK/conf" "$OUT/" 2>/dev/null || true
    mkdir -p "$OUT/logs"
    local f name
    for f in "$WORK"/*.log "$WORK"/squid/*.log "$WORK"/nginx/*.log; do
      [ -f "$f" ] || continue
      name=${f#"$WORK"/}
      name=${name//\//-}
      case "$f" in
        *access.log) tail -n 20 "$f" >"$OUT/logs/$name.tail" ;;
        *) cp "$f" "$OUT/logs/$name" ;;
      esac
    done
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

fill() { # template -> stdout, replacing @NAME@ placeholders
  sed -e "s|@DIR@|$WORK|g" -e "s|@ORIGIN_PORT@|$ORIGIN_PORT|g" \
    -e "s|@MESHCACHE_PORT@|$MESHCACHE_PORT|g" -e "s|@MESHCACHE_ADMIN_PORT@|$MESHCACHE_ADMIN_PORT|g" \
    -e "s|@SQUID_PORT@|$SQUID_PORT|g" -e "s|@NGINX_PORT@|$NGINX_PORT|g" \
    -e "s|@SQUID_USER_LINE@|$SQUID_USER_LINE|g" -e "s|@NGINX_USER@|$NGINX_USER|g" "$1"
}

wait_port() { # port name pid
  local i
  for ((i = 0; i < 100; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    kill -0 "$3" 2>/dev/null || die "$2 exited at startup (logs in $WORK)"
    sleep 0.1
  done
  die "$2 did not listen on port $1 within 10 s"
}

start() { # name port cmd... (runs pinned to core 1, in the background)
  local name=$1 port=$2
  shift 2
  taskset -c 1 "$@" >"$WORK/$name.stdout.log" 2>"$WORK/$name.stderr.log" &
  local pid=$!
  STARTED+=("$pid")
  PID_OF[$name]=$pid
  wait_port "$port" "$name" "$pid"
  log "$name running (pid $pid, 127.0.0.1:$port)"
}

mkdir -p "$WORK/conf"
SQUID_USER_LINE=""
NGINX_USER=$(id -un)
if [ "$(id -u)" = 0 ]; then
  NGINX_USER=root
  if id proxy >/dev/null 2>&1; then SQUID_USER_LINE="cache_effective_user proxy"; fi
fi

TOKIO_ENV=(env TOKIO_WORKER_THREADS=1 MESHCACHE_LOG=warn)
start origin "$ORIGIN_PORT" "${TOKIO_ENV[@]}" "$BIN" lab origin --listen "127.0.0.1:$ORIGIN_PORT"
if has_target meshcache; then
  fill "$BENCH_DIR/meshcache.toml.in" >"$WORK/conf/meshcache.toml"
  start meshcache "$MESHCACHE_PORT" "${TOKIO_ENV[@]}" "$BIN" run -c "$WORK/conf/meshcache.toml"
fi
if has_target squid; then
  mkdir -p "$WORK/squid"
  [ -n "$SQUID_USER_LINE" ] && chown proxy: "$WORK/squid"
  fill "$BENCH_DIR/squid.conf.in" >"$WORK/conf/squid.conf"
  squid -k parse -f "$WORK/conf/squid.conf" >"$WORK/squid-parse.log" 2>&1 || { cat "$WORK/squid-parse.log" >&2; die "squid.conf does not parse"; }
  start squid "$SQUID_PORT" squid -N -f "$WORK/conf/squid.conf"
fi
if has_target nginx; then
  mkdir -p "$WORK/nginx"
  fill "$BENCH_DIR/nginx.conf.in" >"$WORK/conf/nginx.conf"
  nginx -t -p "$WORK/nginx" -c "$WORK/conf/nginx.conf" -e "$WORK/nginx/error.log" >"$WORK/nginx-t.log" 2>&1 || { cat "$WORK/nginx-t.log" >&2; die "nginx.conf does not parse"; }
  start nginx "$NGINX_PORT" nginx -p "$WORK/nginx" -c "$WORK/conf/nginx.conf" -e "$WORK/nginx/error.log"
fi

port_of() {
  case "$1" in
    origin) echo "$ORIGIN_PORT" ;; meshcache) echo "$MESHCACHE_PORT" ;;
    squid) echo "$SQUID_PORT" ;; nginx) echo "$NGINX_PORT" ;;
  esac
}

# ---------------------------------------------------------------- measurement helpers
origin_count() { # the origin's count for URL, not counting this probe
  local n
  n=$(curl -s --noproxy '*' --max-time 5 -o /dev/null -D - "$1" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-origin-count" { print $2 }')
  [ -n "$n" ] || die "origin did not answer $1"
  echo $((n - 1))
}

# Warm one proxy for one URL and prove it serves hits: after the first request, five more
# must leave the origin's counter where it was and carry X-Cache: HIT.
warm_and_check() { # target url size
  local target=$1 url=$2 size=$3 port before after i hdrs
  port=$(port_of "$target")
  curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 5 -o /dev/null "$url" || die "$target: warm-up request failed"
  sleep 0.2
  before=$(origin_count "$url")
  for i in 1 2 3 4 5; do
    hdrs=$(curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 5 -o "$WORK/body" -D - "$url" | tr -d '\r')
    [ "$(stat -c %s "$WORK/body")" = "$size" ] || die "$target: body of $(stat -c %s "$WORK/body") bytes, expected $size"
  done
  after=$(origin_count "$url")
  [ "$after" = "$((before + 1))" ] || die "$target: origin count moved from $before to $after during hits (not cached?)"
  local xc
  xc=$(awk -F': ' 'tolower($1) == "x-cache" { print $2 }' <<<"$hdrs" | tr '\n' ' ')
  [[ ${xc^^} == *HIT* ]] || die "$target: no X-Cache HIT after warm-up (X-Cache: $xc)"
  log "$target: size $size cached (X-Cache: $xc; origin count steady at $((after - 1)))"
}

# One wrk run against TARGET; appends one CSV row to $RAW.
run_one() { # size round target url phase
  local size=$1 round=$2 target=$3 url=$4 phase=$5 port pid path host c0="" c1="" out
  port=$(port_of "$target")
  pid=${PID_OF[$target]}
  host="127.0.0.1:$ORIGIN_PORT"
  if [ "$target" = origin ]; then path=${url#http://$host}; else path=$url; fi
  [ "$target" = origin ] || c0=$(origin_count "$url")
  out="$WORK/wrk-$size-$round-$target.txt"
  local perf_pid=""
  if [ "$PERF" = 1 ] && [ "$target" = meshcache ] && [ "$phase" = measure ] && [ "$round" = "$ROUNDS" ]; then
    # shellcheck disable=SC2086 # CALLGRAPH is two words or one
    perf record -F 999 $CALLGRAPH -p "$pid" -o "$OUT/perf-meshcache-$size.data" -- sleep "$DURATION" >/dev/null 2>&1 &
    perf_pid=$!
  fi
  local srv0 srv1 st0 st1 w0 w1 t0 t1
  srv0=$(tree_ticks "$pid")
  st0=$(cpu_stat)
  t0=$EPOCHREALTIME
  self_child_ticks; w0=$SELF_CT
  BENCH_PATH=$path BENCH_HOST=$host timeout -k 5 $((DURATION + 30)) \
    taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$BENCH_DIR/absolute-uri.lua" "http://127.0.0.1:$port" >"$out" 2>&1 ||
    { cat "$out" >&2; die "wrk failed against $target"; }
  self_child_ticks; w1=$SELF_CT
  t1=$EPOCHREALTIME
  st1=$(cpu_stat)
  srv1=$(tree_ticks "$pid")
  [ -n "$perf_pid" ] && wait "$perf_pid" 2>/dev/null || true
  [ "$target" = origin ] || c1=$(origin_count "$url")
  if [ "$target" != origin ] && [ "$c1" != "$((c0 + 1))" ]; then
    die "$target: the origin received $((c1 - c0 - 1)) requests during a hit run (not all hits)"
  fi
  [ "$phase" = measure ] || return 0

  local rps reqs p50 p99 errs non2xx origin_delta
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
  reqs=$(awk '/ requests in / { print $1 }' "$out")
  p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$out")")
  p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$out")")
  errs=$(awk '/Socket errors:/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$out")
  [ -n "$rps" ] && [ -n "$reqs" ] || { cat "$out" >&2; die "cannot parse wrk output for $target"; }
  origin_delta=""
  [ "$target" = origin ] || origin_delta=$((c1 - c0 - 1))
  local s00 t00 b00 s10 t10 b10 s01 t01 b01 s11 t11 b11
  read -r s00 t00 b00 s10 t10 b10 <<<"$st0"
  read -r s01 t01 b01 s11 t11 b11 <<<"$st1"
  awk -v size="$size" -v round="$round" -v target="$target" -v rps="$rps" -v reqs="$reqs" \
    -v p50="$p50" -v p99="$p99" -v errs="${errs:-0}" -v non2xx="${non2xx:-0}" \
    -v srv="$((srv1 - srv0))" -v wrk="$((w1 - w0))" -v hz="$CLK_TCK" -v t0="$t0" -v t1="$t1" \
    -v st0="$((s01 - s00))" -v tt0="$((t01 - t00))" -v st1="$((s11 - s10))" -v tt1="$((t11 - t10))" \
    -v busy="$((b01 - b00 + b11 - b10))" -v od="$origin_delta" 'BEGIN {
      wall = t1 - t0; srv_ms = srv * 1000 / hz; wrk_ms = wrk * 1000 / hz
      other = (busy - srv - wrk) * 1000 / hz; if (other < 0) other = 0
      printf "%d,%d,%s,%.2f,%d,%.3f,%.3f,%.3f,%d,%d,%.1f,%.3f,%.1f,%.1f,%.1f,%.2f,%.2f,%.1f,%s\n",
        size, round, target, rps, reqs, wall, p50, p99, errs, non2xx, srv_ms, srv_ms * 1000 / reqs,
        srv_ms / 10 / wall, wrk_ms, wrk_ms / 10 / wall,
        (tt0 > 0 ? 100 * st0 / tt0 : 0), (tt1 > 0 ? 100 * st1 / tt1 : 0), other / 10 / wall, od }' >>"$RAW"
  tail -n 1 "$RAW" | awk -F, '{ printf "  %-9s %7d B round %d: %9.0f req/s  p50 %6.3f ms  p99 %7.3f ms  cpu %6.2f ms/1k  srv %5.1f%%  wrk %5.1f%%  steal %.1f/%.1f%%  other %.0f%%  origin +%s\n",
    $3, $1, $2, $4, $7, $8, $12, $13, $15, $16, $17, $18, ($19 == "" ? "-" : $19) }' >&2
}

# Before a measured run, wait_quiet (lib.sh) waits within the budget until the machine is quiet.
OTHER_MAX=${BENCH_HITS_OTHER_MAX:-15}
QUIET_SPENT=0
# A measured run, re-done (at most twice, within the budget) when other processes used more
# than OTHER_MAX % of a core during it.
measure() { # size round target url
  local attempt other
  for attempt in 1 2 3; do
    wait_quiet
    run_one "$@" measure
    other=$(tail -n 1 "$RAW" | awk -F, '{ printf "%d", $18 }')
    if [ "$other" -le "$OTHER_MAX" ] || [ $attempt = 3 ] || [ "$QUIET_SPENT" -ge "$QUIET_BUDGET" ]; then
      [ "$other" -le "$OTHER_MAX" ] || log "  (kept a run with $other% other CPU: retries or quiet budget used up)"
      return 0
    fi
    log "  other processes used $other% of a core during that run: re-doing it"
    sed -i '$d' "$RAW"
    QUIET_SPENT=$((QUIET_SPENT + DURATION))
  done
}

# ---------------------------------------------------------------- run
echo "size,round,target,rps,requests,wall_s,p50_ms,p99_ms,socket_errors,non2xx,server_cpu_ms,server_cpu_ms_per_1k,server_cpu_pct,wrk_cpu_ms,wrk_cpu_pct,steal_cpu0_pct,steal_cpu1_pct,other_cpu_pct,origin_requests_during_run" >"$RAW"
T_START=$EPOCHSECONDS
for size in "${SIZE_LIST[@]}"; do
  url="http://127.0.0.1:$ORIGIN_PORT/obj?size=$size&cc=max-age%3D3600"
  log "size $size: $url"
  for t in "${TARGET_LIST[@]}"; do
    [ "$t" = origin ] || warm_and_check "$t" "$url" "$size"
  done
  # A short unrecorded run each, so every server has its connections, buffers and caches warm.
  for t in "${TARGET_LIST[@]}"; do
    DURATION_SAVE=$DURATION; DURATION=2
    run_one "$size" 0 "$t" "$url" warm
    DURATION=$DURATION_SAVE
  done
  for ((r = 1; r <= ROUNDS; r++)); do
    for t in "${TARGET_LIST[@]}"; do
      measure "$size" "$r" "$t" "$url"
    done
  done
done
T_END=$EPOCHSECONDS

# ---------------------------------------------------------------- report
CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
WRK_V=$(wrk -v 2>&1 | head -n 1 | awk '{ print $2 }' || true)
SQUID_V=$( (squid -v 2>/dev/null || true) | head -n 1 | awk '{ print $NF }')
NGINX_V=$( (nginx -v 2>&1 || true) | awk -F/ '{ print $2 }')
MESH_V=$("$BIN" --version 2>/dev/null || echo meshcache)
TMPFS=$(stat -f -c %T "$WORK")

{
  echo "# Cache-hit benchmark: $STAMP"
  echo
  echo "- command: \`$BENCH_HITS_CMD\`"
  echo "- revision: $REV_NOTE; $MESH_V; Squid $SQUID_V; nginx $NGINX_V; wrk $WRK_V"
  echo "- meshcache binary: $BIN_NOTE"
  [ -z "$NOTE" ] || echo "- note: $NOTE"
  echo "- machine: $(nproc) CPUs, $CPU_MODEL, kernel $(uname -r); network namespace: $NETNS_USED"
  echo "- load: wrk -t1 -c$CONNS -d${DURATION}s --latency on core 0, absolute-URI GETs for one object (Cache-Control: max-age=3600); servers on core 1, one worker each (meshcache and the origin with TOKIO_WORKER_THREADS=1; Squid workers 1, memory cache only; nginx 1 worker + master + cache manager/loader); all three proxies write an access log, buffered"
  echo "- rounds: $ROUNDS interleaved rounds of [${TARGETS//,/, }] per size; medians below; run took $((T_END - T_START)) s, of which $QUIET_SPENT s waiting for other processes to go quiet or re-doing runs they disturbed (budget $QUIET_BUDGET s); nginx's cache files are under /tmp (file system type $TMPFS; hits come from the page cache)"
  echo "- CPU: server CPU is utime+stime of the server's whole process tree over the run; 'ms/1k' is CPU milliseconds per 1,000 requests; 'srv %' and 'wrk %' are CPU use of one core; steal is per core (0 = wrk, 1 = server); 'other CPU' is busy time on both cores (user+system+irq+softirq from /proc/stat) not charged to the server or wrk, in % of one core: kernel network work done outside their contexts, plus anything else running on the machine"
  echo
  awk -F, -v targets="$TARGETS" '
    function median(list,   n, a, i, j, x) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      if (n == 0) return ""
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function add(k, v) { vals[k] = (k in vals) ? vals[k] " " v : v }
    NR > 1 {
      k = $1 SUBSEP $3
      add(k SUBSEP "rps", $4); add(k SUBSEP "p50", $7); add(k SUBSEP "p99", $8); add(k SUBSEP "cpu", $12)
      add(k SUBSEP "srv", $13); add(k SUBSEP "wrk", $15); add(k SUBSEP "st0", $16); add(k SUBSEP "st1", $17)
      add(k SUBSEP "err", $9 + $10); add(k SUBSEP "oth", $18); if ($19 != "") add(k SUBSEP "od", $19)
      rps[$1, $2, $3] = $4; cpu[$1, $2, $3] = $12
      if (!($1 in seen)) { seen[$1] = 1; sizes[++ns] = $1 }
      if ($2 > maxr) maxr = $2
    }
    END {
      nt = split(targets, T, ",")
      print "| size | server | req/s | p50 ms | p99 ms | CPU ms/1k req | srv CPU % | wrk CPU % | steal core0/core1 % | other CPU % | origin reqs during run | errors |"
      print "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= ns; i++) for (j = 1; j <= nt; j++) {
        s = sizes[i]; t = T[j]; k = s SUBSEP t
        if (!((k SUBSEP "rps") in vals)) continue
        od = ((k SUBSEP "od") in vals) ? median(vals[k SUBSEP "od"]) : "-"
        split(vals[k SUBSEP "od"], o, " "); odmax = 0; for (x in o) if (o[x] + 0 > odmax) odmax = o[x] + 0
        printf "| %s | %s | %.0f | %.3f | %.3f | %.2f | %.0f | %.0f | %.1f / %.1f | %.0f | %s | %d |\n", \
          (s % 1024 == 0 ? s / 1024 " KiB" : s " B"), (t == "origin" ? "origin direct" : t), \
          median(vals[k SUBSEP "rps"]), median(vals[k SUBSEP "p50"]), median(vals[k SUBSEP "p99"]), \
          median(vals[k SUBSEP "cpu"]), median(vals[k SUBSEP "srv"]), median(vals[k SUBSEP "wrk"]), \
          median(vals[k SUBSEP "st0"]), median(vals[k SUBSEP "st1"]), median(vals[k SUBSEP "oth"]), (od == "-" ? "-" : "max " odmax), \
          median(vals[k SUBSEP "err"])
      }
      # Paired ratios: meshcache / competitor within each round, median over rounds.
      print ""
      print "Ratios (meshcache / other, per round in the same run, median over rounds):"
      print ""
      print "| size | req/s vs squid | req/s vs nginx | req/s vs origin direct | CPU/1k vs squid | CPU/1k vs nginx |"
      print "| ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= ns; i++) {
        s = sizes[i]; line = "| " (s % 1024 == 0 ? s / 1024 " KiB" : s " B")
        split("squid nginx origin", C, " ")
        for (c = 1; c <= 3; c++) {
          l = ""; for (r = 1; r <= maxr; r++) if (((s, r, "meshcache") in rps) && ((s, r, C[c]) in rps) && rps[s, r, C[c]] > 0) l = l " " rps[s, r, "meshcache"] / rps[s, r, C[c]]
          ratio[s, "rps", C[c]] = (l == "") ? "" : median(l)
          line = line " | " (l == "" ? "-" : sprintf("%.2f", median(l)))
        }
        for (c = 1; c <= 2; c++) {
          l = ""; for (r = 1; r <= maxr; r++) if (((s, r, "meshcache") in cpu) && ((s, r, C[c]) in cpu) && cpu[s, r, C[c]] > 0) l = l " " cpu[s, r, "meshcache"] / cpu[s, r, C[c]]
          line = line " | " (l == "" ? "-" : sprintf("%.2f", median(l)))
        }
        print line " |"
      }
      # Targets of the issue, per size.
      print ""
      print "Targets (meshcache): at least 2x Squid req/s, at least nginx req/s, p99 < 5 ms, CPU/1k at most nginx'\''s:"
      print ""
      print "| size | >= 2x squid | >= nginx | p99 < 5 ms | CPU/1k <= nginx |"
      print "| ---: | --- | --- | --- | --- |"
      for (i = 1; i <= ns; i++) {
        s = sizes[i]; k = s SUBSEP "meshcache"; kn = s SUBSEP "nginx"
        if (!((k SUBSEP "rps") in vals)) continue
        a = ratio[s, "rps", "squid"]; b = ratio[s, "rps", "nginx"]
        p = median(vals[k SUBSEP "p99"]); cm = median(vals[k SUBSEP "cpu"])
        cn = ((kn SUBSEP "cpu") in vals) ? median(vals[kn SUBSEP "cpu"]) : ""
        printf "| %s | %s | %s | %s | %s |\n", (s % 1024 == 0 ? s / 1024 " KiB" : s " B"), \
          (a == "" ? "-" : (a >= 2 ? "met" : "NOT met") sprintf(" (%.2fx)", a)), \
          (b == "" ? "-" : (b >= 1 ? "met" : "NOT met") sprintf(" (%.2fx)", b)), \
          (p < 5 ? "met" : "NOT met") sprintf(" (%.2f ms)", p), \
          (cn == "" ? "-" : (cm <= cn ? "met" : "NOT met") sprintf(" (%.2f vs %.2f ms)", cm, cn))
      }
    }' "$RAW"
  echo
  echo "Raw numbers: raw.csv and results.json beside this file."
} >"$OUT/results.md"

# results.json: the metadata and every measured run.
awk -F, -v stamp="$STAMP" -v rev="$REV_NOTE" -v cpu="$CPU_MODEL" -v nproc="$(nproc)" \
  -v kernel="$(uname -r)" -v squid="$SQUID_V" -v nginx="$NGINX_V" -v wrk="$WRK_V" -v mesh="$MESH_V" \
  -v dur="$DURATION" -v rounds="$ROUNDS" -v conns="$CONNS" -v netns="$NETNS_USED" -v cmd="$BENCH_HITS_CMD" \
  -v bin="$BIN_NOTE" -v note="$NOTE" '
  function q(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
  NR == 1 { n = split($0, H, ","); next }
  { row = ""; for (i = 1; i <= n; i++) { v = $i; if (i != 3 && v == "") v = "null"; row = row (i > 1 ? ", " : "") q(H[i]) ": " (i == 3 ? q(v) : v) }
    rows = rows (rows == "" ? "" : ",\n") "    {" row "}" }
  END {
    printf "{\n  \"date\": %s,\n  \"command\": %s,\n  \"revision\": %s,\n  \"binary\": %s,\n  \"note\": %s,\n  \"meshcache\": %s,\n  \"squid\": %s,\n  \"nginx\": %s,\n  \"wrk\": %s,\n", q(stamp), q(cmd), q(rev), q(bin), q(note), q(mesh), q(squid), q(nginx), q(wrk)
    printf "  \"machine\": {\"nproc\": %d, \"cpu\": %s, \"kernel\": %s},\n", nproc, q(cpu), q(kernel)
    printf "  \"config\": {\"duration_s\": %d, \"rounds\": %d, \"connections\": %d, \"wrk_threads\": 1, \"netns\": %s, \"server_core\": 1, \"wrk_core\": 0},\n", dur, rounds, conns, q(netns)
    printf "  \"runs\": [\n%s\n  ]\n}\n", rows
  }' "$RAW" >"$OUT/results.json"

cat "$OUT/results.md"
log "results in $OUT"
