"""``python -m echo_scheduler.replay``: the replay command (echo_scheduler.replay.cli)."""

import sys

from echo_scheduler.replay.cli import main

if __name__ == "__main__":
    sys.exit(main())
