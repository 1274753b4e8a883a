#!/usr/bin/env bash
# Build the CPU SGLang serving environment: its own venv, the exported embedded model and ECHO's
# head as an SGLang draft. Idempotent; ~3 GB and 2-4 minutes on a fresh machine.
#
#   bash scripts/sglang/setup_env.sh            (default venv: .cache/sglang-venv)
#
# - torch==2.13.0 (the CPU wheel) first, then held by a constraint file for every later pip call;
# - SGLang's pure-Python and small binary dependencies from scripts/sglang/requirements-cpu.txt
#   (pinned), sglang==0.5.23 with --no-deps (it pins CUDA torch 2.14.1 and GPU kernels);
# - echo-sgl-kernel-cpu (packages/echo-sgl-kernel: the `sgl_kernel` ops SGLang's CPU path calls,
#   in torch) and the ECHO plugin with its libraries, editable;
# - a torchvision stand-in on the venv's path (PyPI's torchvision is a CUDA build that fails to
#   import beside the CPU torch; only SGLang's multimodal modules import it);
# - .cache/sglang-model (the embedded SmolLM2 as an HF directory, float32) and .cache/sglang-head
#   (ECHO's shipped head as an SGLang draft), written by the project's own venv (make setup).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV="${ECHO_SGLANG_VENV:-$ROOT/.cache/sglang-venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.echo-sglang-stamp"
INPUTS=(scripts/sglang/setup_env.sh scripts/sglang/requirements-cpu.txt
  packages/echo-sgl-kernel/pyproject.toml packages/echo-sglang/pyproject.toml)

mkdir -p "$ROOT/.cache"
[ -f "$ROOT/.cache/.gitignore" ] || echo '*' > "$ROOT/.cache/.gitignore"

fresh=1
if [ -f "$STAMP" ]; then
  for f in "${INPUTS[@]}"; do [ "$f" -nt "$STAMP" ] && fresh=0; done
else
  fresh=0
fi

if [ "$fresh" = 0 ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  PY="$VENV/bin/python"
  "$PY" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=25"
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install --quiet torch==2.13.0
  TORCH_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('torch'))")
  echo "torch==$TORCH_VERSION" > "$VENV/constraints.txt"
  export PIP_CONSTRAINT="${PIP_CONSTRAINT:+$PIP_CONSTRAINT }$VENV/constraints.txt"
  [ -f /etc/xdg/pip/constraints.txt ] && PIP_CONSTRAINT="/etc/xdg/pip/constraints.txt $PIP_CONSTRAINT"
  "$PY" -m pip install --quiet --disable-pip-version-check -r scripts/sglang/requirements-cpu.txt
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps sglang==0.5.23
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
    -e packages/echo-core -e packages/echo-gating -e packages/echo-scheduler \
    -e packages/echo-sglang -e packages/echo-sgl-kernel
  SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$ROOT/scripts/sglang/standin" > "$SITE/echo-torchvision-standin.pth"
  "$PY" -c "import torch; assert torch.__version__.split('+')[0] == '$TORCH_VERSION'.split('+')[0]"
  touch "$STAMP"
fi

# The model and the head come from the project's venv (echo-server reads the GGUF).
PROJECT_PY="${ECHO_PROJECT_PYTHON:-$ROOT/.venv/bin/python}"
"$PROJECT_PY" scripts/sglang/export_model.py .cache/sglang-model
"$PROJECT_PY" scripts/sglang/export_head.py .cache/sglang-head
echo "sglang env: ok ($VENV)"
