#!/usr/bin/env bash
# Disk-hit benchmark: throughput, latency (p50/p99) and server CPU per 1,000 requests of cache
# hits served from the DISK tier (memory tier far smaller than the working set, page cache warm)
# by meshcache, Squid with `cache_dir rock`, Squid with `cache_dir aufs` and nginx proxy_cache,
# and of the origin emulator served directly (the ceiling), all in one run, interleaved.
#
# For each size S: N = working set / S distinct URLs "/d<S>-<i>?size=S&cc=max-age%3D3600";
# every proxy is warmed with all N (each fetched once through it, so it is stored), then checked
# (a random sample fetched twice: the second is a hit and the origin's count does not move);
# every measured request is a URL drawn uniformly at random among them (wrk, random-uri.lua).
# Squid's rock store is direct-mapped (an object's slot is its key's hash modulo the slots; a new
# object overwrites whatever was there), so it loses part of the working set to collisions: with
# squid-rock among the targets, every server is measured on the objects rock kept (found by an
# only-if-cached pass through it), so that all see the same requests and all are hits.
# The proxies' memory tiers (meshcache store.memory, Squid cache_mem) are --memory MiB, so almost
# every hit comes from the disk tier; nginx has none (its hits are its cache files). Which tier
# served the hits is counted from each proxy's access log (TCP_HIT vs TCP_MEM_HIT for meshcache
# and Squid; $upstream_cache_status for nginx), and for meshcache from /stats.
#
# Follows shared/BENCHMARKING.md as scripts/bench-hits.sh does: servers pinned to core 1 with one
# worker each, wrk pinned to core 0; rounds interleave the targets; medians and paired ratios; CPU
# from /proc/PID/stat (utime+stime of the whole process tree); steal time from /proc/stat; the
# hits are proven by the origin's per-URL counters (a sample) not moving during a proxy's run
# and by the proxies' logs; the whole measurement runs in a fresh network namespace.
#
# Usage: scripts/bench-disk.sh [options]
#   --duration SECS      each wrk run (default 10)
#   --rounds N           interleaved rounds per size (default 3)
#   --sizes LIST         object sizes in bytes, comma-separated (default 1024,10240,102400)
#   --working-set BYTES  bytes of distinct objects per size (default 268435456, 256 MiB: 262144
#                        objects at 1 KiB, 26214 at 10 KiB, 2621 at 100 KiB); at most 1048576
#                        objects per size
#   --memory MIB         memory tier of meshcache (store.memory) and Squid (cache_mem), in MiB
#                        (default 4)
#   --connections N      wrk connections (default 50)
#   --targets LIST       subset of origin,meshcache,squid-rock,squid-aufs,nginx,nginx-ofc
#                        (default all but nginx-ofc; nginx-ofc too with --nginx-open-file-cache)
#   --nginx-open-file-cache N
#                        also measure nginx-ofc: nginx as above plus `open_file_cache max=N`
#                        (cache files kept open between hits, as meshcache keeps large ones)
#   --open-files N       meshcache's store.open_files (default: meshcache's default, 4096)
#   --rock-mb MB         size of the rock cache_dir (default: 1.5 x the 16 KiB slots the working
#                        sets need, + 64; larger loses fewer objects to collisions, and Squid
#                        reads the whole db at start)
#   --warm-timeout SECS  longest one proxy's warm-up of one size may take (default 600)
#   --out DIR            results directory (default target/bench-disk/<UTC timestamp>)
#   --bin PATH           meshcache binary (default: build target/release/meshcache)
#   --no-build           do not run cargo build (use the existing binary)
#   --no-netns           do not run inside `unshare -n`
#   --port-base N        ports N..N+6 on 127.0.0.1 (default 18180)
#   --keep-logs          keep the proxies' whole access logs in OUT/logs (default: their last lines)
#   --note TEXT          a line added to the results' header (e.g. which tree the binary is from)
#   --quiet-budget S     on a shared machine: seconds (default 120) this run may spend in total
#                        waiting for other processes' CPU use to drop before a measured run, and
#                        re-doing runs disturbed by it (other CPU > 15% of a core); 0 disables
# Defaults take about 20 minutes (warm-up about a third of it). Needs about 6 GiB free under
# /tmp (the caches' files) and as much free memory for the page cache. Installs wrk, squid,
# nginx-light, curl when missing (apt).
# Output: Markdown tables on stdout and in OUT/results.md; raw numbers in OUT/raw.csv,
# OUT/hits.csv, OUT/warmup.csv, OUT/meshcache-stats.csv and OUT/results.json; the generated
# configs and the servers' logs in OUT/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR="$REPO/scripts/bench"
ORIG_ARGS=("$@")
# The command as the user typed it (kept across the re-run inside the network namespace).
: "${BENCH_DISK_CMD:=scripts/bench-disk.sh${*:+ $*}}"
export BENCH_DISK_CMD

DURATION=10
ROUNDS=3
SIZES=1024,10240,102400
WORKING_SET=268435456
MEMORY_MIB=4
CONNS=50
TARGETS=""
NGINX_OFC=""
OPEN_FILES=""
ROCK_MB_OPT=""
WARM_TIMEOUT=600
OUT=""
BIN=""
BUILD=1
NETNS=1
PORT_BASE=18180
NOTE=""
KEEP_LOGS=0
QUIET_BUDGET=120
MAX_OBJECTS=1048576
VERIFY_SAMPLE=50   # URLs per proxy and size checked after the warm-up
RUN_SAMPLE=20      # URLs whose origin counts are compared around every run

BENCH_TAG=bench-disk
# shellcheck source=bench/lib.sh
. "$BENCH_DIR/lib.sh"

while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --working-set) WORKING_SET=$2; shift 2 ;;
    --memory) MEMORY_MIB=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --targets) TARGETS=$2; shift 2 ;;
    --nginx-open-file-cache) NGINX_OFC=$2; shift 2 ;;
    --open-files) OPEN_FILES=$2; shift 2 ;;
    --rock-mb) ROCK_MB_OPT=$2; shift 2 ;;
    --warm-timeout) WARM_TIMEOUT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; BUILD=0; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-netns) NETNS=0; shift ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --note) NOTE=$2; shift 2 ;;
    --keep-logs) KEEP_LOGS=1; shift ;;
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
[[ $WORKING_SET =~ ^[0-9]+$ && $WORKING_SET -ge 1048576 ]] || die "--working-set: bytes, at least 1 MiB"
[[ $MEMORY_MIB =~ ^[0-9]+$ && $MEMORY_MIB -ge 1 && $MEMORY_MIB -le 4096 ]] || die "--memory: 1..4096 MiB"
[[ $WARM_TIMEOUT =~ ^[0-9]+$ && $WARM_TIMEOUT -ge 10 && $WARM_TIMEOUT -le 7200 ]] || die "--warm-timeout: 10..7200 seconds"
[ -z "$NGINX_OFC" ] || [[ $NGINX_OFC =~ ^[0-9]+$ && $NGINX_OFC -ge 1 ]] || die "--nginx-open-file-cache: a number of files"
[ -z "$OPEN_FILES" ] || [[ $OPEN_FILES =~ ^[0-9]+$ ]] || die "--open-files: a number of files"
[ -z "$ROCK_MB_OPT" ] || [[ $ROCK_MB_OPT =~ ^[0-9]+$ && $ROCK_MB_OPT -ge 16 ]] || die "--rock-mb: megabytes, at least 16"
if [ -z "$TARGETS" ]; then
  TARGETS=origin,meshcache,squid-rock,squid-aufs,nginx
  [ -z "$NGINX_OFC" ] || TARGETS="$TARGETS,nginx-ofc"
