#!/usr/bin/env bash
# Access-rule and authentication overhead on cache hits: throughput, latency (p50/p99) and
# server CPU per request of meshcache serving one cached 1 KiB object under three
# configurations, in one run, interleaved:
#   A  no [[access]] rule (today's default: loopback clients allowed),
#   B  the 20 typical rules of crates/meshcache-policy/benches/typical-rules.toml (Debian's default
#      http_access translated, blocklists, working hours) with a 100,000-entry domain list as
#      @blocked; the benchmark's requests pass 18 rules and are allowed by the 19th
#      (src = 127.0.0.0/8),
#   C  B with Basic authentication: [auth] with an htpasswd file holding a bcrypt user
#      (htpasswd -B), the allowing rule requiring user = ["*"], and wrk sending
#      Proxy-Authorization for that user on every request (cached credentials after the first).
# The issue's target: C's request rate at least 90 % of A's, same run.
#
# Follows shared/BENCHMARKING.md: the three meshcache instances pinned to core 1 with one
# worker thread each (TOKIO_WORKER_THREADS=1, as scripts/bench-hits.sh), wrk pinned to core 0;
# rounds interleave [A, B, C] (the order rotated each round); medians and per-round paired ratios; CPU from /proc/PID/stat
# (utime+stime of the whole process tree); steal time from /proc/stat; hits proven by the
# origin's per-URL counter not moving during a run; the rules proven active (B and C deny a
# host of the list, C answers 407 without credentials); the whole measurement in a fresh
# network namespace (unshare -n) when the machine allows it.
#
# Usage: scripts/bench-access.sh [options]
#   --duration SECS    each wrk run (default 5)
#   --rounds N         interleaved rounds (default 9)
#   --connections N    wrk connections (default 50)
#   --out DIR          results directory (default target/bench-access/<UTC timestamp>)
#   --bin PATH         meshcache binary (default: build target/release/meshcache)
#   --no-build         do not run cargo build (use the existing binary)
#   --no-netns         do not run inside `unshare -n`
#   --port-base N      ports N..N+6 on 127.0.0.1 (default 18180)
#   --list-size N      entries of the generated domain blocklist (default 100000)
#   --fixed-order      A B C in every round; by default the order rotates one place each round
#                      (A B C, B C A, C A B, …) so that no configuration always runs in the same
#                      position (after the same neighbour)
#   --concurrent N     after the interleaved rounds, N runs (default 6; 0: none) with A, B and C
#                      loaded at the same time, one wrk each (all on core 0), the three instances
#                      sharing core 1: every configuration sees the same machine at the same
#                      moment, so the drift between runs cancels out of their ratios (a check
#                      on the interleaved figures, which it does not replace)
#   --note TEXT        a line added to the results' header
#   --quiet-budget S   on a shared machine: seconds (default 90) this run may spend in total
#                      waiting for other processes' CPU use to drop before a measured run, and
#                      re-doing runs disturbed by it (other CPU > 15% of a core, or steal > 5%
#                      on either core); 0 disables
# Defaults take about 3.5 minutes (at most 5 with the quiet budget). Short runs, many rounds:
# on this shared machine one configuration's rate drifts by 10-30 % between runs seconds apart
# (noisy neighbours, often without steal time to show for it), so the three configurations of
# a round are best measured close together in time, and the concurrent phase checks the
# interleaved ratios. Installs wrk, curl, apache2-utils (htpasswd) when missing (apt).
# Output: Markdown tables on stdout and in OUT/results.md; raw numbers in OUT/raw.csv (the
# interleaved runs), OUT/raw-concurrent.csv and OUT/results.json; the generated configs (not the 100,000-line list: the script regenerates
# it), the htpasswd file and the servers' logs in OUT/.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR="$REPO/scripts/bench"
ORIG_ARGS=("$@")
# The command as the user typed it (kept across the re-run inside the network namespace).
: "${BENCH_ACCESS_CMD:=scripts/bench-access.sh${*:+ $*}}"
export BENCH_ACCESS_CMD

DURATION=5
ROUNDS=9
CONNS=50
OUT=""
BIN=""
BUILD=1
NETNS=1
PORT_BASE=18180
LIST_SIZE=100000
NOTE=""
QUIET_BUDGET=90
ROTATE=1
CONCURRENT=6
SIZE=1024
# The target of the issue: C (rules + auth) at least this fraction of A (no rules).
TARGET_RATIO=0.90

BENCH_TAG=bench-access
# shellcheck source=bench/lib.sh
. "$BENCH_DIR/lib.sh"

while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --connections) CONNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; BUILD=0; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --no-netns) NETNS=0; shift ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --list-size) LIST_SIZE=$2; shift 2 ;;
    --note) NOTE=$2; shift 2 ;;
    --fixed-order) ROTATE=0; shift ;;
    --concurrent) CONCURRENT=$2; shift 2 ;;
    --quiet-budget) QUIET_BUDGET=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 && $DURATION -le 120 ]] || die "--duration: 1..120 seconds"
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 60 ]] || die "--rounds: 1..60"
[[ $CONNS =~ ^[0-9]+$ && $CONNS -ge 1 && $CONNS -le 2000 ]] || die "--connections: 1..2000"
[[ $QUIET_BUDGET =~ ^[0-9]+$ ]] || die "--quiet-budget: seconds"
[[ $CONCURRENT =~ ^[0-9]+$ && $CONCURRENT -le 20 ]] || die "--concurrent: 0..20"
[[ $PORT_BASE =~ ^[0-9]+$ && $PORT_BASE -ge 1024 && $PORT_BASE -le 65000 ]] || die "--port-base: 1024..65000"
[[ $LIST_SIZE =~ ^[0-9]+$ && $LIST_SIZE -ge 1 && $LIST_SIZE -le 10000000 ]] || die "--list-size: 1..10000000"

