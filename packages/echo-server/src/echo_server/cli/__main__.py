"""``python -m echo_server.cli``."""

import sys

from echo_server.cli import main

sys.exit(main())
