"""Side-by-side benchmarks of eventstore against what harnesses would use instead.

`python -m bench` runs every backend on a deterministic harness workload and prints one
markdown table; `python -m bench --check` proves every backend gives the same answers.
See bench/README.md.
"""

import argparse
import os


def server_url(parser: argparse.ArgumentParser, given: str | None, server: str) -> str:
    """The URL of the `server` ("POSTGRES", "REDIS") a bench talks to: `--url` (`given`),
    else $EVENTSTORE_BENCH_<server>_URL, else $EVENTSTORE_TEST_<server>_URL (the one the
    test scripts export); an argparse error if none is set."""
    url = (
        given
        or os.environ.get(f"EVENTSTORE_BENCH_{server}_URL")
        or os.environ.get(f"EVENTSTORE_TEST_{server}_URL")
    )
    if not url:
        parser.error(f"give --url (or set EVENTSTORE_BENCH_{server}_URL)")
    return url
