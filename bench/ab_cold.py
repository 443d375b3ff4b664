"""Cold loads (or appends) by two checkouts of eventstore, interleaved in fresh processes.

    python -m bench.ab_cold OLD_CHECKOUT [NEW_CHECKOUT] [--turns 500,2000,10000] [--runs 9]
                            [--load transcript|bootstrap|appends|first-append|close]
                            [--after-copy]

Builds each size's session once for each side, with that side's code (the log format is
the same, but a side's fold caches may be of a format the other ignores: a session built
by one side would make the other fold its whole log), then alternates OLD and NEW (NEW
defaults to this checkout): each run is a fresh
interpreter that imports that checkout, opens the store and times the first load (a
bootstrap load first, as in `python -m bench`, for the transcript). `--load appends`
builds nothing: each run writes the whole reference workload of that size into a new
store (flush durability) and reports microseconds per operation. Prints medians and
spreads (min-max) of each and NEW/OLD: drift on a shared machine hits both alike.
`--load first-append` times the first append of a fresh process to the built session
(what a process that writes once pays: since tombstones, every write knows whether the
session was deleted). `--load close` builds nothing: each run writes the workload of that
size into a new store, as `--load appends` does, and times the writer's `close()` (where
the fold caches are saved: the transcript's costs about the log's size). `--after-copy`
(transcript and bootstrap loads): each run loads and closes the built store (saving its
caches, in that checkout's format), copies it with `shutil.copytree` (every file a new
inode) and times the first load of the copy: what a restored backup or a copied store
pays. `--postgres` (transcript and bootstrap loads): each side's store is a fresh
schema of the PostgreSQL server `--url` names (default $EVENTSTORE_BENCH_POSTGRES_URL,
then $EVENTSTORE_TEST_POSTGRES_URL), dropped afterwards. For a change's
effect, check out the commit before it elsewhere (`git worktree add /tmp/old HEAD~1`)
and pass that path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import server_url
from bench.places import drop_schema, with_schema

SID = "bench-session"

_RUN = """
import sys, time
sys.path.insert(0, {src!r})
from eventstore import SessionStore
s = SessionStore({root!r}); s.load_bootstrap_state({sid!r}); s.close()
s = SessionStore({root!r})
t = time.perf_counter()
s.{method}({sid!r})
print(time.perf_counter() - t)
"""

_AFTER_COPY = """
import shutil, sys, tempfile, time
sys.path.insert(0, {src!r})
from eventstore import SessionStore
s = SessionStore({root!r}); s.load_bootstrap_state({sid!r}); s.{method}({sid!r}); s.close()
with tempfile.TemporaryDirectory() as tmp:
    copy = shutil.copytree({root!r}, tmp + "/store")
    s = SessionStore(copy)
    t = time.perf_counter()
    s.{method}({sid!r})
    print(time.perf_counter() - t)
    s.close()
"""

_FIRST_APPEND = """
import sys, time
sys.path.insert(0, {src!r})
from eventstore import ProgressEntry, SessionStore
s = SessionStore({root!r})
t = time.perf_counter()
s.append_progress_entry({sid!r}, ProgressEntry(run_id="bench", summary="one more"))
print(time.perf_counter() - t)
s.close()
"""

_APPENDS = """
import sys, tempfile, time
sys.path.insert(0, {src!r})
from eventstore import SessionStore
from bench.workload import Workload, apply_op
ops = Workload({turns}).ops
with tempfile.TemporaryDirectory() as root, SessionStore(root) as s:
    t = time.perf_counter()
    for op in ops:
        apply_op(s, {sid!r}, op)
    print((time.perf_counter() - t) / len(ops) * 1e3)
"""

_CLOSE = """
import sys, tempfile, time
sys.path.insert(0, {src!r})
from eventstore import SessionStore
from bench.workload import Workload, apply_op
ops = Workload({turns}).ops
with tempfile.TemporaryDirectory() as root:
    s = SessionStore(root)
    for op in ops:
        apply_op(s, {sid!r}, op)
    t = time.perf_counter()
    s.close()
    print(time.perf_counter() - t)