# ---------------------------------------------------------------- install, build (outside netns)
if [ -z "${BENCH_ACCESS_IN_NETNS:-}" ]; then
  declare -A need=([wrk]=wrk [curl]=curl [taskset]=util-linux [ip]=iproute2 [timeout]=coreutils [htpasswd]=apache2-utils [base64]=coreutils)
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
[ -n "${BENCH_ACCESS_REV:-}" ] || BENCH_ACCESS_REV=$(bench_revision "$REPO")
export BENCH_ACCESS_REV
REV_NOTE="repository at $BENCH_ACCESS_REV"
# Noted now: a concurrent cargo build may replace the file while the benchmark runs.
: "${BENCH_ACCESS_BIN_NOTE:=$(bench_binary_note "$BIN")}"
export BENCH_ACCESS_BIN_NOTE
BIN_NOTE=$BENCH_ACCESS_BIN_NOTE

# Re-run this script inside a fresh network namespace (only its own traffic on lo).
if [ "$NETNS" = 1 ]; then
  bench_enter_netns BENCH_ACCESS_IN_NETNS "${BASH_SOURCE[0]}" "${ORIG_ARGS[@]}" --no-build --bin "$BIN"
fi
NETNS_USED=no
if [ -n "${BENCH_ACCESS_IN_NETNS:-}" ]; then
  ip link set lo up
  NETNS_USED=yes
fi

# ---------------------------------------------------------------- setup
CONFIGS=(A B C)
declare -A CONF_DESC=(
  [A]="no rules"
  [B]="20 rules + $LIST_SIZE-entry list"
  [C]="20 rules + list + Basic auth (bcrypt, cached)"
)
ORIGIN_PORT=$PORT_BASE
declare -A PORT_OF=([A]=$((PORT_BASE + 1)) [B]=$((PORT_BASE + 2)) [C]=$((PORT_BASE + 3)))
declare -A ADMIN_PORT_OF=([A]=$((PORT_BASE + 4)) [B]=$((PORT_BASE + 5)) [C]=$((PORT_BASE + 6)))
for p in $ORIGIN_PORT "${PORT_OF[@]}" "${ADMIN_PORT_OF[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then die "port $p is in use (try --port-base)"; fi
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ -n "$OUT" ] || OUT="$REPO/target/bench-access/$STAMP"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/bench-access.XXXXXX)
chmod 755 "$WORK"
RAW="$OUT/raw.csv"
CLK_TCK=$(getconf CLK_TCK)
ulimit -n 65536 2>/dev/null || ulimit -n 8192 2>/dev/null || true

