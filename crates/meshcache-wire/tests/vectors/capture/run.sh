#!/usr/bin/env bash
# Reproduce tests/vectors/*.hex: run capture_squid.py inside a private network namespace
# (loopback only, so nothing on the host can clash or be reached). Needs root (unshare -n),
# Debian's squid (5.7-2+deb12u6), curl and python3.
#
# Three Squid runs, each a fresh process: the main one (sibling queries + every query case
# except version 3), then one run per version-3 case, because Squid 5.7-2+deb12u6 dies with a
# segmentation fault right after answering an ICP v3 query (see ../README.md).
#
# Usage: run.sh OUTDIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run.sh OUTDIR}
mkdir -p "$out"
for only in "" version-3 version-3-hit; do
  timeout 300 unshare -n bash -c \
    "ip link set lo up && python3 '$here/capture_squid.py' --out '$out' ${only:+--only $only}"
done
