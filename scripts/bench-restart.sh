#!/usr/bin/env bash
# Restart benchmark: how long meshcache and Squid 5.7 (cache_dir rock, and aufs) take after a
# restart to index a disk of many small objects and serve them as hits, and how much RAM each
# disk-resident object costs, in one run, one server at a time, on this machine.
#
# For each target: start the server on an empty cache (pinned to core 1) and measure its
# resident memory once its (empty) rebuild is done; fill it with OBJECTS distinct small objects
# through the proxy (`meshcache lab load` replaying a trace of distinct URLs, on core 0), replay
# the trace again (meshcache: at most --refill-passes times) while its own count says objects are
# missing; let its disk writes drain; pick a random sample of URLs the server holds (asked with
# `Cache-Control: only-if-cached`, which never reaches the origin); stop it cleanly (SIGTERM);
# start it again and time (a) until its rebuild is complete (meshcache: /stats
# store.disks[0].rebuilding false; Squid: the cache_dir's process logs "Finished rebuilding
# storage from disk" in cache.log), polled every 50 ms, beside the server's own figure
# (meshcache's rebuild_us, Squid's "Took N seconds"), and (b) until the whole sample has been
# served as hits (X-Cache HIT, and the origin's per-URL counter unchanged for every sampled URL).
# While the rebuild runs, probe URLs (stored, outside the sample) are requested every 0.5 s
# (every 2 s after the 20th), to see whether the server answers hits before its rebuild ends.
# Resident memory: VmRSS (/proc/PID/status), Pss and Pss_Anon + Pss_Shmem (smaps_rollup), each
# summed over the server's process tree (Squid runs a master, a worker, and for rock a disker
# and a coordinator, sharing memory segments: VmRSS counts a shared page once per process, Pss
# once in all), taken as soon as the rebuild is complete, on the filled cache and on the empty
# one; RAM per disk object = (full - empty) / objects the server indexed. The restart is a
# process restart, not a reboot: the cache files are in the page cache.
#
# Usage: scripts/bench-restart.sh [options]
#   --objects N          distinct objects to store (default 1000000)
#   --size BYTES         body size of each object (default 1024)
#   --targets LIST       subset of meshcache,squid-rock,squid-aufs (default all three)
#   --sample N           stored URLs checked as hits after the restart (default 1000)
#   --clients N          concurrent clients filling the cache (default 32)
#   --refill-passes N    meshcache: replays of the fill while it holds fewer objects than
#                        were requested (its disk writes are dropped when its queue is full)
#                        (default 2; 0: never)
#   --squid-refill-passes N  the same for Squid (default 0: Squid rock keeps one object per
#                        hash of its key in its map, and a worker's store entries need a slot of
#                        a shared table of in-flight entries: the objects it lost that way are
#                        lost again, or others with them, when fetched again)
#   --disk-mib N         the disk's size: meshcache's [[store.disk]] size and Squid's
#                        cache_dir size, MiB (default 4096)
#   --rebuild-timeout S  the longest a rebuild may take (default 600)
#   --work-dir DIR       where the caches are made (default /tmp; needs about 4 KB per object
#                        free, plus 1 GiB)
#   --keep               keep the caches (in the work directory; its path is printed)
#   --out DIR            results directory (default target/bench-restart/<UTC timestamp>)
#   --bin PATH           meshcache binary (default: build target/release/meshcache)
#   --no-build           do not run cargo build (use the existing binary)
#   --no-netns           do not run inside `unshare -n`
#   --port-base N        ports N..N+3 on 127.0.0.1 (default 18080)
#   --seed N             seed of the sample and probe choice (default 1)
#   --note TEXT          a line added to the results' header
#   --quiet-budget S     seconds (default 120) this run may spend waiting for other processes'
#                        CPU use to drop (below 15% of a core) before each restart; 0 disables
# Defaults (1,000,000 objects, three targets) take about 15 minutes on a quiet 2-core machine
# (at most about 30 with meshcache refill passes and the quiet budget), most of it filling the
# caches at 5,000-25,000 requests/s; disk: about 4 KB per object at a time (each target's cache
# is removed before the next). --objects 50000 takes about 1-2 minutes.
# Installs squid, curl, jq when missing (apt).
# Output: a Markdown table on stdout and in OUT/results.md; OUT/results.json; the generated
# configs, the servers' logs and each phase's raw figures in OUT/.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR="$REPO/scripts/bench"
ORIG_ARGS=("$@")
# The command as the user typed it (kept across the re-run inside the network namespace).
: "${BENCH_RESTART_CMD:=scripts/bench-restart.sh${*:+ $*}}"
export BENCH_RESTART_CMD

OBJECTS=1000000
SIZE=1024
TARGETS=meshcache,squid-rock,squid-aufs
SAMPLE=1000
CLIENTS=32
REFILLS=2
SQUID_REFILLS=0
DISK_MIB=4096
REBUILD_TIMEOUT=600
WORK_PARENT=/tmp
KEEP=0
OUT=""
BIN=""
BUILD=1
NETNS=1
PORT_BASE=18080
SEED=1
NOTE=""
QUIET_BUDGET=120
PROBES=60          # probe URLs, at most one per probe time
SAMPLE_CLIENTS=8   # concurrent clients of the sample check

BENCH_TAG=bench-restart
# shellcheck source=bench/lib.sh
. "$BENCH_DIR/lib.sh"

while [ $# -gt 0 ]; do
  case "$1" in
    --objects) OBJECTS=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --targets) TARGETS=$2; shift 2 ;;
    --sample) SAMPLE=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --refill-passes) REFILLS=$2; shift 2 ;;
    --squid-refill-passes) SQUID_REFILLS=$2; shift 2 ;;
    --disk-mib) DISK_MIB=$2; shift 2 ;;
    --rebuild-timeout) REBUILD_TIMEOUT=$2; shift 2 ;;
    --work-dir) WORK_PARENT=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; BUILD=0; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-netns) NETNS=0; shift ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --note) NOTE=$2; shift 2 ;;
    --quiet-budget) QUIET_BUDGET=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
