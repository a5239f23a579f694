"""Entry point: ``python -m analysis [COMMAND] RUNS... --out DIR`` (see ``--help``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
