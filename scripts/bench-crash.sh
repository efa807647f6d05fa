#!/usr/bin/env bash
# Crash loop of the disk store: ROUNDS rounds (default 20) of load through a `meshcache run`
# process with a disk, SIGKILL at a random moment (0.3-1.2 s into the load), restart, and every
# object stored so far read back and compared byte for byte with the origin's: the test
# `a_node_killed_during_writes_never_serves_a_damaged_object` (crates/meshcache/tests/disk_faults.rs),
# which the suite runs with 3 rounds, run here with more.
#
# Usage: scripts/bench-crash.sh [ROUNDS]
# Prints the test's summary line: kills, objects stored, objects read back (a wrong or truncated
# body fails the run), and how many of those stored more than twice sync_interval (200 ms)
# before a kill were still hits. About 10 s per round.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $rounds -le 200 ]] || { echo "ROUNDS: 1..200" >&2; exit 2; }
MESHCACHE_CRASH_ROUNDS=$rounds cargo test -p meshcache --test disk_faults \
  a_node_killed_during_writes_never_serves_a_damaged_object -- --nocapture 2>&1 |
  grep -E '^crash loop|^test result|panicked|FAILED'
