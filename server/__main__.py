"""`python -m server ...`: the same as `goodspeed serve ...`."""

import sys

from server.cli import main

if __name__ == "__main__":
    sys.exit(main())
