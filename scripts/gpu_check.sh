#!/usr/bin/env bash
# The first-GPU acceptance run of issue 18, on one H100/H200 in at most 9.5 minutes:
#   scripts/gpu_check.sh [--dry-run] [--out PATH]
# Needs only torch, triton, transformers, grpcio and pytest: the ECHO packages run from their
# src/ directories (no pip install) and the small pure-Python wheels they need beyond those
# (structlog) are carried in scripts/gpu_wheels and imported straight from the .whl files.
# --dry-run (the CPU, CI via `make test`) collects the GPU tier, imports every module it needs
# and runs the engine and attention parts at tiny sizes on the CPU. Prints the summary's path.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
path="$repo/scripts"
for src in "$repo"/packages/*/src; do path="$path:$src"; done
for whl in "$repo"/scripts/gpu_wheels/*.whl; do [ -e "$whl" ] && path="$path:$whl"; done
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
limit=570
for arg in "$@"; do [ "$arg" = "--dry-run" ] && limit=150; done
exec timeout --kill-after=10 "$limit" "$py" -m gpu_check "$@"