num() { [[ $1 =~ ^[0-9]+$ ]]; }
num "$OBJECTS" && [ "$OBJECTS" -ge 1000 ] && [ "$OBJECTS" -le 20000000 ] || die "--objects: 1000..20000000"
num "$SIZE" && [ "$SIZE" -ge 1 ] && [ "$SIZE" -le 30000 ] || die "--size: 1..30000 bytes (small objects: meshcache's slab takes bodies under 32 KiB)"
num "$SAMPLE" && [ "$SAMPLE" -ge 10 ] && [ "$SAMPLE" -le 100000 ] || die "--sample: 10..100000"
[ $((SAMPLE * 2 + PROBES)) -le "$OBJECTS" ] || die "--sample: at most (objects - $PROBES) / 2"
num "$CLIENTS" && [ "$CLIENTS" -ge 1 ] && [ "$CLIENTS" -le 1000 ] || die "--clients: 1..1000"
num "$REFILLS" && [ "$REFILLS" -le 5 ] || die "--refill-passes: 0..5"
num "$SQUID_REFILLS" && [ "$SQUID_REFILLS" -le 5 ] || die "--squid-refill-passes: 0..5"
num "$DISK_MIB" && [ "$DISK_MIB" -ge 64 ] || die "--disk-mib: at least 64"
num "$REBUILD_TIMEOUT" && [ "$REBUILD_TIMEOUT" -ge 10 ] && [ "$REBUILD_TIMEOUT" -le 3600 ] || die "--rebuild-timeout: 10..3600 s"
num "$QUIET_BUDGET" || die "--quiet-budget: seconds"
num "$SEED" || die "--seed: a number"
num "$PORT_BASE" || die "--port-base: a number"
IFS=, read -r -a TARGET_LIST <<<"$TARGETS"
for t in "${TARGET_LIST[@]}"; do
  case "$t" in meshcache|squid-rock|squid-aufs) ;; *) die "--targets: unknown target $t" ;; esac
done
has_target() { [[ ",$TARGETS," == *",$1,"* ]]; }

# ---------------------------------------------------------------- install, build (outside netns)
if [ -z "${BENCH_RESTART_IN_NETNS:-}" ]; then
  declare -A need=([curl]=curl [jq]=jq [taskset]=util-linux [ip]=iproute2 [timeout]=coreutils [shuf]=coreutils)
  if has_target squid-rock || has_target squid-aufs; then need[squid]=squid; fi
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
[ -n "${BENCH_RESTART_REV:-}" ] || BENCH_RESTART_REV=$(bench_revision "$REPO")
export BENCH_RESTART_REV
: "${BENCH_RESTART_BIN_NOTE:=$(bench_binary_note "$BIN")}"
export BENCH_RESTART_BIN_NOTE

if [ "$NETNS" = 1 ]; then
  bench_enter_netns BENCH_RESTART_IN_NETNS "${BASH_SOURCE[0]}" "${ORIG_ARGS[@]}" --no-build --bin "$BIN"
fi
NETNS_USED=no
if [ -n "${BENCH_RESTART_IN_NETNS:-}" ]; then
  ip link set lo up
  NETNS_USED=yes
fi

# ---------------------------------------------------------------- setup
ORIGIN_PORT=$PORT_BASE
MESHCACHE_PORT=$((PORT_BASE + 1))
MESHCACHE_ADMIN_PORT=$((PORT_BASE + 2))
SQUID_PORT=$((PORT_BASE + 3))
for p in $ORIGIN_PORT $MESHCACHE_PORT $MESHCACHE_ADMIN_PORT $SQUID_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "port $p is in use (try --port-base)"; fi
done
ORIGIN="http://127.0.0.1:$ORIGIN_PORT"

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ -n "$OUT" ] || OUT="$REPO/target/bench-restart/$STAMP"
mkdir -p "$OUT/logs" "$OUT/conf"
OUT=$(cd "$OUT" && pwd)
[ -d "$WORK_PARENT" ] || die "--work-dir: $WORK_PARENT is not a directory"
WORK=$(mktemp -d "$WORK_PARENT/bench-restart.XXXXXX")
chmod 755 "$WORK"
CLK_TCK=$(getconf CLK_TCK)
ulimit -n 65536 2>/dev/null || ulimit -n 8192 2>/dev/null || true
# Free space: meshcache's slab about 1.6 KB per 1 KiB object, rock one 2 KiB slot, aufs a 4 KiB
# block and an inode; each target's cache is removed before the next one starts.
NEED_KB=$((OBJECTS * (SIZE + 3072) / 1024 + 1048576))
AVAIL_KB=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }')
[ "$AVAIL_KB" -ge "$NEED_KB" ] || die "$WORK: $((AVAIL_KB / 1024)) MiB free, need about $((NEED_KB / 1024)) MiB (try --work-dir)"
# Squid's service name: its shared memory segments (/dev/shm/NAME-*) and IPC sockets carry
# it, so that this Squid does not meet another one running on the machine.
SQUID_SVC="benchrestart$$"
SQUID_USER_LINE=""
if [ "$(id -u)" = 0 ] && id proxy >/dev/null 2>&1; then SQUID_USER_LINE="cache_effective_user proxy"; fi

