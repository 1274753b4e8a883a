#!/usr/bin/env bash
# GPU check of echo-kernels (issue 5). Run from the repository root on a CUDA machine that has
# torch, triton and pytest (nothing else is needed: the ECHO packages come from the checkout).
#   1. the GPU tier (tests/gpu, marked gpu): real sizes vs the torch references;
#   2. the package's "Triton vs reference" tier, compiled on the GPU instead of interpreted;
#   3. the benchmark: ragged tree attention vs padded SDPA vs per-request SDPA loops.
# Budget: under 5 minutes on one H200 (compilation included).
set -euo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH="packages/echo-core/src:packages/echo-kernels/src${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET
date -u +"gpu_check %Y-%m-%dT%H:%M:%SZ"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
python -m pytest -q -p no:cacheprovider -m gpu tests/gpu
python -m pytest -q -p no:cacheprovider packages/echo-kernels/tests
python packages/echo-kernels/scripts/bench_tree_attention.py --device cuda --dtype bfloat16
