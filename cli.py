"""`python cli.py ...`: the command line's entry point beside the `kvgraft` console script (the commands are in cli/)."""

import sys

from cli import main

if __name__ == "__main__":
    sys.exit(main())