STARTED=()   # PIDs this script started and has not stopped yet
SRV_PID=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ ${#STARTED[@]} = 0 ] || bench_stop_pids "${STARTED[@]}"
  rm -f /dev/shm/"$SQUID_SVC"-* /var/run/squid/"$SQUID_SVC"-*.ipc 2>/dev/null || true
  if [ -d "$WORK" ]; then
    cp "$WORK"/*.log "$OUT/logs/" 2>/dev/null || true
    if [ "$KEEP" = 1 ]; then log "caches kept in $WORK"; else rm -rf "$WORK"; fi
  fi
  exit $rc
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

forget_pid() { # pid: no longer ours to stop
  local p keep=()
  for p in "${STARTED[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  STARTED=("${keep[@]}")
}

NOW=0
now_us() { NOW=${EPOCHREALTIME/./}; }   # microseconds since the epoch, without a fork
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b - a) / 1e6 }'; } # from_us to_us -> seconds

url_of() { echo "$ORIGIN/r-$1?size=$SIZE&cc=max-age%3D86400"; }

# The fill: every object once, in order of index, spread over CLIENTS closed-loop clients.
TRACE="$WORK/fill.trace"
awk -v n="$OBJECTS" -v c="$CLIENTS" -v size="$SIZE" -v base="$ORIGIN" 'BEGIN {
  print "# meshcache trace v1"
  for (i = 0; i < n; i++) printf "0 %d %d %s/r-%d?size=%d&cc=max-age%%3D86400\n", i % c, size, base, i, size }' >"$TRACE"
# A seeded permutation of the indexes: the first PROBES are the probe URLs, the rest candidates
# for the sample (the first SAMPLE of them the server holds).
shuf -i "0-$((OBJECTS - 1))" --random-source=<(yes "$SEED") >"$WORK/order.idx"
head -n "$PROBES" "$WORK/order.idx" >"$WORK/probes.idx"
tail -n +"$((PROBES + 1))" "$WORK/order.idx" >"$WORK/candidates.idx"

log "origin on 127.0.0.1:$ORIGIN_PORT (core 0); $OBJECTS objects of $SIZE bytes; work directory $WORK"
taskset -c 0 env TOKIO_WORKER_THREADS=1 MESHCACHE_LOG=warn "$BIN" lab origin --listen "127.0.0.1:$ORIGIN_PORT" >"$WORK/origin.log" 2>&1 &
ORIGIN_PID=$!
STARTED+=("$ORIGIN_PID")

wait_port() { # port pid seconds -> 0 when listening
  local i
  for ((i = 0; i < $3 * 100; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.01
  done
  return 1
}
wait_port "$ORIGIN_PORT" "$ORIGIN_PID" 10 || die "the origin emulator did not start (log: $WORK/origin.log)"

# ---------------------------------------------------------------- per-server helpers
# Set by target_setup: T (target), DIR, CONF, PORT, NAME (in X-Cache), KIND (meshcache|squid).
T="" DIR="" CONF="" PORT="" NAME="" KIND="" CLOG="" CLOG_OFF=0 SQUID_KID=""

target_setup() { # target
  T=$1
  DIR="$WORK/$T"
  mkdir -p "$DIR"
  case "$T" in
    meshcache)
      KIND=meshcache PORT=$MESHCACHE_PORT NAME=bench CONF="$DIR/meshcache.toml"
      sed -e "s|@DIR@|$DIR|g" -e "s|@DISK_MIB@|$DISK_MIB|g" -e "s|@MESHCACHE_PORT@|$MESHCACHE_PORT|g" \
        -e "s|@MESHCACHE_ADMIN_PORT@|$MESHCACHE_ADMIN_PORT|g" "$BENCH_DIR/meshcache-restart.toml.in" >"$CONF"
      "$BIN" config check "$CONF" >"$WORK/$T-check.log" 2>&1 || { cat "$WORK/$T-check.log" >&2; die "$T: $CONF does not check"; }
      ;;
    squid-rock|squid-aufs)
      KIND=squid PORT=$SQUID_PORT NAME=bench-squid CONF="$DIR/squid.conf"
      mkdir -p "$DIR/squid"
      [ -z "$SQUID_USER_LINE" ] || chown proxy: "$DIR/squid"
      local line
      if [ "$T" = squid-rock ]; then line="cache_dir rock $DIR/squid/rock $DISK_MIB slot-size=2048"
      else line="cache_dir aufs $DIR/squid/aufs $DISK_MIB 16 256"; fi
      sed -e "s|@CACHE_DIR_LINE@|$line|" -e "s|@DIR@|$DIR|g" -e "s|@SQUID_PORT@|$SQUID_PORT|g" \
        -e "s|@SQUID_USER_LINE@|$SQUID_USER_LINE|g" "$BENCH_DIR/squid-restart.conf.in" >"$CONF"
      CLOG="$DIR/squid/cache.log"
      squid -n "$SQUID_SVC" -k parse -f "$CONF" >"$WORK/$T-parse.log" 2>&1 || { cat "$WORK/$T-parse.log" >&2; die "$T: squid.conf does not parse"; }
      timeout -k 5 300 squid -n "$SQUID_SVC" -z -N -f "$CONF" >"$WORK/$T-z.log" 2>&1 || { cat "$WORK/$T-z.log" >&2; die "$T: squid -z failed"; }
      ;;
  esac
  cp "$CONF" "$OUT/conf/$T.${CONF##*.}"
}

T0=0
start_server() { # phase: starts the target pinned to core 1, sets SRV_PID and T0
  local phase=$1
  [ "$KIND" != squid ] || { CLOG_OFF=$(stat -c %s "$CLOG" 2>/dev/null || echo 0); SQUID_KID=""; }
  now_us; T0=$NOW
  if [ "$KIND" = meshcache ]; then
    taskset -c 1 env TOKIO_WORKER_THREADS=1 MESHCACHE_LOG=info "$BIN" run -c "$CONF" >>"$WORK/$T.log" 2>&1 &
  else
    taskset -c 1 squid -n "$SQUID_SVC" --foreground -f "$CONF" >>"$WORK/$T.log" 2>&1 &
  fi
  SRV_PID=$!
  STARTED+=("$SRV_PID")
  echo "---- $phase: started pid $SRV_PID at $(date -u +%H:%M:%S)" >>"$WORK/$T.log"
}

stop_server() { # seconds -> sets STOP_S (time to exit) and STOP_HOW
  local i t1
  now_us; t1=$NOW
  kill -TERM "$SRV_PID" 2>/dev/null || true
  STOP_HOW=SIGTERM
  for ((i = 0; i < $1 * 10; i++)); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SRV_PID" 2>/dev/null; then
    log "$T: still running $1 s after SIGTERM: SIGKILL"
    kill -KILL "$SRV_PID" 2>/dev/null || true
    STOP_HOW="SIGKILL after $1 s"
  fi
  wait "$SRV_PID" 2>/dev/null || true
  now_us; STOP_S=$(secs "$t1" "$NOW")
  forget_pid "$SRV_PID"
  # Squid's kids are gone with its master; make sure (they are ours).
  SRV_PID=""
}

mesh_stats() { curl -s --noproxy '*' --max-time 5 "http://127.0.0.1:$MESHCACHE_ADMIN_PORT/stats"; }

# Rebuild state: sets RB_DONE (0/1), RB_OWN_S (the server's own figure, s), RB_FOUND (objects
# the rebuild found / loaded), RB_SCANNED (Squid: entries scanned).
RB_DONE=0 RB_OWN_S="" RB_FOUND="" RB_SCANNED=""
poll_rebuild() {
  RB_DONE=0
  if [ "$KIND" = meshcache ]; then
    local s
    s=$(mesh_stats 2>/dev/null | jq -r '.store.disks[0] | "\(.rebuilding) \(.rebuild_us) \(.rebuild_found)"' 2>/dev/null) || return 0
    local rebuilding us found
    read -r rebuilding us found <<<"$s"
    if [ "$rebuilding" = false ] && [ "${us:-0}" -gt 0 ] 2>/dev/null; then
      RB_DONE=1
      RB_OWN_S=$(awk -v u="$us" 'BEGIN { printf "%.3f", u / 1e6 }')
      RB_FOUND=$found
    fi
  else
    local text
    text=$(tail -c +"$((CLOG_OFF + 1))" "$CLOG" 2>/dev/null) || return 0
    if [ -z "$SQUID_KID" ]; then
      # The process that loads the cache_dir: the disker (rock) or the worker (aufs).
      SQUID_KID=$(awk 'match($0, /kid[0-9]+\| (Loading cache_dir #0 from|Rebuilding storage in)/) { s = substr($0, RSTART); sub(/\|.*/, "", s); print s; exit }' <<<"$text")
      [ -n "$SQUID_KID" ] || return 0
    fi
    grep -q "$SQUID_KID| *Took [0-9.]* seconds" <<<"$text" || return 0
    RB_DONE=1
    # "kid2|   Took 8.49 seconds (222.13 objects/sec)." and the counts above it, of that process.
    RB_OWN_S=$(awk -v k="$SQUID_KID|" 'index($0, k) && $0 ~ /\| *Took [0-9.]+ seconds/ { for (i = 1; i < NF; i++) if ($i == "Took") { print $(i + 1); exit } }' <<<"$text")
    RB_FOUND=$(awk -v k="$SQUID_KID|" 'index($0, k) && / Objects loaded\./ { print $(NF - 2); exit }' <<<"$text")
    RB_SCANNED=$(awk -v k="$SQUID_KID|" 'index($0, k) && / Entries scanned/ { print $(NF - 2); exit }' <<<"$text")
  fi
}

