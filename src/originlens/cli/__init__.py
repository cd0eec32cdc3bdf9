"""Command-line interface: ``originlens SUBCOMMAND ...`` (see ``originlens --help``)."""