fi
IFS=, read -r -a SIZE_LIST <<<"$SIZES"
IFS=, read -r -a TARGET_LIST <<<"$TARGETS"
for t in "${TARGET_LIST[@]}"; do
  case "$t" in origin|meshcache|squid-rock|squid-aufs|nginx|nginx-ofc) ;; *) die "--targets: unknown target $t" ;; esac
done
has_target() { [[ ",$TARGETS," == *",$1,"* ]]; }
has_target nginx-ofc && [ -z "$NGINX_OFC" ] && die "--targets: nginx-ofc needs --nginx-open-file-cache N"
declare -A N_OF=()
for s in "${SIZE_LIST[@]}"; do
  [ "$s" -ge 1 ] && [ "$s" -le 4194304 ] || die "--sizes: 1 byte to 4 MiB"
  n=$((WORKING_SET / s))
  [ "$n" -le "$MAX_OBJECTS" ] || n=$MAX_OBJECTS
  [ "$n" -ge 100 ] || die "--working-set: $n objects of $s bytes; at least 100 are needed"
  N_OF[$s]=$n
done

[ "$WORKING_SET" -ge $((16 * MEMORY_MIB * 1048576)) ] ||
  [ -n "${BENCH_DISK_IN_NETNS:-}" ] || log "note: the working set is only $((WORKING_SET / (MEMORY_MIB * 1048576)))x the memory tiers: a good share of the hits will be memory hits (see the report's 'Where the hits came from')"

# ---------------------------------------------------------------- install, build (outside netns)
if [ -z "${BENCH_DISK_IN_NETNS:-}" ]; then
  declare -A need=([wrk]=wrk [curl]=curl [taskset]=util-linux [ip]=iproute2 [timeout]=coreutils [python3]=python3)
  { has_target squid-rock || has_target squid-aufs; } && need[squid]=squid
  { has_target nginx || has_target nginx-ofc; } && need[nginx]=nginx-light
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
[ -n "${BENCH_DISK_REV:-}" ] || BENCH_DISK_REV=$(bench_revision "$REPO")
export BENCH_DISK_REV
REV_NOTE="repository at $BENCH_DISK_REV"
# Noted now: a concurrent cargo build may replace the file while the benchmark runs.
: "${BENCH_DISK_BIN_NOTE:=$(bench_binary_note "$BIN")}"
export BENCH_DISK_BIN_NOTE
BIN_NOTE=$BENCH_DISK_BIN_NOTE
"$BIN" config default 2>/dev/null | grep -q '^open_files' || die "$BIN has no disk store (store.open_files unknown): build a newer tree"

# Re-run this script inside a fresh network namespace (only its own traffic on lo).
if [ "$NETNS" = 1 ]; then
  bench_enter_netns BENCH_DISK_IN_NETNS "${BASH_SOURCE[0]}" "${ORIG_ARGS[@]}" --no-build --bin "$BIN"
fi
NETNS_USED=no
if [ -n "${BENCH_DISK_IN_NETNS:-}" ]; then
  ip link set lo up
  NETNS_USED=yes
fi

# ---------------------------------------------------------------- setup
ORIGIN_PORT=$PORT_BASE
MESHCACHE_PORT=$((PORT_BASE + 1))
MESHCACHE_ADMIN_PORT=$((PORT_BASE + 2))
SQUID_ROCK_PORT=$((PORT_BASE + 3))
SQUID_AUFS_PORT=$((PORT_BASE + 4))
NGINX_PORT=$((PORT_BASE + 5))
NGINX_OFC_PORT=$((PORT_BASE + 6))
for p in $ORIGIN_PORT $MESHCACHE_PORT $MESHCACHE_ADMIN_PORT $SQUID_ROCK_PORT $SQUID_AUFS_PORT $NGINX_PORT $NGINX_OFC_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "port $p is in use (try --port-base)"; fi
done
port_of() {
  case "$1" in
    origin) echo "$ORIGIN_PORT" ;; meshcache) echo "$MESHCACHE_PORT" ;;
    squid-rock) echo "$SQUID_ROCK_PORT" ;; squid-aufs) echo "$SQUID_AUFS_PORT" ;;
    nginx) echo "$NGINX_PORT" ;; nginx-ofc) echo "$NGINX_OFC_PORT" ;;
  esac
}

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ -n "$OUT" ] || OUT="$REPO/target/bench-disk/$STAMP"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/bench-disk.XXXXXX)
chmod 755 "$WORK"
RAW="$OUT/raw.csv"
HITS="$OUT/hits.csv"
WARMUP="$OUT/warmup.csv"
MSTATS="$OUT/meshcache-stats.csv"
WINDOWS="$WORK/windows.csv"
CLK_TCK=$(getconf CLK_TCK)
# The block device under the caches: its sectors read during a run (by anyone) show whether the
# hits came from the page cache.
DISKDEV=$(basename "$(df -P "$WORK" | awk 'NR == 2 { print $1 }')")
dev_read_sectors() { awk -v d="$DISKDEV" '$3 == d { print $6; f = 1 } END { if (!f) print "" }' /proc/diskstats; }
# As many descriptors as the machine allows (the soft limit raised to the hard one): every server
# runs under the same limit; nginx.conf sets its own (worker_rlimit_nofile).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 8192 2>/dev/null || true

# Room for every size's objects at once (earlier sizes stay cached), with half again to spare:
# bodies plus about 1 KiB of headers and metadata, rounded up to each store's unit.
round_up() { echo $((($1 + $2 - 1) / $2 * $2)); }
MESH_DISK_BYTES=0; ROCK_SLOTS=0; FILE_BYTES=0; TOTAL_OBJECTS=0
for s in "${SIZE_LIST[@]}"; do
  n=${N_OF[$s]}; rec=$((s + 1024))
  if [ "$s" -lt 32768 ]; then unit=256; else unit=4096; fi
  MESH_DISK_BYTES=$((MESH_DISK_BYTES + n * $(round_up "$rec" "$unit")))
  ROCK_SLOTS=$((ROCK_SLOTS + n * ((rec + 16383) / 16384)))    # rock's default 16 KiB slots
  FILE_BYTES=$((FILE_BYTES + n * $(round_up "$rec" 4096)))    # a file each, 4 KiB blocks
  TOTAL_OBJECTS=$((TOTAL_OBJECTS + n))
done
MIB=1048576
DISK_MIB=$((MESH_DISK_BYTES * 3 / 2 / MIB + 64))
ROCK_MB=$((ROCK_SLOTS * 16384 * 3 / 2 / MIB + 64))
[ -z "$ROCK_MB_OPT" ] || ROCK_MB=$ROCK_MB_OPT
AUFS_MB=$((FILE_BYTES * 3 / 2 / MIB + 64))
NGINX_MAX_MB=$AUFS_MB
NGINX_KEYS_MB=$((TOTAL_OBJECTS / 4000 + 16))   # about 8,000 keys a MiB

declare -A PID_OF=()
STARTED=()   # PIDs this script started, in start order
WRK_PID=""
WARM_PIDS=()

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ -n "$WRK_PID" ] && kill "$WRK_PID" 2>/dev/null || true
  local p
  for p in "${WARM_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  bench_stop_pids "${STARTED[@]}"
  # Keep the servers' logs and configs with the results; drop the caches.
  if [ -d "$WORK" ]; then
    cp -r "$WORK/conf" "$OUT/" 2>/dev/null || true
    mkdir -p "$OUT/logs"
    local f name
    for f in "$WORK"/*.log "$WORK"/*/*.log; do
      [ -f "$f" ] || continue
      name=${f#"$WORK"/}
      name=${name//\//-}
      case "$f" in
        *access.log) if [ "$KEEP_LOGS" = 1 ]; then cp "$f" "$OUT/logs/$name"; else tail -n 20 "$f" >"$OUT/logs/$name.tail"; fi ;;
        *) cp "$f" "$OUT/logs/$name" ;;
      esac
    done
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