# The server's count of objects on its disk.
stored_count() {
  if [ "$KIND" = meshcache ]; then
    mesh_stats | jq -r '.store.disks[0].objects' || true
  elif [ "$T" = squid-rock ]; then
    curl -s --noproxy '*' --max-time 10 "http://127.0.0.1:$SQUID_PORT/squid-internal-mgr/storedir" |
      awk '/^Current entries:/ { s += $3; seen = 1 } END { print seen ? s : "" }' || true
  else
    curl -s --noproxy '*' --max-time 10 "http://127.0.0.1:$SQUID_PORT/squid-internal-mgr/info" |
      awk '/on-disk objects/ { print $1; exit }' || true
  fi
}

# The server's process tree (the server and its live descendants).
tree_pids() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$1" '
    { n = split($0, part, "[)] "); split(part[n], f, " "); par[$1] = f[2] }
    END { tree[root] = 1; grew = 1
          while (grew) { grew = 0; for (p in par) if (!(p in tree) && (par[p] in tree)) { tree[p] = 1; grew = 1 } }
          for (p in tree) if (p in par) print p }'
}
# Resident memory of the tree, KiB: sets MEM_RSS (VmRSS summed), MEM_PSS, MEM_ANON (Pss_Anon +
# Pss_Shmem), MEM_N (processes).
mem_tree() {
  local p r a b c
  MEM_RSS=0 MEM_PSS=0 MEM_ANON=0 MEM_N=0
  for p in $(tree_pids "$SRV_PID"); do
    r=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null) || continue
    [ -n "$r" ] || continue
    # a: Pss, b: Pss_Anon, c: Pss_Shmem
    read -r a b c < <(awk '/^Pss:/ { p = $2 } /^Pss_Anon:/ { a = $2 } /^Pss_Shmem:/ { s = $2 } END { print p + 0, a + 0, s + 0 }' "/proc/$p/smaps_rollup" 2>/dev/null || echo "0 0 0")
    MEM_RSS=$((MEM_RSS + r)) MEM_PSS=$((MEM_PSS + a)) MEM_ANON=$((MEM_ANON + b + c)) MEM_N=$((MEM_N + 1))
  done
}

# One probe through the proxy: prints HIT or MISS (or ERR).
probe() { # url
  local xc
  xc=$(curl -s --noproxy '' -x "http://127.0.0.1:$PORT" --max-time 3 -o /dev/null -w '%header{x-cache}' "$1" 2>/dev/null) || { echo ERR; return; }
  case "$xc" in "HIT from $NAME"*) echo HIT ;; MISS*|"") echo MISS ;; *) echo "OTHER($xc)" ;; esac
}

