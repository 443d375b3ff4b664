"""The one oracle the attacks on loads, caches and the checked prefix compare with, and
the forger's tool they share.

`truth` is what a session's log alone says: its files (log and archive, no side file)
copied aside and folded by a store that reads and writes no fold cache and keeps no
checked prefix (`bare_store`). Every load any test makes, cold or warm, cached or not,
must equal it: the caches and the checked prefix "only save time, are used only while
they check against the log" (README, Guarantees).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from eventstore import BootstrapState, CorruptLogError, Message, SessionStore
from eventstore.engines.file.layout import SessionPaths
from eventstore.format.chain import line_hash, split_hash


class Folded(NamedTuple):
    """A session's two built-in states, as one load returns them."""

    state: BootstrapState
    transcript: list[Message]


def bare_store(root: Path | str) -> SessionStore:
    """A store on `root` that reads and writes no fold cache and keeps no checked
    prefix: every load folds the log itself, checking every line."""
    return SessionStore(root, caches=False)


def _no_side_files(folder: str, names: list[str]) -> list[str]:
    """Leave out the side files (fold caches, checked prefixes) and anything that is
    neither a file nor a folder (a planted FIFO or socket would hang or fail a copy)."""
    return [
        n
        for n in names
        if n.startswith("fold-")
        or not (os.path.isfile(os.path.join(folder, n)) or os.path.isdir(os.path.join(folder, n)))
    ]


def truth(root: Path, sid: str) -> Folded:
    """A fold of an undamaged copy of the session's files (log and archive, no cache)
    by a `bare_store`."""
    src = SessionPaths(root, sid).dir
    copy = root.parent / f"truth-{os.getpid()}-{id(src)}"
    shutil.rmtree(copy, ignore_errors=True)
    dest = SessionPaths(copy, sid).dir
    dest.parent.mkdir(parents=True, mode=0o700)
    shutil.copytree(src, dest, ignore=_no_side_files)
    try:
        with bare_store(copy) as s:
            return Folded(s.load_bootstrap_state(sid), s.load_transcript_messages(sid))
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def cold_load(root: Path, sid: str) -> Folded:
    """What a fresh store (caches and checked prefix on) loads."""
    with SessionStore(root) as s:
        return Folded(s.load_bootstrap_state(sid), s.load_transcript_messages(sid))


def or_corrupt(fold: Callable[[Path, str], Folded], root: Path, sid: str) -> Any:
    """`fold(root, sid)`, or `CorruptLogError` (the type) if it raises one."""
    try:
        return fold(root, sid)
    except CorruptLogError:
        return CorruptLogError


def rehash(line: bytes, link: str) -> bytes:
    """`line` with its `h` made to check again (a forger's edit, or a bad tool's)."""
    sh = split_hash(line)
    assert sh is not None
    return line[:-18] + line_hash(link, sh[0]).encode() + b'"}'