OPEN_FILES_LINE="# open_files: meshcache's default (4096)"
[ -z "$OPEN_FILES" ] || OPEN_FILES_LINE="open_files = $OPEN_FILES"
fill() { # template [extra sed args...] -> stdout, replacing @NAME@ placeholders
  local tpl=$1
  shift
  sed -e "s|@DIR@|$WORK|g" -e "s|@ORIGIN_PORT@|$ORIGIN_PORT|g" \
    -e "s|@MESHCACHE_PORT@|$MESHCACHE_PORT|g" -e "s|@MESHCACHE_ADMIN_PORT@|$MESHCACHE_ADMIN_PORT|g" \
    -e "s|@MEMORY_MIB@|$MEMORY_MIB|g" -e "s|@DISK_MIB@|$DISK_MIB|g" -e "s|@OPEN_FILES_LINE@|$OPEN_FILES_LINE|g" \
    -e "s|@ROCK_MB@|$ROCK_MB|g" -e "s|@AUFS_MB@|$AUFS_MB|g" \
    -e "s|@KEYS_MB@|$NGINX_KEYS_MB|g" -e "s|@MAX_SIZE_MB@|$NGINX_MAX_MB|g" \
    -e "s|@SQUID_USER_LINE@|$SQUID_USER_LINE|g" -e "s|@NGINX_USER@|$NGINX_USER|g" "$@" "$tpl"
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

mstat() { # python expression over the /stats JSON `d` -> stdout
  curl -s --noproxy '*' --max-time 5 "http://127.0.0.1:$MESHCACHE_ADMIN_PORT/stats" |
    python3 -c "import json, sys; d = json.load(sys.stdin); print($1)" || die "meshcache /stats unreadable"
}

# Squid: its cache_dir is made by `squid -z` (in the foreground with -N) before it starts, and it
# stores nothing on a cache_dir until that dir's rebuild (the reading of what is on it) is over.
squid_up() { # target (starts it, waits until its cache_dir is loaded)
  local t=$1 port dir="$WORK/$1" name=bench${1#squid-} i before
  port=$(port_of "$t")
  before=$(grep -c 'Finished rebuilding storage from disk' "$dir/cache.log" 2>/dev/null || true)
  start "$t" "$port" squid -N -n "$name" -f "$WORK/conf/$t.conf"
  for ((i = 0; i < 3000; i++)); do
    [ "$(grep -c 'Finished rebuilding storage from disk' "$dir/cache.log" 2>/dev/null || true)" -gt "${before:-0}" ] && break
    kill -0 "${PID_OF[$t]}" 2>/dev/null || die "$t exited (see $dir/cache.log)"
    sleep 0.1
  done
  [ "$(grep -c 'Finished rebuilding storage from disk' "$dir/cache.log" 2>/dev/null || true)" -gt "${before:-0}" ] ||
    die "$t: its cache_dir was not loaded within 300 s"
  log "$t: cache_dir loaded ($(awk '/Finished rebuilding storage from disk/ { f = 1; n = "" } f && /Entries scanned/ { n = $(NF - 2) " entries scanned, " }
    f && /Took .* seconds/ { t = $0; sub(/^.*Took /, "", t); sub(/ seconds.*$/, " s", t); f = 0 } END { print n "in " t }' "$dir/cache.log"))"
}

start_squid() { # target
  local t=$1 dir="$WORK/$1" name=bench${1#squid-}
  mkdir -p "$dir/cache"
  [ -n "$SQUID_USER_LINE" ] && chown -R proxy: "$dir"
  fill "$BENCH_DIR/$t.conf.in" -e "s|@SQUID_PORT@|$(port_of "$t")|g" >"$WORK/conf/$t.conf"
  squid -k parse -f "$WORK/conf/$t.conf" >"$WORK/$t-parse.log" 2>&1 || { cat "$WORK/$t-parse.log" >&2; die "$t.conf does not parse"; }
  log "$t: squid -z (creating the cache_dir)"
  timeout -k 5 300 squid -z -N -n "$name" -f "$WORK/conf/$t.conf" >"$WORK/$t-z.log" 2>&1 || { cat "$WORK/$t-z.log" >&2; die "$t: squid -z failed"; }
  squid_up "$t"
}

restart_squid() { # target: stops it and starts it again (its memory cache empty, its cache_dir re-read)
  local t=$1 old=${PID_OF[$1]} p keep=()
  bench_stop_pids "$old"
  for p in "${STARTED[@]}"; do [ "$p" = "$old" ] || keep+=("$p"); done
  STARTED=("${keep[@]}")
  squid_up "$t"
}

start_nginx() { # target port
  local t=$1 port=$2 ofc="# open_file_cache off (nginx's default)"
  [ "$t" = nginx-ofc ] && ofc="open_file_cache max=$NGINX_OFC inactive=10m;"
  mkdir -p "$WORK/$t"
  fill "$BENCH_DIR/nginx-disk.conf.in" -e "s|@NGINX_NAME@|$t|g" -e "s|@NGINX_PORT@|$port|g" \
    -e "s|@OPEN_FILE_CACHE_LINE@|$ofc|g" >"$WORK/conf/$t.conf"
  nginx -t -p "$WORK/$t" -c "$WORK/conf/$t.conf" -e "$WORK/$t/error.log" >"$WORK/$t-t.log" 2>&1 || { cat "$WORK/$t-t.log" >&2; die "$t.conf does not parse"; }
  start "$t" "$port" nginx -p "$WORK/$t" -c "$WORK/conf/$t.conf" -e "$WORK/$t/error.log"
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
  mkdir -p "$WORK/meshcache"
  fill "$BENCH_DIR/meshcache-disk.toml.in" >"$WORK/conf/meshcache.toml"
  "$BIN" config check "$WORK/conf/meshcache.toml" >"$WORK/meshcache-check.log" 2>&1 ||
    { cat "$WORK/meshcache-check.log" >&2; die "meshcache.toml does not check"; }
  start meshcache "$MESHCACHE_PORT" "${TOKIO_ENV[@]}" "$BIN" run -c "$WORK/conf/meshcache.toml"
  wait_port "$MESHCACHE_ADMIN_PORT" meshcache-admin "${PID_OF[meshcache]}"
  for ((i = 0; i < 600; i++)); do
    [ "$(mstat 'd["store"]["disks"][0]["rebuilding"]')" = False ] && break
    sleep 0.1
  done
  [ "$(mstat 'd["store"]["disks"][0]["rebuilding"]')" = False ] || die "meshcache: its disk is still rebuilding after 60 s"
fi
has_target squid-rock && start_squid squid-rock
has_target squid-aufs && start_squid squid-aufs
has_target nginx && start_nginx nginx "$NGINX_PORT"
has_target nginx-ofc && start_nginx nginx-ofc "$NGINX_OFC_PORT"

# ---------------------------------------------------------------- helpers
url_of() { echo "http://127.0.0.1:$ORIGIN_PORT/d$1-$2?size=$1&cc=max-age%3D3600"; } # size index

sample_indices() { # file count seed -> count distinct indices of those in file (one a line)
  awk -v k="$2" -v seed="$3" '{ a[++n] = $1 } END { srand(seed); if (k > n) k = n
    while (got < k) { i = 1 + int(rand() * n); if (!(i in seen)) { seen[i] = 1; got++; print a[i] } } }' "$1"
}

origin_count() { # the origin's count for URL, not counting this probe
  local n
  n=$(curl -s --noproxy '*' --max-time 5 -o /dev/null -w '%header{x-origin-count}' "$1")
  [[ $n =~ ^[0-9]+$ ]] || die "origin did not answer $1"
  echo $((n - 1))
}

origin_counts() { # size index... -> "i:count" list (one line)
  local size=$1 i out=""
  shift
  for i in "$@"; do out="$out $i:$(origin_count "$(url_of "$size" "$i")")"; done
  echo "${out# }"
}

# Warm one proxy with all N URLs of one size: each fetched once through it (a miss, stored),
# by 4 curl processes on core 0 (each reusing one connection), at most --warm-timeout seconds.
warm_target() { # target size
  local t=$1 size=$2 n=${N_OF[$2]} port j codes bad t0 secs objects_before="" objects_after=""
  port=$(port_of "$t")
  [ "$t" = meshcache ] && objects_before=$(mstat 'd["store"]["disks"][0]["objects"]')
  t0=$EPOCHREALTIME
  WARM_PIDS=()
  for j in 0 1 2 3; do
    timeout -k 5 "$WARM_TIMEOUT" taskset -c 0 curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 30 \
      -K "$WORK/urls-$size.$j" -w '%{http_code}\n' >"$WORK/warm-$t-$size.$j" 2>&1 &
    WARM_PIDS+=($!)
  done
  bad=0
  for j in "${WARM_PIDS[@]}"; do wait "$j" || bad=1; done
  WARM_PIDS=()
  secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  [ $bad = 0 ] || die "$t: the warm-up of size $size failed or took more than $WARM_TIMEOUT s (see --warm-timeout, --working-set)"
  codes=$(cat "$WORK"/warm-"$t"-"$size".? | sort | uniq -c | awk '{ printf "%s%s x %s", (NR > 1 ? ", " : ""), $1, $2 }')
  [ "$(cat "$WORK"/warm-"$t"-"$size".? | grep -c '^200$')" = "$n" ] || die "$t: warm-up of size $size answered $codes (expected $n x 200)"
  rm -f "$WORK"/warm-"$t"-"$size".?
  # meshcache writes to its disk behind the responses: wait until its queue is empty.
  local drained=""
  if [ "$t" = meshcache ]; then
    local q i
    for ((i = 0; i < 1200; i++)); do
      q=$(mstat 'd["store"]["disks"][0]["queue_jobs"] + d["store"]["disks"][0]["pending"]')
      [ "$q" = 0 ] && break
      sleep 0.1
    done
    [ "$q" = 0 ] || die "meshcache: disk queue not empty 120 s after the warm-up ($q jobs/pending)"
    drained=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    objects_after=$(mstat 'd["store"]["disks"][0]["objects"]')
    [ $((objects_after - objects_before)) -ge "$n" ] ||
      log "WARNING: meshcache's disk holds $((objects_after - objects_before)) more objects, not $n (dropped writes: $(mstat 'd["store"]["disks"][0]["dropped"]'))"
  fi
  log "$t: warmed with $n objects of $size B in $secs s ($(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')/s)${drained:+; disk queue empty after $drained s, $((objects_after - objects_before)) objects added to the disk}"
  WARM_SECS=$secs
  WARM_DISK_ADDED=${objects_after:+$((objects_after - objects_before))}
}

# Which of the N objects of a size squid-rock holds on its disk: Squid is restarted (so that its
# memory cache, which may still hold objects whose rock slot was taken by another, is empty),
# then every URL is asked through it with "Cache-Control: only-if-cached" (a 504 without asking
# the origin when it does not hold it). Writes their indices to $WORK/idx-SIZE: the objects
# measured, for every server.
rock_held() { # size
  local size=$1 n=${N_OF[$1]} port j bad t0 held
  log "squid-rock: restarting it (an empty memory cache), then asking for every object with only-if-cached"
  restart_squid squid-rock
  port=$(port_of squid-rock)
  t0=$EPOCHREALTIME
  WARM_PIDS=()
  for j in 0 1 2 3; do
    timeout -k 5 "$WARM_TIMEOUT" taskset -c 0 curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 30 \
      -H 'Cache-Control: only-if-cached' -K "$WORK/urls-$size.$j" -w '%{http_code} %{url_effective}\n' >"$WORK/held-$size.$j" 2>&1 &
    WARM_PIDS+=($!)
  done
  bad=0
  for j in "${WARM_PIDS[@]}"; do wait "$j" || bad=1; done
  WARM_PIDS=()
  [ $bad = 0 ] || die "squid-rock: the only-if-cached pass of size $size failed or took more than $WARM_TIMEOUT s"
  cat "$WORK"/held-"$size".? | awk '$1 == 200 && match($2, /\/d[0-9]+-[0-9]+\?/) { u = substr($2, RSTART + 1, RLENGTH - 2); sub(/^d[0-9]+-/, "", u); print u }' |
    sort -n >"$WORK/idx-$size"
  held=$(wc -l <"$WORK/idx-$size")
  [ "$(cat "$WORK"/held-"$size".? | awk '$1 != 200 && $1 != 504' | wc -l)" = 0 ] || die "squid-rock: only-if-cached pass of size $size: answers other than 200 and 504 (see $WORK/held-$size.*)"
  rm -f "$WORK"/held-"$size".?
  [ $((held * 2)) -ge "$n" ] || die "squid-rock kept only $held of $n objects of $size B (try --rock-mb)"
  log "squid-rock: holds $held of $n objects of $size B ($(awk -v h="$held" -v n="$n" 'BEGIN { printf "%.1f", 100 * h / n }') %; the rest lost to its direct-mapped slots), checked in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s; every server is measured on these"
}

# Prove the warm-up: VERIFY_SAMPLE random URLs fetched twice through the proxy; the second must
# be a hit (X-Cache) with the right length, and the origin's count may move only for a first
# fetch that missed (an object the warm-up did not leave on the disk: counted and reported).
verify_target() { # target size
  local t=$1 size=$2 n=${N_OF[$2]} port i url c0 c1 r1 r2 want first_miss=0 checked=0
  port=$(port_of "$t")
  while read -r i; do
    url=$(url_of "$size" "$i")
    c0=$(origin_count "$url")
    r1=$(curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 5 -o /dev/null -w '%{http_code} %{size_download} %header{x-cache}' "$url")
    r2=$(curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 5 -o /dev/null -w '%{http_code} %{size_download} %header{x-cache}' "$url")
    c1=$(origin_count "$url")
    want=$((c0 + 1))
    if [[ ${r1^^} != *HIT* ]]; then first_miss=$((first_miss + 1)); want=$((c0 + 2)); fi
    [[ $r2 == "200 $size "* && ${r2^^} == *HIT* ]] || die "$t: $url fetched twice: second answer \"$r2\" (expected 200, $size bytes, X-Cache HIT)"
    [ "$c1" = "$want" ] || die "$t: the origin's count for $url went from $c0 to $((c1 - 1)) over two fetches (first: \"$r1\")"
    checked=$((checked + 1))
  done < <(sample_indices "$WORK/idx-$size" "$VERIFY_SAMPLE" "$((size + 7))")
  [ $((first_miss * 10)) -le "$checked" ] || die "$t: $first_miss of $checked sampled URLs were not cached after the warm-up"
  log "$t: size $size checked: $checked sampled URLs hit on the second fetch, origin counts steady; $first_miss missed on the first fetch"
  VERIFY_MISSES=$first_miss
}

# One wrk run against TARGET; appends one CSV row to $RAW (measured runs).
run_one() { # size round target phase
  local size=$1 round=$2 target=$3 phase=$4 n=${N_OF[$1]} port pid prefix host out before="" after=""
  port=$(port_of "$target")
  pid=${PID_OF[$target]}
  host="127.0.0.1:$ORIGIN_PORT"
  if [ "$target" = origin ]; then prefix=""; else prefix="http://$host"; fi
  [ "$target" = origin ] || before=$(origin_counts "$size" "${RUN_IDX[@]}")
  local m0=""
  [ "$target" = meshcache ] && m0=$(mstat 'd["requests_by_result"]["TCP_HIT"], d["requests_by_result"]["TCP_MEM_HIT"], d["requests_by_result"]["TCP_MISS"], d["store"]["disks"][0]["hits"], d["store"]["disk_sendfile_bytes"], d["requests"]')
  out="$WORK/wrk-$size-$round-$target-$phase.txt"
  local srv0 srv1 st0 st1 w0 w1 t0 t1 rd0 rd1
  rd0=$(dev_read_sectors)
  srv0=$(tree_ticks "$pid")
  st0=$(cpu_stat)
  t0=$EPOCHREALTIME
  self_child_ticks; w0=$SELF_CT
  BENCH_PREFIX=$prefix BENCH_HOST=$host BENCH_SIZE=$size BENCH_INDEX_FILE="$WORK/idx-$size" BENCH_SEED=$((size + 1000 * round)) \
    timeout -k 5 $((DURATION + 60)) taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency \
    -s "$BENCH_DIR/random-uri.lua" "http://127.0.0.1:$port" >"$out" 2>&1 ||
    { cat "$out" >&2; die "wrk failed against $target"; }
  self_child_ticks; w1=$SELF_CT
  t1=$EPOCHREALTIME
  st1=$(cpu_stat)
  srv1=$(tree_ticks "$pid")
  rd1=$(dev_read_sectors)
  echo "$size,$round,$target,$phase,$t0,$t1" >>"$WINDOWS"
  local origin_delta=""
  if [ "$target" != origin ]; then
    after=$(origin_counts "$size" "${RUN_IDX[@]}")
    # Each probe adds one: a URL the proxy did not ask the origin for is one more than before.
    origin_delta=$(awk -v a="$before" -v b="$after" 'BEGIN { n = split(a, x, " "); split(b, y, " "); d = 0
      for (i = 1; i <= n; i++) { split(x[i], p, ":"); split(y[i], q, ":"); d += q[2] - p[2] - 1 }; print d }')
    [ "$origin_delta" = 0 ] || die "$target: the origin received $origin_delta requests for $RUN_SAMPLE sampled URLs during a hit run (not all hits)"
  fi
  if [ "$target" = meshcache ] && [ "$phase" = measure ]; then
    local m1
    m1=$(mstat 'd["requests_by_result"]["TCP_HIT"], d["requests_by_result"]["TCP_MEM_HIT"], d["requests_by_result"]["TCP_MISS"], d["store"]["disks"][0]["hits"], d["store"]["disk_sendfile_bytes"], d["requests"], d["store"]["open_files"], d["store"]["disks"][0]["objects"], d["store"]["objects"]')
    awk -v size="$size" -v round="$round" -v a="$m0" -v b="$m1" 'BEGIN { gsub(/[(),]/, " ", a); gsub(/[(),]/, " ", b)
      split(a, x, " "); split(b, y, " ")
      printf "%d,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f\n", size, round, y[1] - x[1], y[2] - x[2], y[3] - x[3], y[4] - x[4], y[5] - x[5], y[6] - x[6], y[7], y[8], y[9] }' >>"$MSTATS"
  fi
  [ "$phase" = measure ] || return 0

  local rps reqs p50 p99 errs non2xx
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
  reqs=$(awk '/ requests in / { print $1 }' "$out")
  p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$out")")
  p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$out")")
  errs=$(awk '/Socket errors:/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$out")
  [ -n "$rps" ] && [ -n "$reqs" ] && [ "$reqs" -gt 0 ] || { cat "$out" >&2; die "cannot parse wrk output for $target"; }
  local s00 t00 b00 s10 t10 b10 s01 t01 b01 s11 t11 b11
  read -r s00 t00 b00 s10 t10 b10 <<<"$st0"
  read -r s01 t01 b01 s11 t11 b11 <<<"$st1"
  awk -v size="$size" -v round="$round" -v target="$target" -v rps="$rps" -v reqs="$reqs" \
    -v p50="$p50" -v p99="$p99" -v errs="${errs:-0}" -v non2xx="${non2xx:-0}" \
    -v srv="$((srv1 - srv0))" -v wrk="$((w1 - w0))" -v hz="$CLK_TCK" -v t0="$t0" -v t1="$t1" \
    -v st0="$((s01 - s00))" -v tt0="$((t01 - t00))" -v st1="$((s11 - s10))" -v tt1="$((t11 - t10))" \
    -v busy="$((b01 - b00 + b11 - b10))" -v od="$origin_delta" -v rd="${rd0:+$(( (rd1 - rd0) / 2 ))}" 'BEGIN {
      wall = t1 - t0; srv_ms = srv * 1000 / hz; wrk_ms = wrk * 1000 / hz
      other = (busy - srv - wrk) * 1000 / hz; if (other < 0) other = 0
      printf "%d,%d,%s,%.2f,%d,%.3f,%.3f,%.3f,%d,%d,%.1f,%.3f,%.1f,%.1f,%.1f,%.2f,%.2f,%.1f,%s,%s\n",
        size, round, target, rps, reqs, wall, p50, p99, errs, non2xx, srv_ms, srv_ms * 1000 / reqs,
        srv_ms / 10 / wall, wrk_ms, wrk_ms / 10 / wall,
        (tt0 > 0 ? 100 * st0 / tt0 : 0), (tt1 > 0 ? 100 * st1 / tt1 : 0), other / 10 / wall, od, rd }' >>"$RAW"
  tail -n 1 "$RAW" | awk -F, '{ printf "  %-10s %7d B round %d: %9.0f req/s  p50 %6.3f ms  p99 %7.3f ms  cpu %6.2f ms/1k  srv %5.1f%%  wrk %5.1f%%  steal %.1f/%.1f%%  other %.0f%%  origin +%s  device reads %s KiB\n",
    $3, $1, $2, $4, $7, $8, $12, $13, $15, $16, $17, $18, ($19 == "" ? "-" : $19), ($20 == "" ? "?" : $20) }' >&2
}