# After a start: time to listen, to the end of the rebuild (polled every 50 ms), with probes
# of PROBE_BASE URLs while it runs. Sets LISTEN_S, REBUILT_S, CPU_S (the tree's CPU until the
# rebuild was done), PROBE_LINE, FIRST_HIT_S; appends the probes to $OUT/probes-$T.csv.
observe_start() { # phase probe-kind(fill|empty)
  local phase=$1 pkind=$2 deadline next_probe n_probe=0 hits=0 r url i t_ms
  wait_port "$PORT" "$SRV_PID" 60 || die "$T ($phase): did not listen on $PORT within 60 s (log: $OUT/logs/$T.log)"
  now_us; LISTEN_S=$(secs "$T0" "$NOW")
  deadline=$((T0 + REBUILD_TIMEOUT * 1000000))
  next_probe=$NOW
  FIRST_HIT_S=""
  mapfile -t PROBE_IDX <"$WORK/probes.idx"
  for ((i = 0; i < REBUILD_TIMEOUT * 40; i++)); do
    poll_rebuild
    now_us
    [ "$RB_DONE" = 1 ] && break
    [ "$NOW" -lt "$deadline" ] || die "$T ($phase): rebuild not done after $REBUILD_TIMEOUT s"
    kill -0 "$SRV_PID" 2>/dev/null || die "$T ($phase): exited during its rebuild (log: $OUT/logs/$T.log)"
    if [ "$NOW" -ge "$next_probe" ] && [ "$n_probe" -lt "$PROBES" ]; then
      if [ "$pkind" = fill ]; then url=$(url_of "${PROBE_IDX[$n_probe]}"); else url="$ORIGIN/e-$n_probe?size=$SIZE&cc=no-store"; fi
      r=$(probe "$url")
      t_ms=$(( (NOW - T0) / 1000 ))
      echo "$T,$phase,$n_probe,$t_ms,$r" >>"$OUT/probes.csv"
      n_probe=$((n_probe + 1))
      if [ "$r" = HIT ]; then hits=$((hits + 1)); [ -n "$FIRST_HIT_S" ] || FIRST_HIT_S=$(awk -v m="$t_ms" 'BEGIN { printf "%.3f", m / 1000 }'); fi
      next_probe=$((NOW + (n_probe < 20 ? 500000 : 2000000)))
      continue
    fi
    sleep 0.05
  done
  REBUILT_S=$(secs "$T0" "$NOW")
  CPU_S=$(awk -v t="$(tree_ticks "$SRV_PID")" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }')
  PROBE_LINE="$hits of $n_probe"
  log "$T ($phase): listening after ${LISTEN_S} s, rebuild done after ${REBUILT_S} s (own figure ${RB_OWN_S} s, ${RB_FOUND} objects); probes during the rebuild: $PROBE_LINE hits"
}

# Replays the fill trace through the proxy; sets FILL_* from lab load's report.
fill_pass() { # pass-number
  local out="$OUT/fill-$T-$1.json" t1 tmo
  tmo=$((OBJECTS / 300 + 300))
  now_us; t1=$NOW
  if ! taskset -c 0 timeout -k 5 "$tmo" env TOKIO_WORKER_THREADS=1 MESHCACHE_LOG=warn "$BIN" lab load --trace "$TRACE" \
      --proxy "127.0.0.1:$PORT" --name "$NAME" --timeout 30s --json >"$out" 2>>"$WORK/$T-load.log"; then
    log "$T: fill pass $1 failed or took over $tmo s (log: $OUT/logs/$T-load.log)"
  fi
  now_us
  FILL_S=$(secs "$t1" "$NOW")
  FILL_RPS=$(jq -r '.req_per_s // 0 | floor' "$out" 2>/dev/null || echo 0)
  FILL_MISS=$(jq -r '.outcomes.miss // 0' "$out" 2>/dev/null || echo 0)
  FILL_HIT=$(jq -r '.outcomes.local_hit // 0' "$out" 2>/dev/null || echo 0)
  FILL_ERR=$(jq -r '[.errors[]?] | add // 0' "$out" 2>/dev/null || echo 0)
  log "$T: fill pass $1: ${FILL_S} s, ${FILL_RPS} req/s, $FILL_MISS misses, $FILL_HIT hits, $FILL_ERR errors"
}

# Waits until the server's disk writes have landed: meshcache's queue and pending writes at 0;
# Squid's count steady for a second. Sets STORED.
drain() {
  local i s prev=""
  for ((i = 0; i < 600; i++)); do
    if [ "$KIND" = meshcache ]; then
      s=$(mesh_stats | jq -r '.store.disks[0] | "\(.queue_jobs) \(.pending) \(.objects)"') || s=""
      read -r q p STORED <<<"$s"
      [ "$q" = 0 ] && [ "$p" = 0 ] && return 0
    else
      STORED=$(stored_count)
      [ -n "$STORED" ] && [ "$STORED" = "$prev" ] && return 0
      prev=$STORED
    fi
    sleep 0.5
  done
  log "$T: disk writes still pending after 300 s"
}

# Curl config for a list of indexes (one URL each, body discarded).
curl_cfg() { # file-of-indexes
  awk -v base="$ORIGIN" -v size="$SIZE" '{ printf "url = \"%s/r-%d?size=%d&cc=max-age%%3D86400\"\noutput = \"/dev/null\"\n", base, $1, size }' "$1"
}
# The origin's count for each URL (each call adds 1: this request).
origin_counts() { # file-of-indexes
  curl_cfg "$1" >"$WORK/counts.cfg"
  taskset -c 0 curl -s --noproxy '*' --max-time 600 -K "$WORK/counts.cfg" -w '%header{x-origin-count}\n' || log "$T: some origin count requests failed"
}

