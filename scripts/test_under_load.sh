#!/usr/bin/env bash
# `make test` N times in a row (default 3) while a CPU hog (`yes > /dev/null`) holds one core:
# the suite must stay green on a busy machine (issue #47). Prints one line per run.
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
yes > /dev/null &
HOG=$!
trap 'kill $HOG 2>/dev/null' EXIT
for i in $(seq 1 "$N"); do
  start=$(date +%s)
  make test > "test-under-load-$i.log" 2>&1
  rc=$?
  echo "run $i: rc=$rc $(( $(date +%s) - start )) s $(grep -E '[0-9]+ passed' "test-under-load-$i.log" | tail -1)"
done
