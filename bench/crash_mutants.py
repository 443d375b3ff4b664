"""Mutation test of the crash-state explorer: drop each flush or directory sync in turn.

Each mutant is a copy of the checkout with one statement that flushes a file or syncs a
directory (`fsync_dir(...)`, `datasync(...)`, `os.fsync(...)`, `os.fdatasync(...)`, or
a `fsync=True` argument) in the file engine and the harness map replaced by nothing.
The explorer (`tests/test_crash_states.py`) runs against each copy: a mutant is killed
when a test fails, survives when every test passes. A survivor is either a flush the
recorded paths do not need (its reason is in `NOT_NEEDED`) or a gap in the explorer.

    python -m bench.crash_mutants --list                 # the mutants, numbered
    python -m bench.crash_mutants 3 7 -k "append"        # mutants 3 and 7, some tests
    python -m bench.crash_mutants                        # all of them (hours of CPU)

`-k` is passed to pytest (the whole explorer by default, stopping at the first failure).
Prints one line per mutant: killed / survived, the test that killed it or the reason
it is not needed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FILES = [
    *sorted((REPO / "eventstore" / "engines" / "file").glob("*.py")),
    REPO / "eventstore" / "harness_sessions.py",
]
_STATEMENT = re.compile(r"^(\s*)(fsync_dir|datasync|os\.fsync|os\.fdatasync)\(.*\)\s*$")
_ARGUMENT = re.compile(r"fsync=True")

# mutants the explorer lets live, and why the flush is not needed on the recorded
# paths (keyed by "file:function:statement", stable across line moves)
NOT_NEEDED = {
    "journal.py:create:write_all(fd, bytes(DATA_AT + SIZE), fsync=True)": (
        "the journal's zeros: the first mirror write's fdatasync flushes the same inode"
    ),
    "journal.py:_write_header:datasync(fd)": (
        "the header: the mirror's fdatasync on the same inode flushes it before any ack"
    ),
    "recovery.py:set_aside_torn:os.fsync(fd)": (
        "the torn-tail cut: the append after it flushes the log (its own fdatasync)"
    ),
    "layout.py:datasync:os.fsync(fd)": (
        "the fallback for platforms without fdatasync (macOS): never runs on Linux, where"
        " the explorer records"
    ),
    "recovery.py:copy_back:datasync(fd)": (
        "the copied-back bytes: the journal keeps them until `retire_journal` flushes the"
        " log (its own datasync(log_fd)) and only then retires the epoch"
    ),
    "snapshot.py:_name_archive:fsync_dir(paths.archive)": (
        "compaction's final archive name: the pending link is durable, and recovery"
        " gives it its final name"
    ),
    "keys.py:remove_slot:fsync_dir(path.parent)": (
        "a purge's removal of the forgotten key slot: one a power loss brings back holds"
        " no key (only the shred's time), and the id's next first write removes it again"
        " (`SessionKeys.for_writing(first=True)` calls `free_slot`); the 'encrypted purge'"
        " workload writes the purged id again in every state after the purge returned"
    ),
}


@dataclass(frozen=True)
class Mutant:
    path: Path
    line: int  # 1-based
    function: str
    statement: str

    @property
    def key(self) -> str:
        return f"{self.path.name}:{self.function}:{self.statement}"

    def apply(self, text: str) -> str:
        lines = text.split("\n")
        old = lines[self.line - 1]
        m = _STATEMENT.match(old)
        if m:
            lines[self.line - 1] = f"{m[1]}pass  # mutant: {old.strip()}"
        else:
            lines[self.line - 1] = old.replace("fsync=True", "fsync=False")
        return "\n".join(lines)


def mutants() -> list[Mutant]:
    found = []
    for path in FILES:
        function = ""
        for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            d = re.match(r"\s*def (\w+)", line)
            if d:
                function = d[1]
            if _STATEMENT.match(line) or _ARGUMENT.search(line):
                found.append(Mutant(path, i, function, line.strip()))
    return found


def run(m: Mutant, keyword: str | None) -> tuple[bool, str]:
    """(killed, the first failing test or ''), the explorer run on a mutated copy."""
    with tempfile.TemporaryDirectory(prefix="eventstore-mutant-") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv", ".git", "*.pyc"))
        target = copy / m.path.relative_to(REPO)
        target.write_text(m.apply(target.read_text(encoding="utf-8")), encoding="utf-8")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        cmd += ["tests/test_crash_states.py", *(["-k", keyword] if keyword else [])]
        env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"}
        out = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True).stdout
        failed = re.findall(r"^FAILED (\S+)", out, re.M)
        return bool(failed), failed[0] if failed else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("numbers", nargs="*", type=int, help="mutants to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("-k", dest="keyword", help="pytest -k expression")
    args = p.parse_args(argv)
    found = mutants()
    if args.list:
        for n, m in enumerate(found):
            print(f"{n:3} {m.path.name}:{m.line} {m.function}: {m.statement}")
        return 0
    survivors = 0
    for n in args.numbers or range(len(found)):
        m = found[n]
        killed, by = run(m, args.keyword)
        if killed:
            print(f"{n:3} killed   {m.key}  by {by}", flush=True)
        else:
            why = NOT_NEEDED.get(m.key)
            survivors += why is None
            print(
                f"{n:3} survived {m.key}  {'(not needed: ' + why + ')' if why else 'UNEXPLAINED'}"
            )
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
