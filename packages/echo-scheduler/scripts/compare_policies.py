"""Run every policy side by side on one synthetic trace (see echo_scheduler.compare)."""

from __future__ import annotations

import sys

from echo_scheduler.compare import main

if __name__ == "__main__":
    sys.exit(main())
