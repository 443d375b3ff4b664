"""Instructions per append, counted by valgrind's callgrind: an A/B that noise cannot move.

    python -m bench.instructions OLD_CHECKOUT [NEW_CHECKOUT] [--appends 2000]

On a shared machine the time of one append moves by ±30 % from minute to minute, more
than most changes to the hot path. The number of instructions the process executes in
user space does not: callgrind counts them exactly. Each checkout runs twice under
callgrind, once opening a store and appending one turn (two messages, ~1.7 kB, as
`python -m bench` writes), once doing the same and then APPENDS more; the difference over
APPENDS is one append's instructions, start-up excluded. System calls run in the
kernel and are not counted (an append makes five), nor is time waiting for the disk; and
valgrind's emulated CPU has no SHA extensions, so OpenSSL's SHA-256 counts several times
what it costs natively. Use it to compare Python-level changes, `python -m bench` for
what an append costs. Runs with `PYTHONHASHSEED=0` and the session index's lag out of the
way, so that two runs of one checkout agree. Needs `valgrind` on the PATH.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# the session index's 1-second lag out of the way: under valgrind an append takes ~50x
# longer, so the rows it writes would follow the machine's load (harmless in a checkout
# from before the index)
_RUN = """
import sys, tempfile
sys.path.insert(0, {src!r})
import eventstore.engines.file.engine as _engine
_engine.INDEX_LAG = 1e9  # where checkouts before eventstore.engines.file.index_lag kept it
try:
    import eventstore.engines.file.index_lag as _lag
    _lag.INDEX_LAG = 1e9
except ImportError:
    pass
from eventstore import Message, Role, SessionStore
with tempfile.TemporaryDirectory() as root, SessionStore(root) as store:
    turn = [Message(Role.USER, "u" * 254), Message(Role.ASSISTANT, "a" * 1439)]
    store.append_transcript_messages("s", turn)
    for _ in range({n}):
        store.append_transcript_messages("s", turn)
"""


def instructions(src: Path, n: int) -> int:
    """Instructions callgrind counts for a process that opens a store in checkout `src`
    and appends 1 + `n` turns."""
    code = _RUN.format(src=str(src), n=n)
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dict layouts in every run
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{out.stderr}")
    return int(found.group(1))


def per_append(src: Path, n: int) -> float:
    """One append's instructions in checkout `src` (start-up excluded)."""
    return (instructions(src, n) - instructions(src, 0)) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parents[1])
    ap.add_argument("--appends", type=int, default=2000)
    a = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (e.g. apt-get install valgrind)", file=sys.stderr)
        return 2
    old, new = per_append(a.old, a.appends), per_append(a.new, a.appends)
    print(f"instructions per append, {a.appends} appends; NEW = {a.new}, OLD = {a.old}\n")
    print("| OLD | NEW | NEW / OLD |")
    print("|---:|---:|---:|")
    print(f"| {old:,.0f} | {new:,.0f} | {new / old:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