# Before a measured run, wait_quiet (lib.sh) waits within the budget until the machine is quiet.
OTHER_MAX=${BENCH_DISK_OTHER_MAX:-15}
QUIET_SPENT=0
# A measured run, re-done (at most twice, within the budget) when other processes used more
# than OTHER_MAX % of a core during it.
measure() { # size round target
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
    # Its log window and /stats row go too (the re-done run's replace them).
    sed -i '$d' "$WINDOWS"
    [ "$3" = meshcache ] && sed -i '$d' "$MSTATS"
    QUIET_SPENT=$((QUIET_SPENT + DURATION))
  done
}

# ---------------------------------------------------------------- run
echo "size,round,target,rps,requests,wall_s,p50_ms,p99_ms,socket_errors,non2xx,server_cpu_ms,server_cpu_ms_per_1k,server_cpu_pct,wrk_cpu_ms,wrk_cpu_pct,steal_cpu0_pct,steal_cpu1_pct,other_cpu_pct,origin_requests_for_sample,device_read_kib" >"$RAW"
echo "size,target,objects,warm_s,warm_rate,disk_objects_added,first_fetch_misses_in_sample,cache_kib_on_disk" >"$WARMUP"
echo "size,round,tcp_hit,tcp_mem_hit,tcp_miss,disk_hits,disk_sendfile_bytes,requests,open_files,disk_objects,memory_objects" >"$MSTATS"
: >"$WINDOWS"
T_START=$EPOCHSECONDS
declare -A WARM_S=() DISK_ADDED=() MEASURED=()
for size in "${SIZE_LIST[@]}"; do
  n=${N_OF[$size]}
  log "size $size: $n objects ($((n * size / MIB)) MiB), $(url_of "$size" 1) .. $n"
  # The URL list for curl -K, in 4 interleaved parts.
  awk -v n="$n" -v s="$size" -v dir="$WORK" -v port="$ORIGIN_PORT" 'BEGIN {
    for (i = 1; i <= n; i++) {
      f = dir "/urls-" s "." (i % 4)
      printf "url = \"http://127.0.0.1:%d/d%d-%d?size=%d&cc=max-age%%3D3600\"\noutput = \"/dev/null\"\n", port, s, i, s >f
    }
    for (j = 0; j < 4; j++) close(dir "/urls-" s "." j) }'
  for t in "${TARGET_LIST[@]}"; do
    [ "$t" = origin ] && continue
    warm_target "$t" "$size"
    WARM_S[$t]=$WARM_SECS
    DISK_ADDED[$t]=${WARM_DISK_ADDED:-}
  done
  # Written-back now rather than during the measured runs (the pages stay in the page cache).
  log "sync (writing the caches' dirty pages back before measuring)"
  timeout 600 sync || log "sync took more than 600 s; going on"
  if has_target squid-rock; then
    rock_held "$size"
  else
    seq 1 "$n" >"$WORK/idx-$size"
  fi
  rm -f "$WORK"/urls-"$size".?
  MEASURED[$size]=$(wc -l <"$WORK/idx-$size")
  for t in "${TARGET_LIST[@]}"; do
    [ "$t" = origin ] && continue
    verify_target "$t" "$size"
    kib=$(du -sk "$WORK/$t" 2>/dev/null | awk '{ print $1 }')
    echo "$size,$t,$n,${WARM_S[$t]},$(awk -v n="$n" -v s="${WARM_S[$t]}" 'BEGIN { printf "%.0f", n / s }'),${DISK_ADDED[$t]:-},$VERIFY_MISSES,${kib:-}" >>"$WARMUP"
  done
  mapfile -t RUN_IDX < <(sample_indices "$WORK/idx-$size" "$RUN_SAMPLE" "$((size + 13))")
  # A short unrecorded run each, so every server has its connections, buffers and caches warm.
  for t in "${TARGET_LIST[@]}"; do
    DURATION_SAVE=$DURATION; DURATION=2
    run_one "$size" 0 "$t" warm
    DURATION=$DURATION_SAVE
  done
  for ((r = 1; r <= ROUNDS; r++)); do
    for t in "${TARGET_LIST[@]}"; do
      measure "$size" "$r" "$t"
    done
  done