# The sample: the first SAMPLE candidates the server holds (only-if-cached: a 504 for an object
# it does not hold, without asking the origin).
select_sample() {
  local off=0 batch=$((SAMPLE * 3 / 2 + 100)) got=0 tries
  : >"$WORK/sample.idx"
  for ((tries = 0; tries < 20 && got < SAMPLE; tries++)); do
    sed -n "$((off + 1)),$((off + batch))p" "$WORK/candidates.idx" >"$WORK/batch.idx"
    [ -s "$WORK/batch.idx" ] || break
    off=$((off + batch))
    curl_cfg "$WORK/batch.idx" >"$WORK/batch.cfg"
    taskset -c 0 curl -s --noproxy '' -x "http://127.0.0.1:$PORT" -H 'Cache-Control: only-if-cached' --max-time 600 \
      -K "$WORK/batch.cfg" -w '%{http_code}\n' >"$WORK/batch.codes" || true
    paste -d' ' "$WORK/batch.idx" "$WORK/batch.codes" | awk '$2 == 200 { print $1 }' >>"$WORK/sample.idx"
    got=$(wc -l <"$WORK/sample.idx")
  done
  SAMPLE_TRIED=$off
  head -n "$SAMPLE" "$WORK/sample.idx" >"$WORK/sample.tmp" && mv "$WORK/sample.tmp" "$WORK/sample.idx"
  SAMPLE_N=$(wc -l <"$WORK/sample.idx")
  [ "$SAMPLE_N" -gt 0 ] || die "$T: holds none of the URLs tried (only-if-cached)"
  awk -v base="$ORIGIN" -v size="$SIZE" -v c="$SAMPLE_CLIENTS" 'BEGIN { print "# meshcache trace v1" }
    { printf "0 %d %d %s/r-%d?size=%d&cc=max-age%%3D86400\n", (NR - 1) % c, size, base, $1, size }' "$WORK/sample.idx" >"$WORK/sample.trace"
}

declare -A R=()   # results: R[target,key]=value
put() { R[$T,$1]=$2; }

# ---------------------------------------------------------------- one target
OTHER_MAX=${BENCH_RESTART_OTHER_MAX:-15}
QUIET_SPENT=0
echo "target,phase,probe,ms_after_start,result" >"$OUT/probes.csv"

run_target() { # target
  target_setup "$1"
  log "==== $T"

  # 1. Empty cache: memory once its (empty) rebuild is done.
  wait_quiet
  start_server empty
  observe_start empty empty
  mem_tree
  put empty_rss_kb "$MEM_RSS"; put empty_pss_kb "$MEM_PSS"; put empty_anon_kb "$MEM_ANON"; put procs "$MEM_N"
  put empty_rebuilt_s "$REBUILT_S"; put empty_own_s "$RB_OWN_S"
  log "$T (empty): VmRSS $MEM_RSS KiB, Pss $MEM_PSS KiB, anon+shm $MEM_ANON KiB ($MEM_N processes)"
  if [ "$KIND" = squid ]; then
    put shm_mib "$(du -cm /dev/shm/"$SQUID_SVC"-* 2>/dev/null | awk 'END { print $1 + 0 }')"
  fi

  # 2. Fill (same process), refill while objects are missing, drain.
  fill_pass 1
  put fill_s "$FILL_S"; put fill_rps "$FILL_RPS"; put fill_miss "$FILL_MISS"; put fill_err "$FILL_ERR"
  drain
  put stored_after_fill "$STORED"
  local pass=1 max_refills=$REFILLS
  [ "$KIND" = meshcache ] || max_refills=$SQUID_REFILLS
  while [ "${STORED:-0}" -lt "$OBJECTS" ] && [ "$pass" -le "$max_refills" ]; do
    log "$T: holds $STORED of $OBJECTS objects: replaying the fill"
    pass=$((pass + 1))
    fill_pass "$pass"
    drain
  done
  put refills "$((pass - 1))"; put refill_miss "$([ $pass -gt 1 ] && echo "$FILL_MISS" || echo 0)"
  if [ "$KIND" = meshcache ]; then
    local d
    d=$(mesh_stats | jq -c '.store.disks[0] | {writes, dropped, objects, faults}') || d='{}'
    put disk_writes "$(jq -r .writes <<<"$d")"; put disk_dropped "$(jq -r .dropped <<<"$d")"
    log "$T: disk after the fill: $d"
  fi
  STORED=$(stored_count)
  put stored_before_stop "$STORED"
  log "$T: holds $STORED objects before the restart"

  # 3. The sample, and the origin's counts for it.
  select_sample
  put sample_n "$SAMPLE_N"; put sample_tried "$SAMPLE_TRIED"
  origin_counts "$WORK/sample.idx" >"$WORK/counts.before"

  # 4. Stop, restart.
  stop_server $([ "$KIND" = meshcache ] && echo 300 || echo 120)
  put stop_s "$STOP_S"; put stop_how "$STOP_HOW"
  log "$T: stopped ($STOP_HOW) in $STOP_S s"
  wait_quiet
  start_server restart
  observe_start restart fill
  mem_tree
  put listen_s "$LISTEN_S"; put rebuilt_s "$REBUILT_S"; put own_s "$RB_OWN_S"; put found "$RB_FOUND"
  put scanned "$RB_SCANNED"; put rebuild_cpu_s "$CPU_S"; put probes "$PROBE_LINE"; put first_probe_hit_s "$FIRST_HIT_S"
  put full_rss_kb "$MEM_RSS"; put full_pss_kb "$MEM_PSS"; put full_anon_kb "$MEM_ANON"
  log "$T (restarted): VmRSS $MEM_RSS KiB, Pss $MEM_PSS KiB, anon+shm $MEM_ANON KiB ($MEM_N processes)"

  # 5. The sample served as hits.
  local out="$OUT/sample-$T.json"
  taskset -c 0 timeout -k 5 300 env TOKIO_WORKER_THREADS=1 MESHCACHE_LOG=warn "$BIN" lab load --trace "$WORK/sample.trace" \
    --proxy "127.0.0.1:$PORT" --name "$NAME" --timeout 30s --json >"$out" 2>>"$WORK/$T-load.log" || log "$T: the sample check failed"
  now_us
  put sample_done_s "$(secs "$T0" "$NOW")"
  put sample_hits "$(jq -r '.outcomes.local_hit // 0' "$out" 2>/dev/null || echo 0)"
  put sample_err "$(jq -r '[.errors[]?] | add // 0' "$out" 2>/dev/null || echo 0)"
  origin_counts "$WORK/sample.idx" >"$WORK/counts.after"
  paste -d' ' "$WORK/sample.idx" "$WORK/counts.before" "$WORK/counts.after" | awk '$3 != $2 + 1 { print $1 }' >"$OUT/sample-missed-$T.idx"
  put origin_moved "$(wc -l <"$OUT/sample-missed-$T.idx")"
  put indexed_after "$(stored_count)"
  mem_tree
  put sample_rss_kb "$MEM_RSS"
  if [ "$KIND" = meshcache ]; then
    mesh_stats >"$OUT/stats-$T-restarted.json"
    put damaged "$(jq -r '.store.disks[0].rebuild_damaged' "$OUT/stats-$T-restarted.json")"
    put disk_hits "$(jq -r '.requests_by_result.TCP_HIT' "$OUT/stats-$T-restarted.json")"
  fi
  log "$T: sample: ${R[$T,sample_hits]} of $SAMPLE_N served as hits, all done ${R[$T,sample_done_s]} s after the start; origin counter moved for ${R[$T,origin_moved]} of them"
  stop_server 120
  if [ "$KIND" = squid ]; then cp "$CLOG" "$OUT/logs/$T-cache.log" 2>/dev/null || true; fi
  if [ "$KEEP" = 0 ]; then rm -rf "$DIR"; fi
}