declare -A PID_OF=()
STARTED=()   # PIDs this script started, in start order
WRK_PIDS=()  # wrk processes running in the background (the concurrent phase)

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local w
  for w in "${WRK_PIDS[@]}"; do kill "$w" 2>/dev/null || true; done
  bench_stop_pids "${STARTED[@]}"
  # Keep the configs and the servers' logs with the results; drop the rest (the list).
  if [ -d "$WORK" ]; then
    cp -r "$WORK/conf" "$OUT/" 2>/dev/null || true
    mkdir -p "$OUT/logs"
    local f name
    for f in "$WORK"/*.log; do
      [ -f "$f" ] || continue
      name=${f#"$WORK"/}
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

wait_port() { # port name pid
  local i
  for ((i = 0; i < 300; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    kill -0 "$3" 2>/dev/null || { cat "$WORK/$2.stderr.log" >&2 || true; die "$2 exited at startup (logs in $OUT/logs)"; }
    sleep 0.1
  done
  die "$2 did not listen on port $1 within 30 s"
}

start() { # name port cmd... (runs pinned to core 1, in the background)
  local name=$1 port=$2 t0=$EPOCHREALTIME
  shift 2
  taskset -c 1 "$@" >"$WORK/$name.stdout.log" 2>"$WORK/$name.stderr.log" &
  local pid=$!
  STARTED+=("$pid")
  PID_OF[$name]=$pid
  wait_port "$port" "$name" "$pid"
  log "$name running (pid $pid, 127.0.0.1:$port, listening after $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s)"
}

# The object: a realistic host name (4 labels, as the microbenchmark's request) mapped to the
# origin by meshcache's static host table, and a page-like path; the origin emulator ignores
# the path and answers `size` bytes with the given Cache-Control, counting per path and query.
HOST="www.news.example.org"
AUTHORITY="$HOST:$ORIGIN_PORT"
PATHQ="/2026/11/28/story.html?size=$SIZE&cc=max-age%3D3600&ref=front"
URL="http://$AUTHORITY$PATHQ"
ORIGIN_URL="http://127.0.0.1:$ORIGIN_PORT$PATHQ"
AUTH_USER=alice
AUTH_PASS=secret
AUTH_HEADER="Basic $(printf '%s:%s' "$AUTH_USER" "$AUTH_PASS" | base64 -w0)"

mkdir -p "$WORK/conf"
# The blocklist, of the shape crates/meshcache-policy/benches/rules.rs builds: half suffixes
# (".hostN.trackerM.TLD"), half exact hosts, spread over com, net and org as real lists are
# (so the benchmark's host, under .org, shares its last label with a third of the list).
awk -v n="$LIST_SIZE" 'BEGIN { split("com net org", tld, " "); for (i = 0; i < n; i++) printf "%shost%d.tracker%d.%s\n", (i % 2 == 0 ? "." : ""), i, i % 997, tld[i % 3 + 1] }' >"$WORK/blocked.txt"
BLOCKED_HOST="cdn.host4242.tracker$((4242 % 997)).com"   # under the list's .host4242.tracker254.com
# A bcrypt user (htpasswd -B: cost 5, its default), plus a few others so the file is not trivial.
htpasswd -B -b -c "$WORK/conf/users.htpasswd" "$AUTH_USER" "$AUTH_PASS" 2>/dev/null
for u in bob carol dave; do htpasswd -B -b "$WORK/conf/users.htpasswd" "$u" "pw-$u" 2>/dev/null; done
grep -q "^$AUTH_USER:[$]2[aby][$]" "$WORK/conf/users.htpasswd" || die "htpasswd -B did not write a bcrypt hash"

base_config() { # name
  cat <<EOF
# meshcache config $1 for scripts/bench-access.sh: ${CONF_DESC[$1]}.
name = "bench-$1"

[http]
listen = ["127.0.0.1:${PORT_OF[$1]}"]

[admin]
listen = "127.0.0.1:${ADMIN_PORT_OF[$1]}"

[store]
memory = "256 MiB"
max_object_size = "8 MiB"

[log]
# Squid-format access log, buffered and flushed every second (as in bench-hits).
access = "$WORK/meshcache-$1-access.log"

[dns]
hosts = { "$HOST" = "127.0.0.1" }
EOF
}

# The 20 typical rules (crates/meshcache-policy/benches/typical-rules.toml, the rules
# microbenchmark's too), unchanged but for the allowing rule's user matcher in C, added to rule
# 19. A request of this benchmark (GET, port $ORIGIN_PORT, http, client 127.0.0.1, host $HOST)
# fails rules 1-18 and is allowed by rule 19.
rules() { # user-line (empty for none)
  echo
  awk -v user="$1" '
    /^\[\[access\]\]/ { n++; if (n == 20 && user != "") print user }
    { print }
  ' "$REPO/crates/meshcache-policy/benches/typical-rules.toml"
}

{ base_config A; } >"$WORK/conf/meshcache-A.toml"
{
  base_config B
  printf '\n[lists]\nblocked = "%s"\n' "$WORK/blocked.txt"
  rules ""
} >"$WORK/conf/meshcache-B.toml"
{
  base_config C
  printf '\n[lists]\nblocked = "%s"\n' "$WORK/blocked.txt"
  printf '\n[auth]\nrealm = "bench"\nhtpasswd = "%s"\ncredentials_ttl = "1h"\n' "$WORK/conf/users.htpasswd"
  rules 'user = ["*"]'
} >"$WORK/conf/meshcache-C.toml"
for c in B C; do
  n=$(grep -c '^\[\[access\]\]' "$WORK/conf/meshcache-$c.toml")
  [ "$n" = 20 ] || die "config $c has $n rules, expected 20"
done
for c in "${CONFIGS[@]}"; do
  "$BIN" config check "$WORK/conf/meshcache-$c.toml" >"$WORK/config-check-$c.log" 2>&1 ||
    { cat "$WORK/config-check-$c.log" >&2; die "config $c does not check"; }
done

TOKIO_ENV=(env TOKIO_WORKER_THREADS=1 MESHCACHE_LOG=warn)
start origin "$ORIGIN_PORT" "${TOKIO_ENV[@]}" "$BIN" lab origin --listen "127.0.0.1:$ORIGIN_PORT"
for c in "${CONFIGS[@]}"; do
  start "$c" "${PORT_OF[$c]}" "${TOKIO_ENV[@]}" "$BIN" run -c "$WORK/conf/meshcache-$c.toml"
done

# ---------------------------------------------------------------- checks
origin_count() { # the origin's count for the object, not counting this probe
  local n
  n=$(curl -s --noproxy '*' --max-time 5 -o /dev/null -D - "$ORIGIN_URL" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-origin-count" { print $2 }')
  [ -n "$n" ] || die "origin did not answer $ORIGIN_URL"
  echo $((n - 1))
}

auth_args() { # config -> curl arguments for its credentials
  [ "$1" = C ] && printf '%s\n' -H "Proxy-Authorization: $AUTH_HEADER"
  return 0
}

proxy_status() { # config url [curl args...] -> status code
  local c=$1 url=$2
  shift 2
  curl -s --noproxy '' -x "http://127.0.0.1:${PORT_OF[$c]}" --max-time 5 -o /dev/null -w '%{http_code}' "$@" "$url" || true
}

# Warm one instance and prove it serves hits: after the first request, five more must leave the
# origin's counter where it was and carry X-Cache: HIT.
warm_and_check() { # config
  local c=$1 port before after i hdrs xc
  local -a a
  mapfile -t a < <(auth_args "$c")
  port=${PORT_OF[$c]}
  curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 10 -o /dev/null "${a[@]}" "$URL" || die "$c: warm-up request failed"
  sleep 0.2
  before=$(origin_count)
  for i in 1 2 3 4 5; do
    hdrs=$(curl -s --noproxy '' -x "http://127.0.0.1:$port" --max-time 5 -o "$WORK/body" -D - "${a[@]}" "$URL" | tr -d '\r')
    [ "$(stat -c %s "$WORK/body")" = "$SIZE" ] || { echo "$hdrs" >&2; die "$c: body of $(stat -c %s "$WORK/body") bytes, expected $SIZE"; }
  done
  after=$(origin_count)
  [ "$after" = "$((before + 1))" ] || die "$c: origin count moved from $before to $after during hits (not cached?)"
  xc=$(awk -F': ' 'tolower($1) == "x-cache" { print $2 }' <<<"$hdrs" | tr '\n' ' ')
  [[ ${xc^^} == *HIT* ]] || die "$c: no X-Cache HIT after warm-up (X-Cache: $xc)"
  log "$c: object cached (X-Cache: $xc; origin count steady at $((after - 1)))"
}

# Prove the rules and the authentication are in force where they should be.
check_policy() {
  local s
  # A host under the list: denied by B and C before any credential is asked for (rule 1 comes
  # first).
  local blocked_url="http://$BLOCKED_HOST:$ORIGIN_PORT/pixel.gif"
  s=$(proxy_status B "$blocked_url"); [ "$s" = 403 ] || die "B answered $s to $blocked_url (expected 403: the list)"
  s=$(proxy_status C "$blocked_url"); [ "$s" = 403 ] || die "C answered $s to $blocked_url (expected 403: the list)"
  # Rule 10 (url_regex), in B.
  s=$(proxy_status B "http://$AUTHORITY/wp-login.php"); [ "$s" = 403 ] || die "B answered $s to /wp-login.php (expected 403)"
  # C: no credentials, wrong credentials -> 407; right ones -> 200 (checked by warm_and_check).
  s=$(proxy_status C "$URL"); [ "$s" = 407 ] || die "C answered $s without credentials (expected 407)"
  s=$(proxy_status C "$URL" -H "Proxy-Authorization: Basic $(printf '%s:wrong' "$AUTH_USER" | base64 -w0)")
  [ "$s" = 407 ] || die "C answered $s to a wrong password (expected 407)"
  s=$(proxy_status B "$URL"); [ "$s" = 200 ] || die "B answered $s to the object (expected 200)"
  log "policy checked: B and C deny $BLOCKED_HOST (403), B denies /wp-login.php, C answers 407 without or with wrong credentials"
}

# ---------------------------------------------------------------- measurement
# One wrk run against one configuration; appends one CSV row to $RAW.
run_one() { # round config phase
  local round=$1 c=$2 phase=$3 port pid c0 c1 out auth=""
  port=${PORT_OF[$c]}
  pid=${PID_OF[$c]}
  [ "$c" = C ] && auth=$AUTH_HEADER
  c0=$(origin_count)
  out="$WORK/wrk-$round-$c-$phase.txt"
  local srv0 srv1 st0 st1 w0 w1 t0 t1
  srv0=$(tree_ticks "$pid")
  st0=$(cpu_stat)
  t0=$EPOCHREALTIME
  self_child_ticks; w0=$SELF_CT
  BENCH_PATH=$URL BENCH_HOST=$AUTHORITY BENCH_PROXY_AUTH=$auth timeout -k 5 $((DURATION + 30)) \
    taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$BENCH_DIR/absolute-uri-auth.lua" "http://127.0.0.1:$port" >"$out" 2>&1 ||
    { cat "$out" >&2; die "wrk failed against $c"; }
  self_child_ticks; w1=$SELF_CT
  t1=$EPOCHREALTIME
  st1=$(cpu_stat)
  srv1=$(tree_ticks "$pid")
  c1=$(origin_count)
  [ "$c1" = "$((c0 + 1))" ] || die "$c: the origin received $((c1 - c0 - 1)) requests during a hit run (not all hits)"
  local rps reqs p50 p99 errs non2xx
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
  reqs=$(awk '/ requests in / { print $1 }' "$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$out")
  [ -n "$rps" ] && [ -n "$reqs" ] || { cat "$out" >&2; die "cannot parse wrk output for $c"; }
  # Every response must be the object: a 403 or 407 would be far cheaper than a hit.
  [ "${non2xx:-0}" = 0 ] || { cat "$out" >&2; die "$c: $non2xx responses were not 2xx (denied? challenged?)"; }
  [ "$phase" = measure ] || return 0
  p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$out")")
  p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$out")")
  errs=$(awk '/Socket errors:/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "$out")
  local s00 t00 b00 s10 t10 b10 s01 t01 b01 s11 t11 b11
  read -r s00 t00 b00 s10 t10 b10 <<<"$st0"
  read -r s01 t01 b01 s11 t11 b11 <<<"$st1"
  awk -v round="$round" -v conf="$c" -v rps="$rps" -v reqs="$reqs" \
    -v p50="$p50" -v p99="$p99" -v errs="${errs:-0}" -v non2xx="${non2xx:-0}" \
    -v srv="$((srv1 - srv0))" -v wrk="$((w1 - w0))" -v hz="$CLK_TCK" -v t0="$t0" -v t1="$t1" \
    -v st0="$((s01 - s00))" -v tt0="$((t01 - t00))" -v st1="$((s11 - s10))" -v tt1="$((t11 - t10))" \
    -v busy="$((b01 - b00 + b11 - b10))" -v od="$((c1 - c0 - 1))" 'BEGIN {
      wall = t1 - t0; srv_ms = srv * 1000 / hz; wrk_ms = wrk * 1000 / hz
      other = (busy - srv - wrk) * 1000 / hz; if (other < 0) other = 0
      printf "%d,%s,%.2f,%d,%.3f,%.3f,%.3f,%d,%d,%.1f,%.2f,%.1f,%.1f,%.1f,%.2f,%.2f,%.1f,%d\n",
        round, conf, rps, reqs, wall, p50, p99, errs, non2xx, srv_ms, srv_ms * 1000 / reqs,
        srv_ms / 10 / wall, wrk_ms, wrk_ms / 10 / wall,
        (tt0 > 0 ? 100 * st0 / tt0 : 0), (tt1 > 0 ? 100 * st1 / tt1 : 0), other / 10 / wall, od }' >>"$RAW"
  tail -n 1 "$RAW" | awk -F, '{ printf "  %s round %d: %9.0f req/s  p50 %6.3f ms  p99 %7.3f ms  cpu %6.2f us/req  srv %5.1f%%  wrk %5.1f%%  steal %.1f/%.1f%%  other %.0f%%  origin +%s\n",
    $2, $1, $3, $6, $7, $11, $12, $14, $15, $16, $17, $18 }' >&2
}

OTHER_MAX=${BENCH_ACCESS_OTHER_MAX:-15}
STEAL_MAX=${BENCH_ACCESS_STEAL_MAX:-5}
QUIET_SPENT=0
# A measured run, re-done (at most twice, within the budget) when other processes used more
# than OTHER_MAX % of a core during it, or the hypervisor stole more than STEAL_MAX % of either
# core.
measure() { # round config
  local attempt other steal
  for attempt in 1 2 3; do
    wait_quiet
    run_one "$1" "$2" measure
    other=$(tail -n 1 "$RAW" | awk -F, '{ printf "%d", $17 }')
    steal=$(tail -n 1 "$RAW" | awk -F, '{ printf "%d", ($15 > $16 ? $15 : $16) }')
    if { [ "$other" -le "$OTHER_MAX" ] && [ "$steal" -le "$STEAL_MAX" ]; } || [ $attempt = 3 ] || [ "$QUIET_SPENT" -ge "$QUIET_BUDGET" ]; then
      [ "$other" -le "$OTHER_MAX" ] && [ "$steal" -le "$STEAL_MAX" ] ||
        log "  (kept a run with $other% other CPU, $steal% steal: retries or quiet budget used up)"
      return 0
    fi
    log "  other processes used $other% of a core, steal $steal%, during that run: re-doing it"
    sed -i '$d' "$RAW"
    QUIET_SPENT=$((QUIET_SPENT + DURATION))
  done
}

# The concurrent phase: A, B and C loaded at the same time, one wrk each, for DURATION; one CSV
# row per configuration to $RAW_CONC.
run_concurrent() { # round
  local round=$1 c i t0 t1 w0 w1 st0 st1 c0 c1
  local -A srv0=() srv1=() out=()
  c0=$(origin_count)
  for c in "${CONFIGS[@]}"; do srv0[$c]=$(tree_ticks "${PID_OF[$c]}"); out[$c]="$WORK/wrk-conc-$round-$c.txt"; done
  st0=$(cpu_stat)
  self_child_ticks; w0=$SELF_CT
  t0=$EPOCHREALTIME
  WRK_PIDS=()
  for c in "${CONFIGS[@]}"; do
    local auth=""
    [ "$c" = C ] && auth=$AUTH_HEADER
    BENCH_PATH=$URL BENCH_HOST=$AUTHORITY BENCH_PROXY_AUTH=$auth timeout -k 5 $((DURATION + 30)) \
      taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$BENCH_DIR/absolute-uri-auth.lua" "http://127.0.0.1:${PORT_OF[$c]}" >"${out[$c]}" 2>&1 &
    WRK_PIDS+=($!)
  done
  for i in "${!WRK_PIDS[@]}"; do
    wait "${WRK_PIDS[$i]}" || { cat "${out[${CONFIGS[$i]}]}" >&2; die "wrk failed against ${CONFIGS[$i]} (concurrent)"; }
  done
  WRK_PIDS=()
  t1=$EPOCHREALTIME
  self_child_ticks; w1=$SELF_CT
  st1=$(cpu_stat)
  for c in "${CONFIGS[@]}"; do srv1[$c]=$(tree_ticks "${PID_OF[$c]}"); done
  c1=$(origin_count)
  [ "$c1" = "$((c0 + 1))" ] || die "concurrent run: the origin received $((c1 - c0 - 1)) requests (not all hits)"
  local s00 t00 b00 s10 t10 b10 s01 t01 b01 s11 t11 b11
  read -r s00 t00 b00 s10 t10 b10 <<<"$st0"
  read -r s01 t01 b01 s11 t11 b11 <<<"$st1"
  for c in "${CONFIGS[@]}"; do
    local rps reqs p50 p99 errs non2xx
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "${out[$c]}")
    reqs=$(awk '/ requests in / { print $1 }' "${out[$c]}")
    non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "${out[$c]}")
    [ -n "$rps" ] && [ -n "$reqs" ] || { cat "${out[$c]}" >&2; die "cannot parse wrk output for $c (concurrent)"; }
    [ "${non2xx:-0}" = 0 ] || { cat "${out[$c]}" >&2; die "$c: $non2xx responses were not 2xx (concurrent)"; }
    p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' "${out[$c]}")")
    p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' "${out[$c]}")")
    errs=$(awk '/Socket errors:/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "${out[$c]}")
    awk -v round="$round" -v conf="$c" -v rps="$rps" -v reqs="$reqs" -v p50="$p50" -v p99="$p99" \
      -v errs="${errs:-0}" -v srv="$((srv1[$c] - srv0[$c]))" -v wrk="$((w1 - w0))" -v hz="$CLK_TCK" -v t0="$t0" -v t1="$t1" \
      -v st0="$((s01 - s00))" -v tt0="$((t01 - t00))" -v st1="$((s11 - s10))" -v tt1="$((t11 - t10))" 'BEGIN {
        wall = t1 - t0; srv_ms = srv * 1000 / hz; wrk_ms = wrk * 1000 / hz
        printf "%d,%s,%.2f,%d,%.3f,%.3f,%.3f,%d,%.1f,%.2f,%.1f,%.1f,%.2f,%.2f\n", round, conf, rps, reqs, wall, p50, p99, errs,
          srv_ms, srv_ms * 1000 / reqs, srv_ms / 10 / wall, wrk_ms / 10 / wall,
          (tt0 > 0 ? 100 * st0 / tt0 : 0), (tt1 > 0 ? 100 * st1 / tt1 : 0) }' >>"$RAW_CONC"
  done
  tail -n ${#CONFIGS[@]} "$RAW_CONC" | awk -F, '{ printf "  concurrent %s round %d: %9.0f req/s  p50 %6.3f ms  p99 %7.3f ms  cpu %6.2f us/req  srv %5.1f%%  (3 wrk %5.1f%%)  steal %.1f/%.1f%%\n",
    $2, $1, $3, $6, $7, $10, $11, $12, $13, $14 }' >&2
}

# ---------------------------------------------------------------- run
echo "round,config,rps,requests,wall_s,p50_ms,p99_ms,socket_errors,non2xx,server_cpu_ms,server_cpu_us_per_req,server_cpu_pct,wrk_cpu_ms,wrk_cpu_pct,steal_cpu0_pct,steal_cpu1_pct,other_cpu_pct,origin_requests_during_run" >"$RAW"
T_START=$EPOCHSECONDS
log "object: $URL ($SIZE bytes, via [dns] hosts $HOST = 127.0.0.1)"
check_policy
for c in "${CONFIGS[@]}"; do warm_and_check "$c"; done
# A short unrecorded run each, so every instance has its connections, buffers and caches warm
# (and C its credentials cached).
for c in "${CONFIGS[@]}"; do
  DURATION_SAVE=$DURATION; DURATION=2
  run_one 0 "$c" warm
  DURATION=$DURATION_SAVE
done
for ((r = 1; r <= ROUNDS; r++)); do
  for ((i = 0; i < ${#CONFIGS[@]}; i++)); do
    j=$i
    [ "$ROTATE" = 0 ] || j=$(((i + r - 1) % ${#CONFIGS[@]}))
    measure "$r" "${CONFIGS[$j]}"
  done
done
RAW_CONC="$OUT/raw-concurrent.csv"
echo "round,config,rps,requests,wall_s,p50_ms,p99_ms,socket_errors,server_cpu_ms,server_cpu_us_per_req,server_cpu_pct,wrk_cpu_pct_all_three,steal_cpu0_pct,steal_cpu1_pct" >"$RAW_CONC"
for ((r = 1; r <= CONCURRENT; r++)); do
  wait_quiet
  run_concurrent "$r"
done
T_END=$EPOCHSECONDS
# The access log of C names the user (flushed every second).
sleep 1.5
AUTH_LOGGED=$(awk -v u="$AUTH_USER" '$8 == u { n++ } END { print n + 0 }' "$WORK/meshcache-C-access.log" 2>/dev/null || echo 0)
RSS_LINE=""
for c in "${CONFIGS[@]}"; do
  RSS_LINE="$RSS_LINE $c $(awk '/^VmRSS:/ { printf "%.0f MiB", $2 / 1024 }' "/proc/${PID_OF[$c]}/status" 2>/dev/null || echo "?"),"
done
RSS_LINE=${RSS_LINE%,}

# ---------------------------------------------------------------- report
CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
MEM_GIB=$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)
WRK_V=$(wrk -v 2>&1 | head -n 1 | awk '{ print $2 }' || true)
MESH_V=$("$BIN" --version 2>/dev/null || echo meshcache)

{
  echo "# Access-rule and authentication benchmark: $STAMP"
  echo
  echo "- command: \`$BENCH_ACCESS_CMD\`"
  echo "- revision: $REV_NOTE; $MESH_V; wrk $WRK_V"
  echo "- meshcache binary: $BIN_NOTE"
  [ -z "$NOTE" ] || echo "- note: $NOTE"
  echo "- machine: $(nproc) CPUs, $CPU_MODEL, ${MEM_GIB} GiB, kernel $(uname -r); network namespace: $NETNS_USED"
  echo "- load: wrk -t1 -c$CONNS -d${DURATION}s --latency on core 0, absolute-URI GETs for one $SIZE-byte object (\`$URL\`, Cache-Control: max-age=3600, the host mapped to the origin by \`[dns] hosts\`); three meshcache instances on core 1, one worker thread each (TOKIO_WORKER_THREADS=1), each with its own copy of the object, all writing a buffered access log"
  echo "- configurations: A = no \`[[access]]\` rule; B = the 20 rules of crates/meshcache-policy/benches/rules.rs with a $LIST_SIZE-entry domain list as @blocked (each request fails rules 1-18 and is allowed by rule 19, \`src = [\"127.0.0.0/8\"]\`); C = B with \`[auth]\` (htpasswd file, bcrypt user \`$AUTH_USER\`, \`htpasswd -B\` cost 5), rule 19 with \`user = [\"*\"]\`, and \`Proxy-Authorization: Basic …\` on every request (cached credentials: \`credentials_ttl\` 1 h)"
  echo "- checks: every measured run was all hits (origin's per-URL counter steady) and all 200; B and C deny a host of the list (403), B denies /wp-login.php, C answers 407 without or with a wrong password; C's access log names the user on $AUTH_LOGGED lines; RSS at the end:$RSS_LINE"
  if [ "$ROTATE" = 1 ]; then ORDER_NOTE="[A, B, C] rotated one place each round (A B C, B C A, C A B, …)"; else ORDER_NOTE="[A, B, C]"; fi
  echo "- rounds: $ROUNDS interleaved rounds of $ORDER_NOTE after a 2 s unrecorded warm-up each; medians below; run took $((T_END - T_START)) s, of which $QUIET_SPENT s waiting for other processes to go quiet or re-doing runs they disturbed (budget $QUIET_BUDGET s; a run is re-done when others used more than $OTHER_MAX % of a core or steal exceeded $STEAL_MAX % on either core)"
  echo "- CPU: server CPU is utime+stime of the meshcache process (all threads) over the run divided by completed requests (µs per request); 'srv %' and 'wrk %' are CPU use of one core; steal is per core (0 = wrk, 1 = server); 'other CPU' is busy time on both cores not charged to the server or wrk, in % of one core"
  echo
  awk -F, -v target="$TARGET_RATIO" -v listn="$LIST_SIZE" '
    function median(list,   n, a, i, j, x) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      if (n == 0) return ""
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function add(k, v) { vals[k] = (k in vals) ? vals[k] " " v : v }
    function minmax(list,   n, a, i, lo, hi) {
      n = split(list, a, " "); lo = a[1] + 0; hi = a[1] + 0
      for (i = 2; i <= n; i++) { if (a[i] + 0 < lo) lo = a[i] + 0; if (a[i] + 0 > hi) hi = a[i] + 0 }
      return sprintf("%.0f–%.0f", lo, hi)
    }
    NR > 1 {
      k = $2
      add(k SUBSEP "rps", $3); add(k SUBSEP "p50", $6); add(k SUBSEP "p99", $7); add(k SUBSEP "cpu", $11)
      add(k SUBSEP "srv", $12); add(k SUBSEP "wrk", $14); add(k SUBSEP "st0", $15); add(k SUBSEP "st1", $16)
      add(k SUBSEP "err", $8 + $9); add(k SUBSEP "oth", $17); add(k SUBSEP "od", $18)
      rps[$1, $2] = $3; cpu[$1, $2] = $11
      if ($1 > maxr) maxr = $1
    }
    END {
      desc["A"] = "A: no rules"; desc["B"] = "B: 20 rules + " listn "-entry list"; desc["C"] = "C: B + Basic auth (cached)"
      print "| configuration | req/s (median) | req/s (range) | p50 ms | p99 ms | CPU µs/req | srv CPU % | wrk CPU % | steal core0/core1 % | other CPU % | origin reqs during runs | errors |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      split("A B C", C, " ")
      for (j = 1; j <= 3; j++) {
        k = C[j]
        if (!((k SUBSEP "rps") in vals)) continue
        split(vals[k SUBSEP "od"], o, " "); odmax = 0; for (x in o) if (o[x] + 0 > odmax) odmax = o[x] + 0
        w = median(vals[k SUBSEP "wrk"])
        printf "| %s | %.0f | %s | %.3f | %.3f | %.2f | %.0f | %.0f%s | %.1f / %.1f | %.0f | max %d | %d |\n", desc[k], \
          median(vals[k SUBSEP "rps"]), minmax(vals[k SUBSEP "rps"]), median(vals[k SUBSEP "p50"]), median(vals[k SUBSEP "p99"]), \
          median(vals[k SUBSEP "cpu"]), median(vals[k SUBSEP "srv"]), w, (w >= 90 ? " (client-bound)" : ""), \
          median(vals[k SUBSEP "st0"]), median(vals[k SUBSEP "st1"]), median(vals[k SUBSEP "oth"]), odmax, \
          median(vals[k SUBSEP "err"])
      }
      print ""
      print "Ratios to A (per round in the same run, median over rounds; in brackets the per-round values):"
      print ""
      print "| | req/s | CPU µs/req | target: req/s >= " target * 100 " % of A |"
      print "| --- | ---: | ---: | --- |"
      for (j = 2; j <= 3; j++) {
        k = C[j]; l = ""; lc = ""; sl = ""; slc = ""
        for (r = 1; r <= maxr; r++) {
          if (((r, k) in rps) && ((r, "A") in rps) && rps[r, "A"] > 0) { x = rps[r, k] / rps[r, "A"]; l = l " " sprintf("%.6f", x); sl = sl " " sprintf("%.3f", x) }
          if (((r, k) in cpu) && ((r, "A") in cpu) && cpu[r, "A"] > 0) { x = cpu[r, k] / cpu[r, "A"]; lc = lc " " sprintf("%.6f", x); slc = slc " " sprintf("%.3f", x) }
        }
        if (l == "") continue
        m = median(l); mc = median(lc)
        verdict = (k == "C") ? ((m >= target ? "**met**" : "**NOT met**") sprintf(" (%.2f %%)", 100 * m)) : sprintf("(informational: %.2f %%)", 100 * m)
        printf "| %s / A | %.3f [%s] | %.3f [%s] | %s |\n", k, m, substr(sl, 2), mc, substr(slc, 2), verdict
      }
      ka = "A"; kc = "C"
      if (((ka SUBSEP "cpu") in vals) && ((kc SUBSEP "cpu") in vals)) {
        print ""
        printf "Server CPU added per request (medians): rules %.2f µs, rules + auth %.2f µs.\n", \
          median(vals["B" SUBSEP "cpu"]) - median(vals["A" SUBSEP "cpu"]), median(vals["C" SUBSEP "cpu"]) - median(vals["A" SUBSEP "cpu"])
      }
    }' "$RAW"
  if [ "$CONCURRENT" -gt 0 ]; then
    echo
    echo "Concurrent check: $CONCURRENT runs of ${DURATION} s with A, B and C loaded at the same time (three wrk -t1 -c$CONNS on core 0, the three instances sharing core 1, so each gets about a third of it): the drift of the machine between runs cancels out of the ratios; but the three also share core 1's caches, which may weigh more on B and C (larger working sets: the rules, the list). Medians; ratios per run, median over runs:"
    echo
    awk -F, -v target="$TARGET_RATIO" -v listn="$LIST_SIZE" '
      function median(list,   n, a, i, j, x) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
        if (n == 0) return ""
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
      }
      function add(k, v) { vals[k] = (k in vals) ? vals[k] " " v : v }
      NR > 1 {
        add($2 SUBSEP "rps", $3); add($2 SUBSEP "p50", $6); add($2 SUBSEP "p99", $7); add($2 SUBSEP "cpu", $10)
        add($2 SUBSEP "srv", $11); add($2 SUBSEP "wrk", $12); add($2 SUBSEP "st0", $13); add($2 SUBSEP "st1", $14)
        rps[$1, $2] = $3; cpu[$1, $2] = $10; if ($1 > maxr) maxr = $1
      }
      END {
        desc["A"] = "A: no rules"; desc["B"] = "B: 20 rules + " listn "-entry list"; desc["C"] = "C: B + Basic auth (cached)"
        print "| configuration | req/s | p50 ms | p99 ms | CPU µs/req | srv CPU % | req/s / A | CPU µs/req / A |"
        print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        split("A B C", C, " ")
        for (j = 1; j <= 3; j++) {
          k = C[j]; if (!((k SUBSEP "rps") in vals)) continue
          l = ""; lc = ""
          for (r = 1; r <= maxr; r++) if (((r, k) in rps) && rps[r, "A"] > 0) { l = l " " sprintf("%.6f", rps[r, k] / rps[r, "A"]); lc = lc " " sprintf("%.6f", cpu[r, k] / cpu[r, "A"]); if (k != "A") per[k] = per[k] " " sprintf("%.3f", rps[r, k] / rps[r, "A"]) }
          m[k] = median(l)
          printf "| %s | %.0f | %.3f | %.3f | %.2f | %.0f | %s | %s |\n", desc[k], median(vals[k SUBSEP "rps"]), median(vals[k SUBSEP "p50"]), \
            median(vals[k SUBSEP "p99"]), median(vals[k SUBSEP "cpu"]), median(vals[k SUBSEP "srv"]), \
            (k == "A" ? "1" : sprintf("%.3f", m[k])), (k == "A" ? "1" : sprintf("%.3f", median(lc)))
        }
        printf "\nPer run, req/s / A: B [%s], C [%s]. wrk (all three) %.0f %% of core 0; steal %.1f / %.1f %%. Target on this measure: C at %.2f %% of A: %s.\n", \
          substr(per["B"], 2), substr(per["C"], 2), median(vals["A" SUBSEP "wrk"]), median(vals["A" SUBSEP "st0"]), median(vals["A" SUBSEP "st1"]), 100 * m["C"], (m["C"] >= target ? "**met**" : "**NOT met**")
      }' "$RAW_CONC"
  fi
  echo
  echo "Raw numbers: raw.csv, raw-concurrent.csv and results.json beside this file."
} >"$OUT/results.md"

# results.json: the metadata and every measured run.
awk -F, -v stamp="$STAMP" -v rev="$REV_NOTE" -v cpu="$CPU_MODEL" -v nproc="$(nproc)" \
  -v kernel="$(uname -r)" -v wrk="$WRK_V" -v mesh="$MESH_V" -v listn="$LIST_SIZE" -v size="$SIZE" \
  -v dur="$DURATION" -v rounds="$ROUNDS" -v conns="$CONNS" -v netns="$NETNS_USED" -v cmd="$BENCH_ACCESS_CMD" \
  -v bin="$BIN_NOTE" -v note="$NOTE" -v url="$URL" -v quiet="$QUIET_SPENT" '
  function q(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
  FNR == 1 { file++; n = split($0, H, ","); next }
  { row = ""; for (i = 1; i <= n; i++) { v = $i; if (i != 2 && v == "") v = "null"; row = row (i > 1 ? ", " : "") q(H[i]) ": " (i == 2 ? q(v) : v) }
    if (file == 1) rows = rows (rows == "" ? "" : ",\n") "    {" row "}"
    else crows = crows (crows == "" ? "" : ",\n") "    {" row "}" }
  END {
    printf "{\n  \"date\": %s,\n  \"command\": %s,\n  \"revision\": %s,\n  \"binary\": %s,\n  \"note\": %s,\n  \"meshcache\": %s,\n  \"wrk\": %s,\n", q(stamp), q(cmd), q(rev), q(bin), q(note), q(mesh), q(wrk)
    printf "  \"machine\": {\"nproc\": %d, \"cpu\": %s, \"kernel\": %s},\n", nproc, q(cpu), q(kernel)
    printf "  \"config\": {\"duration_s\": %d, \"rounds\": %d, \"connections\": %d, \"wrk_threads\": 1, \"netns\": %s, \"server_core\": 1, \"wrk_core\": 0, \"object_bytes\": %d, \"url\": %s, \"list_entries\": %d, \"quiet_waited_s\": %d},\n", dur, rounds, conns, q(netns), size, q(url), listn, quiet
    printf "  \"configurations\": {\"A\": \"no rules\", \"B\": \"20 typical rules + domain list\", \"C\": \"B + Basic auth, htpasswd bcrypt user, cached credentials\"},\n"
    printf "  \"runs\": [\n%s\n  ],\n", rows
    printf "  \"concurrent_runs\": [%s%s%s]\n}\n", (crows == "" ? "" : "\n"), crows, (crows == "" ? "" : "\n  ")
  }' "$RAW" "$RAW_CONC" >"$OUT/results.json"

cat "$OUT/results.md"
log "results in $OUT"