done
T_END=$EPOCHSECONDS

# ---------------------------------------------------------------- where the hits came from
# Stop the servers (their buffered logs are written out as they exit), then count, in each
# proxy's access log, the requests that completed within each measured run's window.
log "stopping the servers"
bench_stop_pids "${STARTED[@]}"
STARTED=()
echo "size,round,target,logged,disk_hits,memory_hits,misses,other" >"$HITS"
for t in "${TARGET_LIST[@]}"; do
  case "$t" in
    origin) continue ;;
    meshcache) f="$WORK/meshcache/access.log"; kind=squid ;;
    squid-rock|squid-aufs) f="$WORK/$t/access.log"; kind=squid ;;
    nginx|nginx-ofc) f="$WORK/$t/access.log"; kind=nginx ;;
  esac
  [ -f "$f" ] || { log "$t: no access log at $f"; continue; }
  # Windows: from the run's start to 2 s after its end (requests cut off when wrk stopped).
  awk -F, -v t="$t" -v kind="$kind" '
    FNR == NR { if ($3 == t && $4 == "measure") { nw++; ws[nw] = $5; we[nw] = $6 + 2; wsize[nw] = $1; wround[nw] = $2 } next }
    {
      nf = split($0, f, " ")   # (FS is the comma of the windows file)
      if (kind == "squid") { ts = f[1] + 0; code = f[4]; sub(/\/.*/, "", code) }
      else { ts = f[nf - 1] + 0; code = f[nf] }
      for (w = 1; w <= nw; w++) if (ts >= ws[w] && ts <= we[w]) break
      if (w > nw) next
      # Only requests for the run'"'"'s objects (not, say, the next size'"'"'s warm-up within the 2 s).
      # Requests cut off as wrk stopped may have no URL logged: they count, as "other".
      if (index($0, "/d" wsize[w] "-") == 0 && index($0, "/d") > 0) next
      logged[w]++
      if (kind == "squid") {
        if (code ~ /MEM_HIT/) mem[w]++
        else if (code ~ /^TCP_(HIT|HIT_ABORTED)$/) disk[w]++
        else if (code ~ /MISS|REFRESH/) miss[w]++
        else oth[w]++
      } else {
        if (code == "HIT") disk[w]++; else if (code == "MISS" || code == "EXPIRED" || code == "UPDATING" || code == "BYPASS") miss[w]++; else oth[w]++
      }
    }
    END { for (w = 1; w <= nw; w++) printf "%d,%d,%s,%d,%d,%d,%d,%d\n", wsize[w], wround[w], t, logged[w], disk[w], mem[w], miss[w], oth[w] }
  ' "$WINDOWS" "$f" >>"$HITS"
