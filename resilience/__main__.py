import sys

from .commands.cli import main

if __name__ == "__main__":  # multiprocessing re-imports the main module in forked ranks
    sys.exit(main())