"""


_BUILD = """
import sys
sys.path.insert(0, {src!r})
from eventstore import SessionStore
from bench.workload import Workload, apply_op
with SessionStore({root!r}) as s:
    for op in Workload({turns}).ops:
        apply_op(s, {sid!r}, op)
"""


def _build(src: Path, root: Path | str, turns: int) -> None:
    """The workload's session of `turns` in `root`, written by checkout `src`'s code."""
    code = _BUILD.format(src=str(src), root=str(root), turns=turns, sid=SID)
    subprocess.run([sys.executable, "-c", code], check=True)


def _cold(src: Path, root: Path | str, method: str, after_copy: bool = False) -> float:
    if isinstance(root, str):  # a store URL: a load only (`--postgres`)
        code = _RUN.format(src=str(src), root=root, sid=SID, method=method)
    elif after_copy:
        code = _AFTER_COPY.format(src=str(src), root=str(root), sid=SID, method=method)
    elif method in ("appends", "close"):  # root's name is the size
        code = (_APPENDS if method == "appends" else _CLOSE).format(
            src=str(src), turns=int(root.name), sid=SID
        )
    elif method == "first-append":
        code = _FIRST_APPEND.format(src=str(src), root=str(root), sid=SID)
    else:
        code = _RUN.format(src=str(src), root=str(root), sid=SID, method=method)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


def _spread(times: list[float]) -> str:
    return f"{min(times):.2f}-{max(times):.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab_cold", description=__doc__)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parents[1])
    ap.add_argument("--turns", default="500,2000,10000")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument(
        "--load",
        choices=["transcript", "bootstrap", "appends", "first-append", "close"],
        default="transcript",
    )
    ap.add_argument("--after-copy", action="store_true")
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--url", default=None)
    a = ap.parse_args(argv)
    if (a.after_copy or a.postgres) and a.load not in ("transcript", "bootstrap"):
        ap.error("--after-copy and --postgres time a load: --load transcript or bootstrap")
    if a.after_copy and a.postgres:
        ap.error("--after-copy copies a store of files: not with --postgres")
    pg = server_url(ap, a.url, "POSTGRES") if a.postgres else None
    if a.load == "appends":
        method, unit = "appends", "us per op"
        print(f"appends, {a.runs} runs each, interleaved; NEW = {a.new}, OLD = {a.old}\n")
    elif a.load == "first-append":
        method, unit = "first-append", "ms"
        print(f"first append, {a.runs} runs each, interleaved; NEW = {a.new}, OLD = {a.old}\n")
    elif a.load == "close":
        method, unit = "close", "ms"
        print(f"close after the workload, {a.runs} runs each, interleaved; ", end="")
        print(f"NEW = {a.new}, OLD = {a.old}\n")
    else:
        method = f"load_{a.load}_{'messages' if a.load == 'transcript' else 'state'}"
        unit = "ms"
        copied = " of a copied store" if a.after_copy else ""
        print(
            f"cold {method}{copied}, {a.runs} runs each, interleaved;"
            f" NEW = {a.new}, OLD = {a.old}\n"
        )
    print(f"| turns | OLD median {unit} (min-max) | NEW median {unit} (min-max) | NEW / OLD |")
    print("|---:|---:|---:|---:|")
    for turns in (int(t) for t in a.turns.split(",")):
        tmp = Path(tempfile.mkdtemp(prefix="ab-cold-"))
        schemas = {k: f"abcold_{k}_{turns}_{os.getpid()}" for k in ("old", "new")}
        try:
            roots: dict[str, Path | str] = {
                k: tmp / k / str(turns) if pg is None else with_schema(pg, schemas[k])
                for k in ("old", "new")
            }
            if method not in ("appends", "close"):
                for name, src in (("old", a.old), ("new", a.new)):
                    _build(src, roots[name], turns)
            times: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(a.runs):
                for name, src in (("old", a.old), ("new", a.new)):
                    times[name].append(_cold(src, roots[name], method, a.after_copy) * 1e3)
            old, new = (statistics.median(times[k]) for k in ("old", "new"))
            print(
                f"| {turns:,} | {old:.2f} ({_spread(times['old'])}) |"
                f" {new:.2f} ({_spread(times['new'])}) | {new / old:.2f}× |"
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            for schema in schemas.values() if pg is not None else ():
                drop_schema(pg, schema)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
