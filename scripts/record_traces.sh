#!/usr/bin/env bash
# Record the replay's trace set: full-depth, ungated candidate pools of the embedded model and
# its shipped EAGLE head on the three built-in workloads (greedy), as traces/trace-*.json.gz.
#
#   scripts/record_traces.sh [OUT_DIR]     # default: traces/ (12-17 minutes on 2 cores)
#
# The bench records the pools of its global-topk runs (every request drafted to max_depth 8,
# top-3 frontier x 6 children, no gate, no budget cut on drafting); plain runs beside them and
# is not recorded. Rows do not depend on their batch mates under greedy acceptance, so the
# concurrency (4) only sets how long recording takes.
set -euo pipefail
out="${1:-traces}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
.venv/bin/echo-sd bench --policies global-topk --concurrency 4 --rounds 1 --num-prompts 32 \
  --max-tokens 64 --no-plots --projection-steps 1 --projection-batches 64 --no-progress \
  --out "$work"
mkdir -p "$out"
.venv/bin/python - "$work" "$out" <<'PY'
import sys
from pathlib import Path

from echo_lab.sim.trace import load_trace, save_trace

work, out = Path(sys.argv[1]), Path(sys.argv[2])
for path in sorted(work.glob("trace-*.json")):
    steps = load_trace(path)
    save_trace(steps, out / f"{path.name}.gz")
    print(f"{path.stem}: {len(steps)} steps, {sum(s.batch_size for s in steps)} rows")
PY
