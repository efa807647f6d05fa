#!/usr/bin/env bash
# Runs the whole test suite, installing first what the tests talk to (curl, calamaris, and
# Squid and tshark for the ICP interop tests in crates/meshcache/tests/squid.rs; Squid's auth
# helpers and Apache's htpasswd for crates/meshcache-auth's tests; iproute2 for the access test
# run in a network namespace of its own; a DejaVu font for the lab's PNG graphs).
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the interop tests use: command -> package.
declare -A tools=([curl]=curl [calamaris]=calamaris [squid]=squid [tshark]=tshark [htpasswd]=apache2-utils [ip]=iproute2)
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
missing=()
for cmd in "${!tools[@]}"; do
  have "$cmd" || missing+=("${tools[$cmd]}")
done
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing test tools: ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  # Debian's squid package starts a system squid (on *:3128, pid in /run/squid.pid) where it
  # can. The tests run their own Squids on other addresses and ports; keep the package's one
  # from starting (policy-rc.d), and stop it below if it started anyway.
  pidfile=/run/squid.pid
  before=$(cat "$pidfile" 2>/dev/null || true)
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    made_policy=1
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    trap '$sudo rm -f "$policy"' EXIT
  fi
  $sudo apt-get update -qq
  # tshark asks whether non-root users may capture: noninteractive answers no (tests run as root).
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  if [ "$made_policy" = 1 ]; then
    $sudo rm -f "$policy"
    trap - EXIT
  fi
  after=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$after" ] && [ "$after" != "$before" ] && [ "$(cat "/proc/$after/comm" 2>/dev/null)" = squid ]; then
    echo "stopping the system squid the package started (pid $after)"
    $sudo kill "$after" || true
  fi
fi

# The suite's totals close the output: one line summing every test binary's result.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"
exit "$status"
