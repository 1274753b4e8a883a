"""``python -m echo_scheduler.replay``: the replay command (echo_scheduler.replay.cli)."""

import sys

from echo_scheduler.replay.cli import main

sys.exit(main())