done
cp "$WINDOWS" "$OUT/windows.csv"

# ---------------------------------------------------------------- report
CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
WRK_V=$(wrk -v 2>&1 | head -n 1 | awk '{ print $2 }' || true)
SQUID_V=$( (squid -v 2>/dev/null || true) | head -n 1 | awk '{ print $NF }')
NGINX_V=$( (nginx -v 2>&1 || true) | awk -F/ '{ print $2 }')
MESH_V=$("$BIN" --version 2>/dev/null || echo meshcache)
FSTYPE=$(stat -f -c %T "$WORK")
FSDEV=$(df -P "$WORK" | awk 'NR == 2 { print $1 }')
WS_LIST=""
for s in "${SIZE_LIST[@]}"; do
  WS_LIST="$WS_LIST${WS_LIST:+, }$(awk -v s="$s" 'BEGIN { print (s % 1024 == 0 ? s / 1024 " KiB" : s " B") }'): ${N_OF[$s]} objects, $((N_OF[$s] * s / MIB)) MiB, ${MEASURED[$s]:-?} measured ($(((${MEASURED[$s]:-0}) * s / MIB)) MiB)"
done
RATIO=$((WORKING_SET / (MEMORY_MIB * MIB)))

{
  echo "# Disk-hit benchmark: $STAMP"
  echo
  echo "- command: \`$BENCH_DISK_CMD\`"
  echo "- revision: $REV_NOTE; $MESH_V; Squid $SQUID_V; nginx $NGINX_V; wrk $WRK_V"
  echo "- meshcache binary: $BIN_NOTE"
  [ -z "$NOTE" ] || echo "- note: $NOTE"
  echo "- machine: $(nproc) CPUs, $CPU_MODEL, kernel $(uname -r); network namespace: $NETNS_USED; caches under /tmp ($FSTYPE on $FSDEV), page cache warm (every object written by the warm-up, then \`sync\`)"
  echo "- working set per size: $WS_LIST; URLs drawn uniformly at random among the measured objects, the same sequence for every server in a round$(has_target squid-rock && echo "; measured = the objects squid-rock kept (rock is direct-mapped: colliding objects overwrite each other), found by an only-if-cached pass")"
  echo "- memory tiers: meshcache store.memory $MEMORY_MIB MiB, Squid cache_mem $MEMORY_MIB MB (maximum_object_size_in_memory 32 KB); working set / memory = ${RATIO}x; nginx keeps no bodies in memory"
  echo "- disk tiers: meshcache one [[store.disk]] of $DISK_MIB MiB (open_files ${OPEN_FILES:-4096}); squid-rock \`cache_dir rock\` $ROCK_MB MB (16 KiB slots; Squid -N, so rock's Blocking I/O in the worker, no disker); squid-aufs \`cache_dir aufs\` $AUFS_MB MB 16 256; nginx proxy_cache max_size ${NGINX_MAX_MB}m, no open_file_cache${NGINX_OFC:+; nginx-ofc the same with open_file_cache max=$NGINX_OFC}"
  echo "- load: wrk -t1 -c$CONNS -d${DURATION}s --latency on core 0 (random-uri.lua: absolute-URI GETs, Cache-Control: max-age=3600); servers on core 1, one worker each (meshcache and the origin with TOKIO_WORKER_THREADS=1; Squid -N, workers 1, aufs with its I/O threads; nginx 1 worker + master + cache manager); all proxies write an access log, buffered"
  echo "- rounds: $ROUNDS interleaved rounds of [${TARGETS//,/, }] per size; medians below; the run took $((T_END - T_START)) s (warm-ups included), of which $QUIET_SPENT s waiting for other processes to go quiet or re-doing runs they disturbed (budget $QUIET_BUDGET s)"
  echo "- CPU: server CPU is utime+stime of the server's whole process tree over the run; 'ms/1k' is CPU milliseconds per 1,000 requests; 'srv %' and 'wrk %' are CPU use of one core (wrk % near 100: the row is client-bound); steal is per core (0 = wrk, 1 = server); 'other CPU' is busy time on both cores not charged to the server or wrk, in % of one core"
  echo "- hits: the origin's counts of $RUN_SAMPLE sampled URLs are compared around every proxy run ('origin reqs' = requests the origin got for them); the tables 'Where the hits came from' count each proxy's access log over the measured runs; 'device reads' is what the block device under the caches ($DISKDEV) read during a run, by any process (0: every hit came from the page cache)"
  echo "- 'client-bound': wrk used 90 % or more of its core in that row (or, in the targets table, in either row compared): the ratio is a floor set by the load generator, not the servers' capacity; compare CPU/1k there"
  echo
  awk -F, -v targets="$TARGETS" '
    function median(list,   n, a, i, j, x) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      if (n == 0) return ""
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function add(k, v) { vals[k] = (k in vals) ? vals[k] " " v : v }
    function sz(s) { return (s % 1024 == 0 ? s / 1024 " KiB" : s " B") }
    function ratio_med(s, a, b, arr,   l, r) {
      l = ""; for (r = 1; r <= maxr; r++) if (((s, r, a) in arr) && ((s, r, b) in arr) && arr[s, r, b] > 0) l = l " " arr[s, r, a] / arr[s, r, b]
      return (l == "") ? "" : median(l)
    }
    NR > 1 {
      k = $1 SUBSEP $3
      add(k SUBSEP "rps", $4); add(k SUBSEP "p50", $7); add(k SUBSEP "p99", $8); add(k SUBSEP "cpu", $12)
      add(k SUBSEP "srv", $13); add(k SUBSEP "wrk", $15); add(k SUBSEP "st0", $16); add(k SUBSEP "st1", $17)
      add(k SUBSEP "err", $9 + $10); add(k SUBSEP "oth", $18); if ($19 != "") add(k SUBSEP "od", $19)
      if ($20 != "") { add(k SUBSEP "rd", $20); if (!((k SUBSEP "rdmax") in vals) || $20 + 0 > vals[k SUBSEP "rdmax"]) vals[k SUBSEP "rdmax"] = $20 + 0 }
      rps[$1, $2, $3] = $4; cpu[$1, $2, $3] = $12
      if (!($1 in seen)) { seen[$1] = 1; sizes[++ns] = $1 }
      if ($2 > maxr) maxr = $2
    }
    function bound(s, t,   k) { k = s SUBSEP t SUBSEP "wrk"; return (k in vals) && median(vals[k]) >= 90 }
    END {
      nt = split(targets, T, ",")
      print "| size | server | req/s | p50 ms | p99 ms | CPU ms/1k req | srv CPU % | wrk CPU % | steal core0/core1 % | other CPU % | origin reqs (sample) | device reads KiB | errors |"
      print "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      for (i = 1; i <= ns; i++) for (j = 1; j <= nt; j++) {
        s = sizes[i]; t = T[j]; k = s SUBSEP t
        if (!((k SUBSEP "rps") in vals)) continue
        odmax = "-"
        if ((k SUBSEP "od") in vals) { split(vals[k SUBSEP "od"], o, " "); odmax = 0; for (x in o) if (o[x] + 0 > odmax) odmax = o[x] + 0; odmax = "max " odmax }
        w = median(vals[k SUBSEP "wrk"])
        printf "| %s | %s | %.0f | %.3f | %.3f | %.2f | %.0f | %.0f%s | %.1f / %.1f | %.0f | %s | %s | %d |\n", \
          sz(s), (t == "origin" ? "origin direct" : t), \
          median(vals[k SUBSEP "rps"]), median(vals[k SUBSEP "p50"]), median(vals[k SUBSEP "p99"]), \
          median(vals[k SUBSEP "cpu"]), median(vals[k SUBSEP "srv"]), w, (w >= 90 ? " (client-bound)" : ""), \
          median(vals[k SUBSEP "st0"]), median(vals[k SUBSEP "st1"]), median(vals[k SUBSEP "oth"]), odmax, \
          (((k SUBSEP "rdmax") in vals) ? "max " vals[k SUBSEP "rdmax"] : "-"), median(vals[k SUBSEP "err"])
      }
      # Paired ratios: meshcache / competitor within each round, median over rounds.
      nc = 0
      for (j = 1; j <= nt; j++) if (T[j] != "meshcache") C[++nc] = T[j]
      if (nc == 0) exit
      print ""
      print "Ratios (meshcache / other, per round in the same run, median over rounds):"
      print ""
      head = "| size"; rule = "| ---:"
      for (c = 1; c <= nc; c++) { head = head " | req/s vs " (C[c] == "origin" ? "origin direct" : C[c]); rule = rule " | ---:" }
      for (c = 1; c <= nc; c++) if (C[c] != "origin") { head = head " | CPU/1k vs " C[c]; rule = rule " | ---:" }
      print head " |"; print rule " |"
      for (i = 1; i <= ns; i++) {
        s = sizes[i]; line = "| " sz(s)
        for (c = 1; c <= nc; c++) { x = ratio_med(s, "meshcache", C[c], rps); R[s, C[c]] = x; line = line " | " (x == "" ? "-" : sprintf("%.2f", x)) }
        for (c = 1; c <= nc; c++) if (C[c] != "origin") { x = ratio_med(s, "meshcache", C[c], cpu); line = line " | " (x == "" ? "-" : sprintf("%.2f", x)) }
        print line " |"
      }
      # Targets of the issue, per size.
      print ""
      print "Targets (meshcache, disk hits): at least 2x the req/s of Squid (rock and aufs), at least nginx'\''s req/s, CPU/1k at most nginx'\''s:"
      print ""
      ofc = (("," targets ",") ~ /,nginx-ofc,/)
      print "| size | >= 2x squid-rock | >= 2x squid-aufs | >= nginx req/s | CPU/1k <= nginx |" (ofc ? " >= nginx-ofc req/s | CPU/1k <= nginx-ofc |" : "") " meshcache p99 ms |"
      print "| ---: | --- | --- | --- | --- |" (ofc ? " --- | --- |" : "") " ---: |"
      for (i = 1; i <= ns; i++) {
        s = sizes[i]; k = s SUBSEP "meshcache"
        if (!((k SUBSEP "rps") in vals)) continue
        cm = median(vals[k SUBSEP "cpu"])
        line = "| " sz(s)
        split("squid-rock squid-aufs", Q, " ")
        for (q = 1; q <= 2; q++) { a = ((s, Q[q]) in R) ? R[s, Q[q]] : ""; line = line " | " (a == "" ? "-" : (a >= 2 ? "met" : "NOT met") sprintf(" (%.2fx%s)", a, (bound(s, "meshcache") || bound(s, Q[q])) ? ", client-bound" : "")) }
        split("nginx nginx-ofc", G, " ")
        for (g = 1; g <= 1 + ofc; g++) {
          b = ((s, G[g]) in R) ? R[s, G[g]] : ""; kn = s SUBSEP G[g]
          cn = ((kn SUBSEP "cpu") in vals) ? median(vals[kn SUBSEP "cpu"]) : ""
          line = line " | " (b == "" ? "-" : (b >= 1 ? "met" : "NOT met") sprintf(" (%.2fx%s)", b, (bound(s, "meshcache") || bound(s, G[g])) ? ", client-bound" : ""))
          line = line " | " (cn == "" ? "-" : (cm <= cn ? "met" : "NOT met") sprintf(" (%.2f vs %.2f ms)", cm, cn))
        }
        printf "%s | %.3f |\n", line, median(vals[k SUBSEP "p99"])
      }
    }' "$RAW"
  echo
  echo "Where the hits came from (each proxy's access log, requests completed during the measured runs, all rounds; meshcache and Squid log TCP_HIT for a disk hit and TCP_MEM_HIT for a memory hit; nginx's are all from its cache files):"
  echo
  echo "| size | server | requests logged | disk hits | memory hits | misses | other |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"
  awk -F, -v targets="$TARGETS" 'NR > 1 { k = $1 SUBSEP $3; L[k] += $4; D[k] += $5; M[k] += $6; X[k] += $7; O[k] += $8
      if (!($1 in seen)) { seen[$1] = 1; sizes[++ns] = $1 } }
    END { nt = split(targets, T, ",")
      for (i = 1; i <= ns; i++) for (j = 1; j <= nt; j++) { s = sizes[i]; k = s SUBSEP T[j]; if (!(k in L)) continue
        l = (L[k] > 0 ? L[k] : 1)
        printf "| %s | %s | %d | %d (%.1f %%) | %d (%.1f %%) | %d | %d |\n", (s % 1024 == 0 ? s / 1024 " KiB" : s " B"), T[j], L[k], D[k], 100 * D[k] / l, M[k], 100 * M[k] / l, X[k], O[k] } }' "$HITS"
  if has_target meshcache; then
    echo
    echo "meshcache's /stats over the measured runs (all rounds; open files, disk and memory objects at the end of the last run):"
    echo
    echo "| size | requests | TCP_HIT (disk) | TCP_MEM_HIT | TCP_MISS | disk hits | sendfile from disk MiB | store.open_files | disk objects | memory objects |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F, 'NR > 1 { s = $1; if (!(s in seen)) { seen[s] = 1; sizes[++ns] = s }
        H[s] += $3; M[s] += $4; X[s] += $5; D[s] += $6; B[s] += $7; Q[s] += $8; OF[s] = $9; DO[s] = $10; MO[s] = $11 }
      END { for (i = 1; i <= ns; i++) { s = sizes[i]
        printf "| %s | %d | %d | %d | %d | %d | %.1f | %d | %d | %d |\n", (s % 1024 == 0 ? s / 1024 " KiB" : s " B"), Q[s], H[s], M[s], X[s], D[s], B[s] / 1048576, OF[s], DO[s], MO[s] } }' "$MSTATS"
  fi
  echo
  echo "Warm-up (every URL fetched once through each proxy; then $VERIFY_SAMPLE sampled URLs fetched twice, the second a hit; 'first-fetch misses' = sampled URLs the warm-up had not left cached):"
  echo
  echo "| size | server | objects | warm-up s | objects/s | meshcache disk objects added | first-fetch misses | cache on disk MiB (sizes so far) |"
  echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk -F, 'NR > 1 { printf "| %s | %s | %d | %.1f | %d | %s | %d | %.0f |\n", ($1 % 1024 == 0 ? $1 / 1024 " KiB" : $1 " B"), $2, $3, $4, $5, ($6 == "" ? "-" : $6), $7, $8 / 1024 }' "$WARMUP"
  echo
  echo "Raw numbers: raw.csv, hits.csv, warmup.csv, meshcache-stats.csv and results.json beside this file."
} >"$OUT/results.md"

