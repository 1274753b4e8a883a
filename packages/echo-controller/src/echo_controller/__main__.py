"""``python -m echo_controller``: the same as the ``echo-controller`` console script."""

import sys

from echo_controller.cli import main

if __name__ == "__main__":
    sys.exit(main())
