"""`python -m eventstore`: the same as the `eventstore` command."""

import sys

from eventstore.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
