"""``python -m fuseval.properties ARGS`` is ``fuseval property ARGS`` (:mod:`fuseval.commands.property`):
the same command, under the CLI's error policy."""
import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["property", *sys.argv[1:]]))
