"""The lab's ``echo-sd`` subcommands. Each module has ``add_parser(subparsers)`` and
``run(args) -> int``; they are registered in echo-lab's ``pyproject.toml`` under the
``echo_sd.commands`` entry-point group, which ``echo-sd`` reads at start-up."""
