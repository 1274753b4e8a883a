"""``python -m echo_lab.replay``: the replay command (echo_lab.replay.cli)."""

import sys

from echo_lab.replay.cli import main

if __name__ == "__main__":
    sys.exit(main())
