# shellcheck shell=bash
# Helpers shared by scripts/bench-*.sh (sourced, not run). Set BENCH_TAG (the prefix of log and
# error lines) before sourcing. Following shared/BENCHMARKING.md: CPU from /proc/PID/stat of
# whole process trees, steal and busy time from /proc/stat, waiting for a quiet machine, and
# stopping only the processes the script started, by PID.

die() { echo "$BENCH_TAG: $*" >&2; exit 1; }
log() { echo "$BENCH_TAG: $*" >&2; }

# apt-get install the packages whose command is missing. Argument: the name of an associative
# array command -> package.
bench_install_missing() {
  local -n _need=$1
  local sudo="" cmd missing=()
  [ "$(id -u)" = 0 ] || sudo="sudo"
  for cmd in "${!_need[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("${_need[$cmd]}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# The repository's revision, noting uncommitted changes to tracked files.
bench_revision() { # repo
  local rev dirty
  rev=$(git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  [ "$dirty" = 0 ] || rev="$rev + uncommitted changes in $dirty files"
  echo "$rev"
}

# "PATH, built TIME, sha256 PREFIX" of a binary (noted at start: a concurrent cargo build may
# replace the file while the benchmark runs).
bench_binary_note() { # bin
  echo "$1, built $(date -u -r "$1" +%Y-%m-%dT%H:%M:%SZ), sha256 $(sha256sum "$1" | cut -c1-12)"
}

# Re-runs the script inside a fresh network namespace (only its own traffic on lo), unless the
# variable named VAR is set (we are inside already). Returns when unshare is not available.
bench_enter_netns() { # VAR script args...
  local var=$1
  shift
  [ -z "${!var:-}" ] || return 0
  if unshare -n true 2>/dev/null && command -v ip >/dev/null; then
    export "$var=1"
    exec unshare -n -- bash "$@"
  fi
  log "unshare -n unavailable: running in the host's network namespace"
}

# Stops the given PIDs (processes this script started): SIGTERM in reverse order, up to 5 s
# for them to exit, then SIGKILL, and reaps them.
bench_stop_pids() { # pid...
  local pid i alive
  for ((i = $#; i >= 1; i--)); do kill -TERM "${!i}" 2>/dev/null || true; done
  for ((i = 0; i < 50; i++)); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

tree_ticks() { # utime+stime+cutime+cstime of each PID and all its live descendants (all threads), summed
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v roots="$*" '
    { pid = $1; n = split($0, part, "[)] "); split(part[n], f, " ")
      par[pid] = f[2]; tk[pid] = f[12] + f[13] + f[14] + f[15] }
    END { n = split(roots, r, " "); for (i = 1; i <= n; i++) tree[r[i]] = 1; grew = 1
          while (grew) { grew = 0; for (p in par) if (!(p in tree) && (par[p] in tree)) { tree[p] = 1; grew = 1 } }
          s = 0; for (p in tree) if (p in tk) s += tk[p]; print s }'
}
cpu_stat() { # "steal0 total0 busy0 steal1 total1 busy1" from /proc/stat (ticks); busy = user..softirq
  awk '$1 == "cpu0" || $1 == "cpu1" { t = 0; for (i = 2; i <= 9; i++) t += $i; v[$1] = $9 " " t " " ($2 + $3 + $4 + $7 + $8) }
       END { print v["cpu0"], v["cpu1"] }' /proc/stat
}
SELF_CT=0
self_child_ticks() { # cutime+cstime of this shell (children it has waited for); no fork
  local s
  read -r s </proc/$$/stat
  s=${s##*) }
  # shellcheck disable=SC2086
  set -- $s
  SELF_CT=$((${14} + ${15}))
}
to_ms() { # wrk duration ("812.00us", "1.23ms", "1.02s", "2.00m") -> ms
  awk -v v="$1" 'BEGIN { u = v; sub(/^[0-9.]+/, "", u); x = v + 0
    if (u == "us") x /= 1000; else if (u == "s") x *= 1000; else if (u == "m") x *= 60000; else if (u == "h") x *= 3600000
    printf "%.3f", x }'
}

# On a shared machine other work (a compiler, a test suite) steals the cores the benchmark
# pins to. Before a measured run, wait (within the budget) until the machine is quiet: both
# cores together less than OTHER_MAX % of one core busy over one second. Uses CLK_TCK,
# OTHER_MAX, QUIET_BUDGET and QUIET_SPENT (seconds spent so far, updated).
busy_ticks() { awk '$1 == "cpu0" || $1 == "cpu1" { b += $2 + $3 + $4 + $7 + $8 } END { print b }' /proc/stat; }
wait_quiet() {
  local b0 b1 pct t0=$EPOCHSECONDS waited=0
  while [ "$QUIET_SPENT" -lt "$QUIET_BUDGET" ]; do
    b0=$(busy_ticks); sleep 1; b1=$(busy_ticks)
    pct=$(((b1 - b0) * 100 / CLK_TCK))
    [ "$pct" -le "$OTHER_MAX" ] && break
    [ $waited = 1 ] || log "machine busy ($pct% of a core used by others): waiting (budget left $((QUIET_BUDGET - QUIET_SPENT)) s)"
    waited=1
    QUIET_SPENT=$((QUIET_SPENT + 1))
  done
  [ $waited = 0 ] || log "waited $((EPOCHSECONDS - t0)) s for a quiet machine"
}
