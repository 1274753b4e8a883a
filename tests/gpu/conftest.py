"""GPU tier: tests that need a CUDA device (marked ``gpu``, skipped without one).

Triton 3.9 warns once per process when TRITON_DEFAULT_FP_FUSION is unset, and the suite turns
warnings into errors; pin the current default (fusion on) explicitly before triton loads.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