T_START=$EPOCHSECONDS
for t in "${TARGET_LIST[@]}"; do run_target "$t"; done
T_END=$EPOCHSECONDS

# ---------------------------------------------------------------- report
CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
SQUID_V=$( (squid -v 2>/dev/null || true) | awk 'NR == 1 { print $NF }')
MESH_V=$("$BIN" --version 2>/dev/null || echo meshcache)
FSTYPE=$(stat -f -c %T "$WORK")

# Per target: objects the RAM is divided by (what the rebuild indexed), and the per-object figures.
for t in "${TARGET_LIST[@]}"; do
  T=$t
  n=${R[$t,found]:-0}
  [ "${n:-0}" -gt 0 ] 2>/dev/null || n=${R[$t,indexed_after]:-0}
  put objects "$n"
  for k in rss pss anon; do
    put "per_obj_$k" "$(awk -v f="${R[$t,full_${k}_kb]}" -v e="${R[$t,empty_${k}_kb]}" -v n="$n" 'BEGIN { if (n > 0) printf "%.1f", (f - e) * 1024 / n; else print "" }')"
  done
  put total_per_obj "$(awk -v f="${R[$t,full_rss_kb]}" -v n="$n" 'BEGIN { if (n > 0) printf "%.0f", f * 1024 / n; else print "" }')"
  put own_per_scanned_us "$(awk -v s="${R[$t,own_s]}" -v n="${R[$t,scanned]:-0}" 'BEGIN { if (n > 0 && s != "") printf "%.2f", s * 1e6 / n; else print "" }')"
  put own_per_obj_us "$(awk -v s="${R[$t,own_s]}" -v n="$n" 'BEGIN { if (n > 0 && s != "") printf "%.2f", s * 1e6 / n; else print "" }')"
done

