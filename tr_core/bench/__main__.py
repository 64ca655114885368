"""``python -m tr_core.bench``: the command's entry; the command is :func:`tr_core.bench.cli.main`."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