# results.json: the metadata, every measured run, where the hits came from, the warm-ups.
csv_json() { # file -> a JSON array of objects (numbers as numbers, empty as null)
  awk -F, 'function q(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
    NR == 1 { n = split($0, H, ","); next }
    { row = ""; for (i = 1; i <= n; i++) { v = $i; if (v == "") v = "null"; else if (v !~ /^-?[0-9.]+$/) v = q(v); row = row (i > 1 ? ", " : "") q(H[i]) ": " v }
      rows = rows (rows == "" ? "" : ",\n") "    {" row "}" }
    END { printf "[\n%s\n  ]", rows }' "$1"
}
{
  q() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
  printf '{\n  "date": %s,\n  "command": %s,\n  "revision": %s,\n  "binary": %s,\n  "note": %s,\n' \
    "$(q "$STAMP")" "$(q "$BENCH_DISK_CMD")" "$(q "$REV_NOTE")" "$(q "$BIN_NOTE")" "$(q "$NOTE")"
  printf '  "meshcache": %s,\n  "squid": %s,\n  "nginx": %s,\n  "wrk": %s,\n' "$(q "$MESH_V")" "$(q "$SQUID_V")" "$(q "$NGINX_V")" "$(q "$WRK_V")"
  printf '  "machine": {"nproc": %d, "cpu": %s, "kernel": %s, "cache_fs": %s},\n' "$(nproc)" "$(q "$CPU_MODEL")" "$(q "$(uname -r)")" "$(q "$FSTYPE")"
  printf '  "config": {"duration_s": %d, "rounds": %d, "connections": %d, "wrk_threads": 1, "netns": %s, "server_core": 1, "wrk_core": 0, "working_set_bytes": %d, "memory_mib": %d, "meshcache_disk_mib": %d, "meshcache_open_files": %s, "squid_rock_mb": %d, "squid_aufs_mb": %d, "nginx_max_size_mb": %d, "nginx_open_file_cache": %s, "run_seconds": %d},\n' \
    "$DURATION" "$ROUNDS" "$CONNS" "$(q "$NETNS_USED")" "$WORKING_SET" "$MEMORY_MIB" "$DISK_MIB" "${OPEN_FILES:-1024}" "$ROCK_MB" "$AUFS_MB" "$NGINX_MAX_MB" "${NGINX_OFC:-null}" "$((T_END - T_START))"
  printf '  "objects": {'
  first=1
  for s in "${SIZE_LIST[@]}"; do printf '%s"%s": {"warmed": %d, "measured": %d}' "$([ $first = 1 ] || echo ', ')" "$s" "${N_OF[$s]}" "${MEASURED[$s]:-0}"; first=0; done
  printf '},\n'
  printf '  "runs": %s,\n' "$(csv_json "$RAW")"
  printf '  "hit_sources": %s,\n' "$(csv_json "$HITS")"
  printf '  "meshcache_stats": %s,\n' "$(csv_json "$MSTATS")"
  printf '  "warmup": %s\n}\n' "$(csv_json "$WARMUP")"
} >"$OUT/results.json"

cat "$OUT/results.md"
log "results in $OUT"