row() { # label key [suffix]
  local line="| $1" t v
  for t in "${TARGET_LIST[@]}"; do v=${R[$t,$2]:-}; line="$line | ${v:--}${v:+${3:-}}"; done
  echo "$line |"
}
{
  echo "# Restart benchmark: $STAMP"
  echo
  echo "- command: \`$BENCH_RESTART_CMD\`"
  echo "- revision: repository at $BENCH_RESTART_REV; $MESH_V; Squid $SQUID_V"
  echo "- meshcache binary: $BENCH_RESTART_BIN_NOTE"
  [ -z "$NOTE" ] || echo "- note: $NOTE"
  echo "- machine: $(nproc) CPUs, $CPU_MODEL, kernel $(uname -r); network namespace: $NETNS_USED; caches on $FSTYPE under $WORK_PARENT"
  echo "- objects: $OBJECTS distinct URLs of $SIZE bytes (max-age 1 day), filled by \`meshcache lab load\` with $CLIENTS closed-loop clients (core 0, beside the origin emulator); each server pinned to core 1, one at a time: meshcache with TOKIO_WORKER_THREADS=1, memory 16 MiB, one disk of $DISK_MIB MiB; Squid 1 worker, cache_mem 16 MB, \`cache_dir rock $DISK_MIB slot-size=2048\` (with its disker and coordinator processes) or \`cache_dir aufs $DISK_MIB 16 256\`"
  echo "- restart: SIGTERM, wait for the exit, start again: a process restart, not a reboot (the cache files stay in the page cache). Times are from the start command; the rebuild's end is polled every 50 ms (meshcache: /stats rebuilding false; Squid: the cache_dir's process logs \"Finished rebuilding storage from disk\")"
  echo "- sample: $SAMPLE random URLs the server held before the stop (it answered them with only-if-cached, from memory or disk); after the restart's rebuild, requested by $SAMPLE_CLIENTS concurrent clients; a hit is X-Cache HIT and the origin's per-URL counter unchanged (the URLs that were not: sample-missed-TARGET.idx, the objects' indexes in fill order). Probes: stored URLs outside the sample, one every 0.5 s (2 s after the 20th) while the rebuild runs"
  echo "- memory: summed over the server's process tree, taken as soon as the rebuild was done (before the sample), on the filled cache and, before the fill, on the empty cache; per object = (filled - empty) / objects indexed. VmRSS counts a page shared by several processes once in each: Squid's master, worker and disker all map its shared memory segments (rock's index among them), so its VmRSS sum counts them up to three times; Pss counts every page once in all (read Squid's figure there; for meshcache, one process, the two differ only by shared file pages); anon+shm = Pss_Anon + Pss_Shmem (no mapped files: the binary's and libraries' pages). A fixed cost of the rebuild (buffers, tables sized at start) weighs on the per-object figure when there are few objects"
  echo "- run took $((T_END - T_START)) s, of which $QUIET_SPENT s waiting for other processes to go quiet"
  echo
  line="| |"; sep="| --- |"
  for t in "${TARGET_LIST[@]}"; do line="$line $t |"; sep="$sep ---: |"; done
  echo "$line"; echo "$sep"
  row "fill: seconds" fill_s " s"
  row "fill: requests/s" fill_rps
  row "fill: misses" fill_miss
  row "fill: errors" fill_err
  row "disk writes dropped (meshcache)" disk_dropped
  row "objects held after the fill" stored_after_fill
  row "refill passes" refills
  row "misses in the last refill pass" refill_miss
  row "objects held before the stop" stored_before_stop
  row "stop took" stop_s " s"
  row "empty cache: rebuild done after" empty_rebuilt_s " s"
  row "**restart: listening after**" listen_s " s"
  row "**restart: rebuild done after (polled)**" rebuilt_s " s"
  row "restart: server's own rebuild time" own_s " s"
  row "restart: server's own time per object indexed" own_per_obj_us " µs"
  row "restart: server's own time per entry scanned (Squid)" own_per_scanned_us " µs"
  row "objects indexed by the rebuild" found
  row "entries scanned (Squid)" scanned
  row "damaged records (meshcache)" damaged
  row "server CPU from start to rebuilt" rebuild_cpu_s " s"
  row "probes during the rebuild: hits" probes
  row "first probe hit after" first_probe_hit_s " s"
  row "sample size" sample_n
  row "**sample served as hits**" sample_hits
  row "**sample all answered, after the start**" sample_done_s " s"
  row "sample URLs whose origin counter moved" origin_moved
  row "processes" procs
  row "VmRSS empty (KiB)" empty_rss_kb
  row "VmRSS restarted, rebuilt (KiB)" full_rss_kb
  row "VmRSS after the sample (KiB)" sample_rss_kb
  row "**RAM per disk object, VmRSS (bytes)**" per_obj_rss
  row "**RAM per disk object, Pss (bytes)**" per_obj_pss
  row "RAM per disk object, anon+shm (bytes)" per_obj_anon
  row "Pss empty (KiB)" empty_pss_kb
  row "Pss restarted (KiB)" full_pss_kb
  row "whole VmRSS / objects (bytes)" total_per_obj
  row "Squid shared memory segments (MiB)" shm_mib
  echo
  if has_target meshcache; then
    echo "Targets (meshcache; the issue's figures are for 1,000,000 objects$([ "$OBJECTS" = 1000000 ] || echo ": this run had $OBJECTS, so they are indicative only")):"
    echo
    awk -v s="${R[meshcache,sample_done_s]:-}" -v h="${R[meshcache,sample_hits]:-0}" -v n="${R[meshcache,sample_n]:-0}" \
      -v m="${R[meshcache,origin_moved]:-0}" -v b="${R[meshcache,per_obj_rss]:-}" -v bp="${R[meshcache,per_obj_pss]:-}" \
      -v sq="${R[squid-rock,rebuilt_s]:-}" -v sqb="${R[squid-rock,per_obj_pss]:-}" \
      -v sa="${R[squid-aufs,rebuilt_s]:-}" -v sab="${R[squid-aufs,per_obj_pss]:-}" 'BEGIN {
      ok = (s != "" && s + 0 <= 10 && h == n && m == 0)
      printf "- restart: objects indexed and the sample served as hits within 10 s of the start: %s (%s s; %d of %d hits; origin counter moved for %d)", ok ? "met" : "NOT met", s, h, n, m
      if (sq != "") printf "; Squid rock rebuilt after %s s", sq
      if (sa != "") printf ", aufs after %s s", sa
      print ""
      printf "- RAM per disk-resident object <= 64 bytes: %s (%s bytes by VmRSS, %s by Pss)", (b != "" && b + 0 <= 64) ? "met" : "NOT met", b, bp
      if (sqb != "") printf "; Squid rock %s bytes by Pss", sqb
      if (sab != "") printf ", aufs %s bytes by Pss", sab
      if (sqb != "" || sab != "") printf " (Squid by Pss: its processes share memory segments, which VmRSS counts once per process)"
      print "" }'
    echo
  fi
  echo "Probes: probes.csv; fill and sample reports: fill-*.json, sample-*.json; results.json beside this file."
} >"$OUT/results.md"

# results.json: the metadata and every figure per target.
{
  for k in "${!R[@]}"; do printf '%s\t%s\t%s\n' "${k%%,*}" "${k#*,}" "${R[$k]}"; done
} | jq -Rn --arg date "$STAMP" --arg cmd "$BENCH_RESTART_CMD" --arg rev "$BENCH_RESTART_REV" --arg bin "$BENCH_RESTART_BIN_NOTE" \
  --arg note "$NOTE" --arg mesh "$MESH_V" --arg squid "$SQUID_V" --arg cpu "$CPU_MODEL" --arg kernel "$(uname -r)" \
  --argjson nproc "$(nproc)" --argjson objects "$OBJECTS" --argjson size "$SIZE" --argjson sample "$SAMPLE" \
  --argjson clients "$CLIENTS" --argjson disk_mib "$DISK_MIB" --arg netns "$NETNS_USED" --arg fs "$FSTYPE" \
  --argjson took "$((T_END - T_START))" '
  ([inputs | split("\t") | {t: .[0], k: .[1], v: (.[2] | (tonumber? // .))}]
   | group_by(.t) | map({key: .[0].t, value: (map({key: .k, value: .v}) | from_entries)}) | from_entries) as $targets
  | {date: $date, command: $cmd, revision: $rev, binary: $bin, note: $note, meshcache: $mesh, squid: $squid,
     machine: {nproc: $nproc, cpu: $cpu, kernel: $kernel},
     config: {objects: $objects, size: $size, sample: $sample, fill_clients: $clients, disk_mib: $disk_mib,
              netns: $netns, filesystem: $fs, server_core: 1, load_core: 0, page_cache: "warm (process restart)"},
     took_s: $took, targets: $targets}' >"$OUT/results.json"

cat "$OUT/results.md"
log "results in $OUT"
