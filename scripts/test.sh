#!/usr/bin/env bash
# Runs the whole test suite, installing first what the tests talk to (curl, calamaris).
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the interop tests use: command -> package.
declare -A tools=([curl]=curl [calamaris]=calamaris)
missing=()
for cmd in "${!tools[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${tools[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing test tools: ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cargo test --workspace --locked "$@"
