#!/usr/bin/env bash
# Open-loop comparison of a plain-decoding node and an ECHO node on this machine (docs/SERVING.md).
#
# Starts both nodes (embedded model, HTTP API only, one torch thread each, the same max batch),
# waits until both are ready, runs `echo-sd bench-serve` against them in interleaved rounds and
# stops them. Extra arguments go to bench-serve, e.g.:
#   scripts/bench_serve_pair.sh --rate 0.2 --rate 1 --num-prompts 10 --max-tokens 64 --rounds 3
set -euo pipefail
cd "$(dirname "$0")/.."
SD=${SD:-.venv/bin/echo-sd}
WORK=$(mktemp -d)
MAX_BATCH=${MAX_BATCH:-8}
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
for policy in plain echo; do
  "$SD" --log-level warning serve --policy "$policy" --no-grpc --http-listen 127.0.0.1:0 \
    --threads 1 --max-batch "$MAX_BATCH" --ready-file "$WORK/$policy.json" >"$WORK/$policy.log" 2>&1 &
done
for _ in $(seq 300); do
  [ -f "$WORK/plain.json" ] && [ -f "$WORK/echo.json" ] && break
  sleep 1
done
port() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['http_port'])" "$1"; }
PLAIN=$(port "$WORK/plain.json")
ECHO=$(port "$WORK/echo.json")
"$SD" bench-serve --endpoint "plain=http://127.0.0.1:$PLAIN" --endpoint "echo=http://127.0.0.1:$ECHO" "$@"
