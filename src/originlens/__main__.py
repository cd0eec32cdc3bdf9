"""``python -m originlens`` (also what ``torchrun -m originlens`` starts): the CLI."""

import sys

from .cli.main import main

sys.exit(main())
