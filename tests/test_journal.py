"""The file engine's journal (`durability="fsync"`, eventstore/engines/file/journal.py):
an append flushes the preallocated mirror, not the growing log; what a power loss took
from the log and the journal acknowledged is read back by every reader (laid over the log
in memory: readers never write) and copied back by the next writer, under the writers'
lock, before it changes anything; nothing else is ever changed by it.

Power losses are modelled here by cutting the log (or zeroing a range of it) the way a
crash can leave it; `tests/test_crash_states.py` explores every crash state of the
real system calls under two persistence models.
"""

from __future__ import annotations

import errno
import fcntl
import http.client
import logging
import os
import random
import re
import select
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process, in_forked_child, log_path, make_entry, wait_child

from eventstore import (
    BootstrapState,
    CorruptLogError,
    EventStoreError,
    Message,
    Role,
    SessionStore,
    StorageError,
    Tuning,
)
from eventstore.engines.file import journal as file_journal
from eventstore.engines.file.layout import SessionPaths
from eventstore.ops.repair import repair
from eventstore.report.server import HOST, ReportServer

SID = "s"


def _append(root: Path, n: int, first: int = 0) -> SessionStore:
    """A durable store that appended turns `first`.. `first + n`, left open."""
    s = SessionStore(root, durability="fsync")
    for i in range(first, first + n):
        s.append_transcript_messages(SID, _turn(f"m{i}"))
    return s


def _write(root: Path, n: int, first: int = 0) -> None:
    """`_append` in a process that ends without closing its store (killed, or the
    machine lost power): its epoch is left for the next process to check."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _append(root, n, first)
            code = 0
        finally:
            os._exit(code)
    assert wait_child(pid, 60) == 0


def _epoch(root: Path) -> file_journal.Epoch | None:
    fd = os.open(SessionPaths(root, SID).journal, os.O_RDONLY)
    try:
        return file_journal.read_epoch(fd)
    finally:
        os.close(fd)


def _contents(root: Path) -> list[str]:
    """The transcript a new process reads, with no fold cache (the log itself)."""
    with SessionStore(root, caches=False) as s:
        return [m.content.split(" ")[0] for m in s.load_transcript_messages(SID)]


def _next_writer_settles(root: Path) -> None:
    """The writers' part of recovery after a power loss: the next writer (here a
    `repair`, which finds the log whole) copies back, under the writers' lock, what the
    log lost and the journal kept. Readers never write: they read it in memory."""
    with SessionStore(root, durability="fsync") as s:
        repair(s, SID)


def _power_loss(root: Path, keep: int) -> None:
    """The log keeps its first `keep` bytes; caches go (they could vouch for more)."""
    log = log_path(root, SID)
    os.truncate(log, keep)
    for p in log.parent.glob("fold-*.cache"):
        p.unlink()


def test_an_append_flushes_the_mirror_and_the_log_once_an_epoch(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _append(root, 1)
    flushed: Counter[str] = Counter()
    real = os.fdatasync

    def counting(fd: int) -> None:
        flushed[os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))] += 1
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    for i in range(1, 401):
        store.append_transcript_messages(SID, _turn(f"m{i}"))
    monkeypatch.undo()
    store.close()
    # ~1.5 kB a line, 256 KiB an epoch: the log is flushed once every ~160 appends
    assert flushed["log.journal"] >= 398
    assert 1 <= flushed["log.jsonl"] <= 400 * 1600 // file_journal.SIZE + 2
    assert os.lstat(SessionPaths(root, SID).journal).st_mode & 0o777 == 0o600
    assert (
        os.path.getsize(SessionPaths(root, SID).journal) == file_journal.DATA_AT + file_journal.SIZE
    )


def test_a_log_cut_anywhere_in_the_epoch_gets_back_every_acknowledged_append(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(root, 60)
    ep = _epoch(root)
    assert ep is not None
    log = log_path(root, SID)
    whole = log.read_bytes()
    saved = root.parent / "saved"
    shutil.copytree(root, saved)
    cuts = sorted({ep.start, ep.start + 1, len(whole) - 1, *range(ep.start, len(whole), 977)})
    for keep in cuts:
        shutil.rmtree(root)
        shutil.copytree(saved, root)
        _power_loss(root, keep)
        cut = log.read_bytes()
        with caplog.at_level(logging.WARNING, logger="eventstore"):
            assert _contents(root) == [f"m{i}" for i in range(60)], keep
            assert log.read_bytes() == cut, keep  # the reader wrote nothing
            assert "copied back" not in caplog.text
            _next_writer_settles(root)
        assert log.read_bytes() == whole, keep
        assert "copied back" in caplog.text
        caplog.clear()
        with SessionStore(root) as s:
            assert s.verify(SID).ok


@pytest.mark.parametrize(
    "lost",
    [bytes(3000), bytes(0x80 | (i * 37 & 0x7F) for i in range(3000))],
    ids=["zeros", "garbage"],
)
def test_zeros_where_a_write_was_lost_are_filled_from_the_journal(root: Path, lost: bytes) -> None:
    """A file system may keep a later write and not an earlier one: a run of zeros, or of
    garbage (ext4 data=writeback) whose lines end no line in the log. Readers read past
    it from the journal; the next writer copies the journal back over it."""
    _write(root, 40)
    ep = _epoch(root)
    assert ep is not None
    log = log_path(root, SID)
    whole = log.read_bytes()
    hole = ep.start + (len(whole) - ep.start) // 3
    log.write_bytes(whole[:hole] + lost + whole[hole + len(lost) :])
    for p in log.parent.glob("fold-*.cache"):
        p.unlink()
    holed = log.read_bytes()
    assert _contents(root) == [f"m{i}" for i in range(40)]
    assert log.read_bytes() == holed  # readers never write
    _next_writer_settles(root)
    assert log.read_bytes() == whole


def test_a_line_whose_newline_alone_was_replaced_is_never_overwritten(root: Path) -> None:
    """A committed line whose newline alone was replaced is damage of another kind than
    a power loss leaves (garbage): loads report it, the journal does not cover it."""
    _write(root, 40)
    log = log_path(root, SID)
    data = log.read_bytes()
    at = data.index(b"m30 xxx")
    nl = data.index(b"\n", at)
    edited = data[:nl] + b" " + data[nl + 1 :]
    log.write_bytes(edited)
    for p in log.parent.glob("fold-*.cache"):
        p.unlink()
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID)
    assert log.read_bytes() == edited


def test_an_edited_line_is_never_overwritten_by_the_journal(root: Path) -> None:
    """A whole line that differs otherwise is no crash damage: tamper evidence stands."""
    _write(root, 40)
    log = log_path(root, SID)
    data = log.read_bytes()
    edited = data.replace(b"m38 xxx", b"m38 yyy", 1)
    assert edited != data
    log.write_bytes(edited)
    for p in log.parent.glob("fold-*.cache"):
        p.unlink()
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID)
    assert log.read_bytes() == edited


def test_a_repair_retires_the_epoch_so_what_it_dropped_never_comes_back(root: Path) -> None:
    """Repair cuts a damaged tail: the lines it dropped are in the mirror, chained to a
    line the repaired log still holds. The epoch is retired before the log is replaced."""
    _write(root, 40)
    log = log_path(root, SID)
    data = log.read_bytes()
    last = data.rfind(b"\n", 0, len(data) - 1) + 1
    log.write_bytes(data[:last] + data[last:].replace(b"x", b"y", 1))  # the last line
    with SessionStore(root, durability="fsync") as s:
        report = repair(s, SID)
        assert report.action == "moved_aside"
    assert _epoch(root) is None
    assert _contents(root) == [f"m{i}" for i in range(39)]
    _power_loss(root, os.path.getsize(log))  # a reopen after a crash copies nothing back
    assert _contents(root) == [f"m{i}" for i in range(39)]


def test_a_compaction_retires_the_epoch_and_the_next_append_starts_one(root: Path) -> None:
    _write(root, 30)
    with SessionStore(root, durability="fsync") as s:
        s.compact(SID, force=True)
        assert _epoch(root) is None
    _write(root, 2, first=30)  # then a process that is killed
    ep = _epoch(root)
    assert ep is not None
    _power_loss(root, ep.start)
    assert _contents(root) == [f"m{i}" for i in range(32)]


def test_a_copy_of_the_store_recovers_too(root: Path) -> None:
    """Judged by content, not inode: a store copied after a crash is recovered."""
    _write(root, 30)
    ep = _epoch(root)
    assert ep is not None
    copy = root.parent / "copy"
    shutil.copytree(root, copy)
    _power_loss(copy, ep.start)
    assert _contents(copy) == [f"m{i}" for i in range(30)]


def test_flush_appends_between_durable_ones_lose_no_durable_one(root: Path) -> None:
    """A `durability="flush"` writer appends without mirroring: the next durable append
    starts a new epoch (its mirror would not follow the log), whatever crash comes."""
    _write(root, 5)
    with SessionStore(root) as flush:
        flush.append_transcript_messages(SID, _turn("m5"))
    _write(root, 5, first=6)
    ep = _epoch(root)
    assert ep is not None
    _power_loss(root, ep.start)
    assert _contents(root) == [f"m{i}" for i in range(11)]


def test_writers_in_several_processes_share_an_epoch(root: Path) -> None:
    """Each durable writer continues the epoch another process started (it reads the
    lock file's hints): the log is flushed once an epoch, not once a process switch."""
    _write(root, 1)
    pids = []
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _write(root, 40, first=1 + 40 * k)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    assert all(wait_child(pid, 60) == 0 for pid in pids)
    got = _contents(root)
    assert sorted(got, key=lambda t: int(t[1:])) == [f"m{i}" for i in range(121)]
    ep = _epoch(root)
    assert ep is not None
    _power_loss(root, ep.start)
    assert sorted(_contents(root), key=lambda t: int(t[1:])) == [f"m{i}" for i in range(121)]


def test_a_planted_journal_link_is_never_followed_and_appends_stay_durable(
    root: Path, tmp_path: Path
) -> None:
    _write(root, 3)
    paths = SessionPaths(root, SID)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    paths.journal.unlink()
    paths.journal.symlink_to(victim)
    _write(root, 3, first=3)  # durable through the log itself
    assert victim.read_bytes() == b"precious\n"
    assert paths.journal.is_symlink()
    assert _contents(root) == [f"m{i}" for i in range(6)]


def test_a_clean_close_retires_the_epoch(root: Path) -> None:
    """The log is flushed on close and the header cleared: the next process has no
    epoch to compare the log with (its first look costs nothing), and a power loss
    after the close loses nothing."""
    with SessionStore(root, durability="fsync") as s:
        for i in range(20):
            s.append_transcript_messages(SID, _turn(f"m{i}"))
        assert _epoch(root) is not None
    assert _epoch(root) is None
    assert _contents(root) == [f"m{i}" for i in range(20)]


def test_removing_a_session_removes_its_journal(root: Path) -> None:
    _write(root, 3)
    with SessionStore(root, durability="fsync") as s:
        assert s.delete_session(SID, purge=True)
    assert not SessionPaths(root, SID).dir.exists()


def test_a_flush_store_keeps_no_journal(root: Path) -> None:
    with SessionStore(root) as s:
        for i in range(20):
            s.append_progress_entry(SID, make_entry(i))
    assert not SessionPaths(root, SID).journal.exists()


def test_the_fsync_fast_path_asks_no_times_of_the_files_it_writes(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking a file's times makes its next write log its inode (Linux 6.13+'s
    fine-grained timestamps), which the journal's flush then pays for: a stat of the log
    or of the lock file (its hints are written every append) before each append made a
    write-and-flush 1.5-1.8x slower here (`bench/results/2026-12-03-fsync-floor.md`).
    Steady durable appends ask the kernel where each descriptor points instead, and take
    the log's size by lseek."""
    store = _append(root, 3)
    stats: list[str] = []
    real_lstat, real_stat, real_fstat = os.lstat, os.stat, os.fstat

    def lstat(path: Any, *a: Any, **k: Any) -> Any:
        stats.append(os.fspath(path))
        return real_lstat(path, *a, **k)

    def stat_(path: Any, *a: Any, **k: Any) -> Any:
        stats.append(os.fspath(path))
        return real_stat(path, *a, **k)

    def fstat(fd: int) -> Any:
        stats.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fstat(fd)

    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "stat", stat_)
    monkeypatch.setattr(os, "fstat", fstat)
    for i in range(3, 40):
        store.append_transcript_messages(SID, _turn(f"m{i}"))
    monkeypatch.undo()
    store.close()
    written = ("log.jsonl", "log.lock", "log.journal")
    assert not [p for p in stats if p.endswith(written)], stats
    assert _contents(root) == [f"m{i}" for i in range(40)]


# -- attacks on durable appends through the journal --------------------------------------
#
# (`durability="fsync"`: eventstore/engines/file/journal.py and the journal parts of the
# file engine).
#
# Promises attacked (see README, Guarantees: "Durable appends without flushing a growing
# file"), one or more tests each:
#
# 1. no acknowledged fsync append is lost by any crash state: the log cut at any byte in
#    (or before) the epoch, zero runs in it, the journal's and the lock file's unflushed
#    writes dropped or torn, writers killed at random moments (epoch restarts included),
#    recovery itself killed halfway and run again;
# 2. recovery writes nothing that was not acknowledged and never resurrects what a
#    compaction, a repair, a removal, a cut-back after a failed append removed; never
#    overwrites a complete line that differs; never touches a log the journal does not
#    mirror (another session's journal, an old one restored, a forged header);
# 3. several processes (durable, flush, a compactor) at once, then a power loss: every
#    acknowledged append once, in a valid chain; fresh readers beside live writers never
#    copy anything back;
# 4. hostile journal and lock files never make a load raise, hang, write through a link,
#    or lose or alter data;
# 5. faults (ENOSPC, EIO) at every journal call site: an append raises StorageError and
#    stores nothing (a retry stores once) or returns durable; close never raises;
# 6. the fsync fast path (no stat of the log) never keeps writing to a log renamed over
#    by a replacer that does not bump the generation (an older release);
# 7. a child forked while the parent holds an epoch appends durably beside it.
#
# A power loss is modelled as above: the log keeps a prefix at least as
# long as its last flush (the epoch's start), possibly with zero runs after it; unflushed
# writes to the journal and the lock file may be lost or torn. Processes that "crash" are
# forked children that end with `os._exit` (or SIGKILL) without closing their store.
#
# Eight promises were found broken; six are fixed with this file: a failed retire left
# other writers mirroring into a cleared journal (the hints now stop naming the epoch
# first); a transient fault in recovery let the next append cut what only the journal
# held (a failed check now fails that use, and the next looks again); a FIFO journal hung
# the first use (opened without blocking, refused unless a regular file); appends into a
# journal cut short were not durable (an epoch is continued only in a whole journal); the
# fsync fast path trusted the directory's times, coarse on some systems (it asks the
# kernel where the log's descriptor points); an append whose voiding failed said nothing
# was stored (it now says the batch may return). Two are limitations, kept as strict
# xfails: a journal restored from a backup after a repair, and a forged journal (whoever
# can write log.journal can write log.jsonl).


LOGGER = "eventstore"


def _turn(tok: str, size: int = 1500) -> list[Message]:
    return [Message(role=Role.USER, content=f"{tok} " + "x" * size)]


def _paths(root: Path, sid: str = SID) -> SessionPaths:
    return SessionPaths(root, sid)


def _epoch_or_none(root: Path, sid: str = SID) -> file_journal.Epoch | None:
    try:
        fd = os.open(_paths(root, sid).journal, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return file_journal.read_epoch(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _drop_caches(root: Path, sid: str = SID) -> None:
    """Fold caches could vouch for more than a crashed log holds: they go too."""
    for p in _paths(root, sid).dir.glob("fold-*.cache"):
        p.unlink()


def _tokens(root: Path, sid: str = SID) -> list[str]:
    """The transcript's tokens as a fresh process reads them (the log, no fold cache)."""
    _drop_caches(root, sid)
    with SessionStore(root, caches=False) as s:
        return [m.content.split(" ")[0] for m in s.load_transcript_messages(sid)]


def _verify_ok(root: Path, sid: str = SID) -> bool:
    with SessionStore(root) as s:
        return s.verify(sid).ok


def _in_child(work: Callable[[], object], seconds: float = 30) -> int | None:
    """`work` in a forked child that exits without closing anything (a crash)."""
    return in_forked_child(work, seconds)


def _killed_writer(root: Path, toks: list[str], size: int = 1500) -> None:
    """Append `toks` durably in a process that ends without closing its store."""

    def work() -> None:
        s = SessionStore(root, durability="fsync")
        for t in toks:
            s.append_transcript_messages(SID, _turn(t, size))

    assert _in_child(work) == 0


def _crash(
    root: Path, toks: list[str], size: int = 1500
) -> tuple[file_journal.Epoch, dict[str, bytes], bytes]:
    """`_killed_writer`, then the epoch it left (there must be one), its files as it left
    them (for `_restore`) and the log's bytes among them."""
    _killed_writer(root, toks, size)
    ep = _epoch_or_none(root)
    assert ep is not None
    saved = _save(root)
    return ep, saved, saved["log.jsonl"]


def _fd_name(fd: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return ""


def _save(root: Path) -> dict[str, bytes]:
    p = _paths(root)
    return {name: (p.dir / name).read_bytes() for name in ("log.jsonl", "log.journal", "log.lock")}


def _restore(root: Path, saved: dict[str, bytes]) -> None:
    """Put the files back in place (same inodes), dropping what recovery left beside."""
    p = _paths(root)
    for name, data in saved.items():
        with open(p.dir / name, "r+b") as f:
            f.write(data)
            f.truncate(len(data))
    for extra in p.dir.glob("log.jsonl.*"):
        extra.unlink()
    _drop_caches(root)


def _set_hints(root: Path, number: int, end: int) -> None:
    with open(_paths(root).lock, "r+b") as f:
        f.seek(file_journal.HINTS_AT)
        f.write(file_journal.pack_hints(number, end))


def _line_end(data: bytes, tok: str) -> int:
    """Where the line holding token `tok` ends in the log bytes `data` (-1: absent)."""
    at = data.find(b'"' + tok.encode() + b" x")
    return -1 if at < 0 else data.index(b"\n", at) + 1


_TOKEN = re.compile(rb'"([A-Za-z0-9._]+) x')


def _line_ends(data: bytes) -> dict[str, int]:
    """Where the line holding each token ends in the log bytes `data`."""
    ends: dict[str, int] = {}
    at = 0
    for line in data.splitlines(keepends=True):
        at += len(line)
        m = _TOKEN.search(line)
        if m is not None and line.endswith(b"\n"):
            ends[m[1].decode()] = at
    return ends


@contextmanager
def _warnings() -> Iterator[list[str]]:
    """The eventstore warnings logged meanwhile (in this process)."""
    got: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    handler = Grab(logging.WARNING)
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    try:
        yield got
    finally:
        logger.removeHandler(handler)


class _Fault:
    """Wraps `os.<name>`: fails the calls on a file named `target` chosen by `when`
    (given the 1-based count of such calls), with `err`."""

    def __init__(
        self, name: str, target: str, when: Callable[[int], bool], err: int = errno.EIO
    ) -> None:
        self.name, self.target, self.when, self.err = name, target, when, err
        self.real = getattr(os, name)
        self.calls = 0
        self.failed = 0

    def __call__(self, fd: int, *args: Any, **kwargs: Any) -> Any:
        if _fd_name(fd) == self.target:
            self.calls += 1
            if self.when(self.calls):
                self.failed += 1
                raise OSError(self.err, os.strerror(self.err))
        return self.real(fd, *args, **kwargs)

    def __enter__(self) -> _Fault:
        setattr(os, self.name, self)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(os, self.name, self.real)


def _read_pipe(fd: int) -> list[str]:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            b = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
    return [t for t in b"".join(chunks).decode().split("\n") if t]


def _wait_for_acks(fd: int, n: int, timeout: float = 60.0) -> list[str]:
    """The tokens read from `fd` until at least `n` arrived (the writers are running),
    or `timeout` seconds passed."""
    got: list[str] = []
    end = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < end:
        readable, _, _ = select.select([fd], [], [], 0.05)
        if readable:
            got += _read_pipe(fd)
    return got


def _writer_loop(
    root: Path,
    name: str,
    ack_fd: int,
    seed: int,
    durability: str,
    sizes: tuple[int, ...] = (1000, 3000, 9000, 40000),
) -> None:
    """Append forever (payloads of 1-40 kB, so the mirror fills and epochs restart),
    reporting each token after its append returned."""
    rng = random.Random(seed)
    s = SessionStore(root, durability=durability)  # type: ignore[arg-type]
    i = 0
    while True:
        tok = f"{name}.{i}"
        s.append_transcript_messages(SID, _turn(tok, rng.choice(sizes)))
        os.write(ack_fd, (tok + "\n").encode())
        i += 1


def _spawn(work: Callable[[], object]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            work()
        finally:
            os._exit(0)
    return pid


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        os.waitpid(pid, 0)


def _check_acked(root: Path, acked: list[str], maybe: frozenset[str] = frozenset()) -> list[str]:
    """Every acknowledged token present exactly once, nothing present twice, nothing
    present that no writer tried (a writer's token after its last acknowledged one was
    in flight when it died: it may be there), the chain verifies. Returns the tokens."""
    got = _tokens(root)
    counts = Counter(got)
    assert not [t for t, n in counts.items() if n > 1], "duplicated"
    missing = [t for t in acked if counts[t] != 1]
    assert not missing, f"acknowledged appends lost: {missing[:5]}"
    last: dict[str, int] = {}
    for t in [*acked, *maybe]:
        name, _, i = t.rpartition(".")
        last[name] = max(last.get(name, -1), int(i) if i.isdigit() else -1)
    known = set(acked) | maybe
    for t in got:
        if t not in known:
            name, _, i = t.rpartition(".")
            assert i.isdigit() and int(i) == last.get(name, -1) + 1, f"never appended: {t}"
    assert _verify_ok(root)
    return got


@pytest.mark.slow
def test_a_log_cut_at_any_byte_keeps_every_acknowledged_append(root: Path) -> None:
    """Promise 1. Attack: the log cut at every byte of its last line, every 7th of the
    two before, at every 97th byte of the epoch, at the epoch's first bytes, and (not a
    crash state: flushed bytes) below the epoch's start. In the epoch: every append
    comes back, byte for byte; below it: the load works, reports the prefix, and
    nothing is copied back."""
    ep, saved, whole = _crash(root, [f"m{i}" for i in range(40)], size=700)
    last = whole.rfind(b"\n", 0, len(whole) - 1)
    tail = whole.rfind(b"\n", 0, whole.rfind(b"\n", 0, last))
    cuts = {*range(last, len(whole)), *range(tail, last, 7), *range(ep.start, len(whole), 97)}
    cuts |= {ep.start, ep.start + 1}
    log = log_path(root, SID)
    for keep in sorted(cuts):
        _restore(root, saved)
        os.truncate(log, keep)
        assert _tokens(root) == [f"m{i}" for i in range(40)], keep
        assert log.read_bytes() == whole[:keep], keep  # readers never write
        _next_writer_settles(root)
        assert log.read_bytes() == whole, keep
    for keep in (ep.start - 1, ep.start - 300, 0):
        _restore(root, saved)
        os.truncate(log, keep)
        with _warnings() as said:
            got = _tokens(root)
        assert not any("copied back" in w for w in said)
        assert log.read_bytes() == whole[:keep]
        assert got == [f"m{i}" for i in range(len(got))]


def test_zero_runs_anywhere_in_the_epoch_are_filled_back(root: Path) -> None:
    """Promise 1. Attack: 120 random crash states of one epoch: one to three zero runs
    (a later write kept, an earlier one lost), with or without the log cut after them,
    and zeros past the end (a size kept, its data lost)."""
    ep, saved, whole = _crash(root, [f"m{i}" for i in range(50)], size=900)
    log = log_path(root, SID)
    rng = random.Random(7)
    for trial in range(120):
        _restore(root, saved)
        data = bytearray(whole)
        end = rng.randrange(ep.start, len(whole) + 1) if trial % 3 else len(whole)
        for _ in range(rng.randint(1, 3)):
            a = rng.randrange(ep.start, end + 1)
            b = min(end, a + rng.choice((1, 17, 500, 3000, 20000)))
            data[a:b] = bytes(b - a)
        del data[end:]
        if trial % 5 == 0:
            data += bytes(rng.choice((1, 100, 5000)))
        log.write_bytes(bytes(data))
        assert _tokens(root) == [f"m{i}" for i in range(50)], trial
        assert log.read_bytes() == bytes(data), trial  # readers never write
        _next_writer_settles(root)
        assert log.read_bytes()[: len(whole)] == whole, trial


def test_the_inflight_append_torn_in_the_mirror_and_lost_hints_lose_nothing(
    root: Path,
) -> None:
    """Promise 1. Attack: the batch in flight at the crash has its mirror write torn at
    any byte (or dropped) while the log is cut anywhere in the epoch; the lock file's hints
    (never flushed) come back as they were, zeroed, an older end, or garbage. Every
    acknowledged append is there; the in-flight one whole or not at all; and the next
    process's appends, after a second power loss, are all there too."""
    ep, saved, whole = _crash(root, [f"m{i}" for i in range(12)], size=2000)
    acked_end = _line_end(whole, "m10")  # m11 is "in flight"
    inflight = len(whole) - acked_end
    rng = random.Random(3)
    hints = file_journal.hints(saved["log.lock"])
    variants = [
        hints,
        (0, 0),
        (hints[0], acked_end),
        (hints[0], ep.start),
        (rng.getrandbits(64), rng.getrandbits(63)),
    ]
    for trial in range(25):
        _restore(root, saved)
        torn_at = rng.randrange(0, inflight + 1)
        with open(_paths(root).journal, "r+b") as f:
            f.seek(file_journal.DATA_AT + acked_end - ep.start + torn_at)
            f.write(bytes(inflight - torn_at))
        os.truncate(log_path(root, SID), rng.randrange(ep.start, len(whole) + 1))
        _set_hints(root, *variants[trial % len(variants)])
        got = _tokens(root)
        assert got in ([f"m{i}" for i in range(11)], [f"m{i}" for i in range(12)]), trial
        if trial % 5 == 0:  # then a second process, killed, and a second power loss
            _killed_writer(root, ["n0", "n1", "n2"], size=2000)
            ep2 = _epoch_or_none(root)
            assert ep2 is not None
            os.truncate(log_path(root, SID), ep2.start)
            assert _tokens(root) == [*got, "n0", "n1", "n2"], trial


@pytest.mark.slow
def test_writers_killed_at_random_moments_then_a_power_loss_lose_no_acknowledged_append(
    root: Path,
) -> None:
    """Promise 1. Attack: two durable writers with 1-40 kB payloads (the mirror fills
    and epochs restart every few appends) SIGKILLed at a random moment; then a power
    loss: the log cut anywhere at or after the epoch's start, maybe a zero run, the
    mirror past the last acknowledged append torn, the hints lost. Three rounds on one
    store: after each recovery, new writers, killed again, another power loss."""
    rng = random.Random(11)
    acked: list[str] = []
    copies = 0
    for rnd in range(3):
        r, w = os.pipe()
        pids = [
            _spawn(
                lambda k=k, rnd=rnd, w=w: _writer_loop(
                    root, f"r{rnd}w{k}", w, rnd * 10 + k, "fsync"
                )
            )
            for k in range(2)
        ]
        # some appends acknowledged first (a loaded machine starts writers slowly: a kill
        # before any would leave recovery nothing to do), then a random moment
        early = _wait_for_acks(r, 6)
        time.sleep(rng.uniform(0.0, 0.3))
        _kill_all(pids)
        os.close(w)
        acked += early + _read_pipe(r)
        os.close(r)
        ep = _epoch_or_none(root)
        data = log_path(root, SID).read_bytes()
        saved = _save(root)
        start = ep.start if ep is not None else len(data)
        ends = _line_ends(data)
        last_ack = max([ends.get(t, 0) for t in acked] + [0])
        for variant in range(4):
            _restore(root, saved)
            cut = rng.randrange(start, len(data) + 1)
            buf = bytearray(data[:cut])
            if variant % 2 and cut > start:
                a = rng.randrange(start, cut)
                n = min(cut - a, rng.randrange(1, 9000))
                buf[a : a + n] = bytes(n)
            log_path(root, SID).write_bytes(bytes(buf))
            if ep is not None and last_ack < len(data):
                tear = max(last_ack, start) - start + rng.randrange(0, 4000)
                with open(_paths(root).journal, "r+b") as f:
                    f.seek(file_journal.DATA_AT + tear)
                    f.write(bytes(max(0, file_journal.SIZE - tear)))
            if variant == 3:
                _set_hints(root, 0, 0)
            with _warnings() as said:
                _check_acked(root, acked)  # readers: laid over the log in memory
                _next_writer_settles(root)  # the next writer: copied back
            copies += sum("copied back" in m for m in said)
            _check_acked(root, acked)
        # the state of the last variant goes on to the next round
    assert copies > 0  # the attack reached recovery


def test_recovery_killed_halfway_and_run_again_loses_nothing(root: Path) -> None:
    """Promise 1. Attack: the process copying back is killed after writing half of
    what it copies (its other writes never happen), and again with that half then lost
    in a second power loss (the log cut back into it); the next process finishes."""
    ep, saved, whole = _crash(root, [f"m{i}" for i in range(30)], size=1200)
    log = log_path(root, SID)
    for second_loss in (False, True):
        _restore(root, saved)
        os.truncate(log, ep.start + 10)

        def half_then_die() -> None:
            real = os.pwrite

            def half(fd: int, data: Any, at: int) -> int:
                if _fd_name(fd) == "log.jsonl":
                    real(fd, bytes(data)[: len(data) // 2], at)
                    os._exit(9)
                return real(fd, data, at)

            os.pwrite = half  # type: ignore[assignment]
            _next_writer_settles(root)

        assert _in_child(half_then_die) == 9
        assert ep.start + 10 < log.stat().st_size < len(whole)
        if second_loss:
            os.truncate(log, ep.start + (log.stat().st_size - ep.start) // 2)
        assert _tokens(root) == [f"m{i}" for i in range(30)]  # the rest, in memory
        _next_writer_settles(root)
        assert log.read_bytes() == whole


def test_the_first_look_never_hides_what_the_full_look_finds(root: Path) -> None:
    """Promise 1 (the uncommitted first look, file_journal._nothing_past). Attack: 400
    random crash states of a 256 KiB epoch (lines of 0.2-9 kB, so pieces of 64 KiB
    end anywhere in a line), the log cut anywhere (near the piece boundaries often,
    leaving a last piece shorter than a line's end), zero runs, trailing zeros, the
    mirror torn past the cut, bytes past the mirror's end: file_journal.lacking with
    the first look says exactly what it says with the first look disabled."""
    rng = random.Random(21)
    toks = [f"m{i}" for i in range(60)]

    def work() -> None:
        s = SessionStore(root, durability="fsync")
        s.append_transcript_messages(SID, _turn("m0", 100))
        for t in toks[1:]:
            s.append_transcript_messages(SID, _turn(t, rng.choice((200, 2000, 4000, 9000))))
            ep = _epoch_or_none(root)
            assert ep is not None
            if os.path.getsize(log_path(root, SID)) - ep.start > file_journal.SIZE - 30000:
                break

    assert _in_child(work) == 0
    ep = _epoch_or_none(root)
    assert ep is not None
    saved = _save(root)
    whole = saved["log.jsonl"]
    piece = 64 << 10
    real = file_journal._nothing_past
    p = _paths(root)
    agree = found = 0
    for trial in range(400):
        _restore(root, saved)
        if trial % 3 == 0:
            near = ep.start + piece * rng.randint(1, 3) + rng.randint(-40, 40)
            cut = max(ep.start, min(len(whole), near))
        else:
            cut = rng.randrange(ep.start, len(whole) + 1)
        data = bytearray(whole[:cut])
        if trial % 4 == 1 and cut > ep.start:
            a = rng.randrange(ep.start, cut)
            n = min(cut - a, rng.choice((1, 50, 3000)))
            data[a : a + n] = bytes(n)
        if trial % 5 == 2:
            data += bytes(rng.choice((1, 19, 700)))
        if trial % 25 == 4:  # the log runs past the mirror's end
            data = bytearray(whole) + whole[ep.start :] * (file_journal.SIZE // len(whole) + 2)
        log_path(root, SID).write_bytes(bytes(data))
        if trial % 6 == 3:
            with open(p.journal, "r+b") as f:
                f.seek(file_journal.DATA_AT + cut - ep.start + rng.randrange(0, 3000))
                f.write(os.urandom(rng.choice((1, 100))))
        jfd = os.open(p.journal, os.O_RDONLY)
        lfd = os.open(p.log, os.O_RDONLY)
        try:
            with_look = file_journal.lacking(jfd, lfd)
            file_journal._nothing_past = lambda *a: False  # type: ignore[assignment]
            try:
                without = file_journal.lacking(jfd, lfd)
            finally:
                file_journal._nothing_past = real
        finally:
            os.close(jfd)
            os.close(lfd)
        assert with_look == without, (trial, cut)
        agree += 1
        found += without is not None
    assert agree == 400 and found > 100


@pytest.mark.parametrize("fails", ["log_flush_at_epoch_start", "mirror_and_log_flush"])
def test_an_append_cut_back_after_a_failed_flush_never_comes_back(root: Path, fails: str) -> None:
    """Promise 2 and 5. Attack: the append's flush fails (the log's, when the mirror is
    full or absent; the mirror's and then the log's); it raises StorageError and is cut
    back. A process that then crashes, and a power loss: no process ever sees it; a
    retry stores it once."""

    def work() -> None:
        s = SessionStore(root, durability="fsync")
        for i in range(3):
            s.append_transcript_messages(SID, _turn(f"m{i}"))
        if fails == "log_flush_at_epoch_start":
            s.close()  # retires the epoch: the next append flushes the log
            s = SessionStore(root, durability="fsync")
        with (
            _Fault("fdatasync", "log.journal", lambda n: fails != "log_flush_at_epoch_start"),
            _Fault("fdatasync", "log.jsonl", lambda n: True),
            pytest.raises(StorageError),
        ):
            s.append_transcript_messages(SID, _turn("bad"))

    assert _in_child(work) == 0
    assert _tokens(root) == ["m0", "m1", "m2"]
    ep = _epoch_or_none(root)
    if ep is not None:
        os.truncate(log_path(root, SID), ep.start)
    assert _tokens(root) == ["m0", "m1", "m2"]
    with SessionStore(root, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("bad"))
    assert _tokens(root) == ["m0", "m1", "m2", "bad"]


@pytest.mark.parametrize("zeros", ["fail", "lost_in_the_power_loss"])
def test_a_cut_back_append_whose_mirror_could_not_be_voided_says_it_may_return(
    root: Path, monkeypatch: pytest.MonkeyPatch, zeros: str
) -> None:
    """Promise 2 and 5. Attack: the mirror's flush fails (EIO: its bytes may be on the
    disk), the zeros meant to void them fail or cannot be flushed, and the log's flush
    fails too. Found broken: the append raised "nothing was stored", and the next
    process copied it back. With every flush failing nothing can be promised either
    way: the error now says the batch may return and to retry with an idempotency key
    (and the next process shows it whole, or not at all)."""
    s = SessionStore(root, durability="fsync")
    for i in range(3):
        s.append_transcript_messages(SID, _turn(f"m{i}"))
    real_pwrite = os.pwrite

    def zeros_fail(fd: int, data: Any, at: int) -> int:
        if _fd_name(fd) == "log.journal" and not bytes(data).strip(b"\0"):
            if zeros == "fail":
                raise OSError(errno.EIO, "EIO")
            return len(data)  # written to the cache, never flushed: gone at the power loss
        return real_pwrite(fd, data, at)

    monkeypatch.setattr(os, "fdatasync", _Fault("fdatasync", "log.journal", lambda n: True))
    with _Fault("fdatasync", "log.jsonl", lambda n: True):
        monkeypatch.setattr(os, "pwrite", zeros_fail)
        with pytest.raises(StorageError, match="may return after a crash"):
            s.append_transcript_messages(SID, _turn("bad"))
    monkeypatch.undo()
    assert _tokens(root) in (["m0", "m1", "m2"], ["m0", "m1", "m2", "bad"])


def test_a_compaction_then_a_power_loss_never_brings_back_what_it_replaced(root: Path) -> None:
    """Promise 2. Attack: an epoch full of lines, a compaction (which replaces the log
    by a snapshot and retires the epoch), then a killed durable writer in the new log's
    first epoch, whose mirror still holds the old epoch's bytes past its own; the log
    cut at every 50th byte from the new epoch's start. Only the new appends come back,
    never the old lines (which would duplicate events the snapshot already holds)."""
    _killed_writer(root, [f"m{i}" for i in range(30)], size=3000)
    with SessionStore(root, durability="fsync") as s:
        s.compact(SID, force=True)
    ep, saved, whole = _crash(root, ["n0", "n1", "n2"], size=200)
    want = [f"m{i}" for i in range(30)] + ["n0", "n1", "n2"]
    for keep in range(ep.start, len(whole) + 1, 50):
        _restore(root, saved)
        os.truncate(log_path(root, SID), keep)
        assert _tokens(root) == want, keep
        _next_writer_settles(root)
        assert log_path(root, SID).read_bytes() == whole


@pytest.mark.parametrize("how", ["keep_prefix", "rewrite"])
def test_a_repair_then_a_power_loss_never_brings_back_what_it_dropped(root: Path, how: str) -> None:
    """Promise 2. Attack: a repair cuts (or rewrites) a damaged log in the middle of a
    live epoch; then a power loss at any byte of the repaired log's tail. The lines it
    dropped are in the old mirror, chained to a line the repaired log keeps."""
    _killed_writer(root, [f"m{i}" for i in range(20)], size=800)
    log = log_path(root, SID)
    data = log.read_bytes()
    at = _line_end(data, "m14")
    with SessionStore(root, durability="fsync") as s, s.engine.hold(SID) as h:
        if how == "keep_prefix":
            h.keep_prefix(at, "test")
        else:
            h.rewrite(data[:at], "test")
    assert _epoch_or_none(root) is None
    saved = _save(root)
    for keep in range(at - 2000, at + 1, 37):
        _restore(root, saved)
        os.truncate(log, keep)
        got = _tokens(root)
        assert got == [f"m{i}" for i in range(len(got))] and len(got) <= 15, keep


def test_a_delete_and_recreate_never_brings_back_the_old_session(root: Path) -> None:
    """Promise 2. Attack: a session with a live epoch (its writer killed) is deleted and
    created again by a killed durable writer; power loss at every 40th byte after the
    new epoch's start. Nothing of the old session comes back."""
    _killed_writer(root, [f"old{i}" for i in range(20)], size=500)
    with SessionStore(root, durability="fsync") as s:
        assert s.delete_session(SID, purge=True)
    ep, saved, whole = _crash(root, ["new0", "new1", "new2", "new3"], size=500)
    for keep in range(ep.start, len(whole) + 1, 40):
        _restore(root, saved)
        os.truncate(log_path(root, SID), keep)
        assert _tokens(root) == ["new0", "new1", "new2", "new3"], keep


def test_an_edited_line_is_never_overwritten_even_with_crash_damage_around_it(
    root: Path,
) -> None:
    """Promise 2. Attack: a complete line in the epoch edited (same length), with a
    zero run before it and the log cut after it: the edited line stays as it is, loads
    report the corruption; and a line whose edit is a zero run inside it plus other
    bytes changed is not taken for crash damage either."""
    ep, saved, whole = _crash(root, [f"m{i}" for i in range(20)], size=800)
    log = log_path(root, SID)
    a, b = _line_end(whole, "m14"), _line_end(whole, "m15")
    edits = []
    e1 = bytearray(whole[: _line_end(whole, "m18") - 5])
    e1[a + 300 : a + 301] = b"y"
    e1[_line_end(whole, "m12") + 10 : _line_end(whole, "m12") + 60] = bytes(50)
    edits.append(bytes(e1))
    e2 = bytearray(whole[: len(whole) - 3])
    e2[a + 20 : a + 40] = bytes(20)
    e2[a + 200 : a + 201] = b"z"
    edits.append(bytes(e2))
    for edited in edits:
        _restore(root, saved)
        log.write_bytes(edited)
        _drop_caches(root)
        with SessionStore(root, caches=False) as s, pytest.raises(CorruptLogError):
            s.load_transcript_messages(SID)
        assert log.read_bytes()[a:b] == edited[a:b]


def test_a_journal_copied_from_another_session_is_never_applied(root: Path) -> None:
    """Promise 2. Attack: session "a"'s journal (a live epoch) copied over session "s"'s
    (whose log is cut: a power loss), and over a session whose log is empty."""
    _killed_writer(root, [f"m{i}" for i in range(10)])

    def other() -> None:
        s = SessionStore(root, durability="fsync")
        for i in range(10):
            s.append_transcript_messages("a", _turn(f"a{i}"))

    assert _in_child(other) == 0
    mine = log_path(root, SID).read_bytes()
    shutil.copyfile(_paths(root, "a").journal, _paths(root).journal)
    ep = _epoch_or_none(root)
    assert ep is not None
    os.truncate(log_path(root, SID), min(len(mine), ep.start))
    with _warnings() as said:
        got = _tokens(root)
    assert not any("copied back" in w for w in said)
    assert got == [f"m{i}" for i in range(len(got))]
    assert log_path(root, SID).read_bytes() == mine[: min(len(mine), ep.start)]


def test_an_old_journal_restored_from_a_backup_changes_nothing(root: Path, tmp_path: Path) -> None:
    """Promise 2. Attack: the journal backed up in an early epoch, the session grown by
    several epochs since (and closed cleanly), then the old journal put back (with and
    without the log cut after a later crash): its epoch's bytes still agree with the
    log, everything after them differs; nothing is written."""
    _killed_writer(root, [f"m{i}" for i in range(5)], size=5000)
    backup = tmp_path / "journal.bak"
    shutil.copyfile(_paths(root).journal, backup)
    with SessionStore(root, durability="fsync") as s:
        for i in range(5, 150):
            s.append_transcript_messages(SID, _turn(f"m{i}", 5000))
    whole = log_path(root, SID).read_bytes()
    for keep in (len(whole), len(whole) - 10, len(whole) // 2):
        shutil.copyfile(backup, _paths(root).journal)
        os.truncate(log_path(root, SID), keep)
        with _warnings() as said:
            got = _tokens(root)
        assert not any("copied back" in w for w in said)
        assert log_path(root, SID).read_bytes() == whole[:keep]
        assert got == [f"m{i}" for i in range(len(got))]
        log_path(root, SID).write_bytes(whole)


def test_an_old_journal_restored_after_a_repair_does_not_resurrect_what_it_dropped(
    root: Path, tmp_path: Path
) -> None:
    """Promise 2. Attack: the journal backed up during a live epoch; the log's last
    line damaged and repaired away (the epoch retired); the old journal restored.
    (An xfail until issue 29: the repaired log ended at seq 9, so the restored
    journal's chained line 10 was copied back. Repair now holds seq 10 with a
    `quarantined` record, and the journal has nothing the log lacks. A journal restored
    after a repair that only cut a torn tail, never acknowledged, is judged as before:
    `file_journal.lacking` looks only at the line before the epoch's start.)"""
    _killed_writer(root, [f"m{i}" for i in range(10)])
    backup = tmp_path / "journal.bak"
    shutil.copyfile(_paths(root).journal, backup)
    log = log_path(root, SID)
    data = log.read_bytes()
    last = data.rfind(b"\n", 0, len(data) - 1) + 1
    log.write_bytes(data[:last] + data[last:].replace(b"x", b"y", 1))
    with SessionStore(root, durability="fsync") as s:
        assert repair(s, SID).action == "moved_aside"
    assert _tokens(root) == [f"m{i}" for i in range(9)]
    shutil.copyfile(backup, _paths(root).journal)
    assert _tokens(root) == [f"m{i}" for i in range(9)]


def _forge(root: Path, start: int, link: str, seq: int, mirror: bytes) -> None:
    with open(_paths(root).journal, "r+b") as f:
        f.write(file_journal.Epoch(1, start, (0, 0), seq, link).encode())
        f.seek(file_journal.DATA_AT)
        f.write(mirror.ljust(file_journal.SIZE, b"\0")[: file_journal.SIZE])


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def test_a_forged_header_whose_link_matches_never_rewrites_the_log(root: Path) -> None:
    """Promise 2 and 4. Attack: headers with a valid CRC and the true link of a line of
    the log, whose mirror holds the log's own lines shifted by one, the log's lines with
    one edited, and zeros; the epoch's start at a line in the middle of the log and at
    its end. The log is never written."""
    _killed_writer(root, [f"m{i}" for i in range(12)], size=600)
    log = log_path(root, SID)
    whole = log.read_bytes()
    lines = _lines(whole)
    for k in (3, 8, len(lines)):
        start = sum(map(len, lines[:k]))
        link = lines[k - 1][-19:-3].decode()
        rest = b"".join(lines[k:])
        edited = rest.replace(b"xxxx", b"xxxy", 1)
        for mirror in (b"".join(lines[k + 1 :]), edited, b"", b"".join(lines[k - 1 :])):
            _forge(root, start, link, k, mirror)
            for keep in sorted({len(whole), min(len(whole), start + 30), start}):
                os.truncate(log, keep)
                got = _tokens(root)
                assert log.read_bytes() == whole[:keep], (k, keep)
                assert got == [f"m{i}" for i in range(len(got))]
                log.write_bytes(whole)


@pytest.mark.xfail(
    strict=True,
    reason="file_journal.lacking copies back any chained continuation a journal holds "
    "after a line of the log: the chain's hash is unkeyed, so a planted journal (a "
    "forged header with the matching link and a mirror of lines computed for it) makes "
    "recovery append events no one appended. Inherent to judging by content without "
    "a secret; whoever can plant log.journal can also write log.jsonl.",
)
def test_a_forged_header_with_a_computed_continuation_is_not_appended(
    root: Path, tmp_path: Path
) -> None:
    """Promise 2. Attack: a copy of the store appends two more batches (computing, in
    effect, lines that chain to the original's last line); a header forged for the
    original (its true end and link) with those lines as its mirror."""
    _killed_writer(root, [f"m{i}" for i in range(5)])
    whole = log_path(root, SID).read_bytes()
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    with SessionStore(copy) as c:
        c.append_transcript_messages(SID, _turn("forged0"))
        c.append_transcript_messages(SID, _turn("forged1"))
    more = log_path(copy, SID).read_bytes()[len(whole) :]
    last = _lines(whole)[-1]
    _forge(root, len(whole), last[-19:-3].decode(), 5, more)
    assert _tokens(root) == [f"m{i}" for i in range(5)]


@pytest.mark.slow
def test_durable_flush_writers_and_a_compactor_at_once_then_a_power_loss(root: Path) -> None:
    """Promise 3. Attack: three durable writers, a flush writer and a compactor (every
    ~0.1 s) on one session for about a second, all SIGKILLed; then power losses at
    random bytes at or after the epoch's start. Every acknowledged durable append once,
    nothing twice, the chain valid; after recovery, the next writer continues."""
    _killed_writer(root, ["seed"])
    r, w = os.pipe()
    rf, wf = os.pipe()
    small = (200, 2000, 12000)
    pids = [_spawn(lambda k=k: _writer_loop(root, f"d{k}", w, k, "fsync", small)) for k in range(3)]
    pids.append(_spawn(lambda: _writer_loop(root, "f", wf, 9, "flush", small)))

    def compactor() -> None:
        s = SessionStore(root)
        while True:
            time.sleep(0.1)
            s.compact(SID, force=True)

    pids.append(_spawn(compactor))
    time.sleep(1.0)
    archive, deadline = _paths(root).archive, time.monotonic() + 60
    # a loaded machine: wait for the first archive file (its directory comes first)
    while not (archive.exists() and any(archive.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.05)
    _kill_all(pids)
    os.close(w)
    os.close(wf)
    acked, flushed = ["seed", *_read_pipe(r)], _read_pipe(rf)
    os.close(r)
    os.close(rf)
    assert len(acked) > 20 and flushed
    assert list(_paths(root).archive.iterdir())  # the compactor compacted
    ep = _epoch_or_none(root)
    data = log_path(root, SID).read_bytes()
    saved = _save(root)
    start = ep.start if ep is not None else len(data)
    rng = random.Random(5)
    for cut in sorted({start, len(data), *(rng.randrange(start, len(data) + 1) for _ in range(3))}):
        _restore(root, saved)
        os.truncate(log_path(root, SID), cut)
        _check_acked(root, acked, maybe=frozenset(flushed))
    with SessionStore(root, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("after"))
    assert _tokens(root)[-1] == "after"


@pytest.mark.slow
def test_fresh_readers_beside_live_writers_never_copy_back(root: Path) -> None:
    """Promise 3. Attack: two durable writers and a flush writer append for ~1.5 s while
    three processes open fresh stores over and over (a lock-free first look each time,
    racing the writers' log and mirror writes and epoch restarts), and load now and
    then. No crash: nothing may ever be copied back, and no load may fail."""
    _killed_writer(root, ["seed"])
    deadline = time.monotonic() + 1.2
    r, w = os.pipe()

    def writer(k: int, durability: str) -> None:
        s = SessionStore(root, durability=durability)  # type: ignore[arg-type]
        rng = random.Random(k)
        i = 0
        while time.monotonic() < deadline:
            s.append_transcript_messages(SID, _turn(f"w{k}.{i}", rng.choice((300, 3000, 12000))))
            i += 1
        s.close()

    def reader(k: int) -> None:
        looks = errors = 0
        with _warnings() as said:
            while time.monotonic() < deadline:
                s = SessionStore(root, durability="fsync" if k % 2 else "flush")
                try:
                    s.last_seq(SID)
                    if looks % 10 == 0:
                        s.core.caches.cached = {}
                        s.load_transcript_messages(SID)
                except EventStoreError:
                    errors += 1
                s.close()
                looks += 1
        copied = sum("copied back" in m or "could not be checked" in m for m in said)
        os.write(w, f"{looks} {copied} {errors}\n".encode())

    pids = [_spawn(lambda: writer(0, "fsync")), _spawn(lambda: writer(1, "fsync"))]
    pids.append(_spawn(lambda: writer(2, "flush")))
    pids += [_spawn(lambda k=k: reader(k)) for k in range(3)]
    for pid in pids:
        assert wait_child(pid, 20) == 0
    os.close(w)
    reports = [tuple(map(int, line.split())) for line in _read_pipe(r)]
    os.close(r)
    assert len(reports) == 3
    assert sum(looks for looks, _, _ in reports) > 30
    assert [(c, e) for _, c, e in reports] == [(0, 0)] * 3
    got = _tokens(root)
    assert len(got) == len(set(got))
    assert _verify_ok(root)


@pytest.mark.parametrize("op", ["load", "append"])
def test_a_fifo_journal_never_hangs_a_load_or_an_append(root: Path, op: str) -> None:
    """Promise 4. Attack: log.journal replaced by a FIFO nobody writes to."""
    _killed_writer(root, ["m0", "m1"])
    j = _paths(root).journal
    j.unlink()
    os.mkfifo(j)

    def use() -> None:
        if op == "load":
            assert _tokens(root) == ["m0", "m1"]
        else:
            with SessionStore(root, durability="fsync") as s:
                s.append_transcript_messages(SID, _turn("m2"))

    assert _in_child(use, 2) == 0


def _hostile(root: Path, kind: str, victim: Path) -> None:
    j = _paths(root).journal
    if kind == "symlink":
        j.unlink()
        j.symlink_to(victim)
    elif kind == "directory":
        j.unlink()
        j.mkdir()
    elif kind.startswith("truncated"):
        os.truncate(j, int(kind.split("-")[1]))
    elif kind == "huge":
        os.truncate(j, 1 << 33)
    elif kind == "empty-file":
        j.unlink()
        j.touch()


@pytest.mark.parametrize(
    "kind",
    ["symlink", "directory", "truncated-0", "truncated-60", "huge", "empty-file"],
)
def test_a_hostile_journal_never_breaks_loads_or_durability(
    root: Path, tmp_path: Path, kind: str
) -> None:
    """Promise 4. Attack: log.journal (during a live epoch of a killed writer) made a
    symlink to a precious file, a directory, truncated (to nothing, mid-header,
    mid-mirror), huge and sparse, an empty file. Loads work and lose nothing the log
    holds; nothing is written through the link; appends by a killed process and a power
    loss afterwards lose nothing acknowledged."""
    _killed_writer(root, [f"m{i}" for i in range(6)])
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n" * 1000)
    _hostile(root, kind, victim)
    before = _tokens(root)
    assert before == [f"m{i}" for i in range(6)]
    damaged_at = os.path.getsize(log_path(root, SID))
    _killed_writer(root, ["n0", "n1", "n2", "n3"])
    ep = _epoch_or_none(root) if kind not in ("symlink", "directory") else None
    if ep is not None:  # what was acknowledged before the damage: not judged here
        os.truncate(log_path(root, SID), max(ep.start, damaged_at))
    assert _tokens(root) == [*before, "n0", "n1", "n2", "n3"]
    assert victim.read_bytes() == b"precious\n" * 1000
    with SessionStore(root, durability="fsync") as s:
        try:
            s.compact(SID, force=True)  # may refuse the hostile file: never follows it
        except EventStoreError:
            pass
    assert victim.read_bytes() == b"precious\n" * 1000
    assert _tokens(root) == [*before, "n0", "n1", "n2", "n3"]


@pytest.mark.parametrize("size", [file_journal.DATA_AT, file_journal.DATA_AT + 900])
def test_appends_after_the_journal_was_cut_short_stay_durable(root: Path, size: int) -> None:
    """Promise 4. Attack: the journal cut short after its header (a copy that ran out of
    space, a file system check), during a live epoch whose log the OS has written back;
    a killed durable writer appends; a power loss cuts the log to the epoch's start or
    to where it was at the damage, whichever is later."""
    _killed_writer(root, [f"m{i}" for i in range(6)])
    os.truncate(_paths(root).journal, size)
    damaged_at = os.path.getsize(log_path(root, SID))
    _killed_writer(root, ["n0", "n1", "n2", "n3"])
    ep = _epoch_or_none(root)
    assert ep is not None
    os.truncate(log_path(root, SID), max(ep.start, damaged_at))
    assert _tokens(root) == [*(f"m{i}" for i in range(6)), "n0", "n1", "n2", "n3"]


def test_an_unreadable_journal_never_breaks_loads_or_durability(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise 4. Attack: every open of log.journal refused (EACCES; the tests run as
    root, so the refusal is injected) after a killed writer left its epoch: the journal
    may hold acknowledged appends the log lacks, so the first use of the session raises
    StorageError naming the journal and changes nothing (going on, the next append
    would cut what only the journal holds); once it can be read, loads work and
    durable appends go on."""
    _killed_writer(root, [f"m{i}" for i in range(5)])
    real = os.open

    def refuse(path: Any, flags: int, *a: Any, **k: Any) -> int:
        if os.fspath(path).endswith("log.journal"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, flags, *a, **k)

    before = log_path(root, SID).read_bytes()
    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(StorageError, match="log.journal"):
        _tokens(root)
    assert log_path(root, SID).read_bytes() == before
    monkeypatch.setattr(os, "open", real)
    assert _tokens(root) == [f"m{i}" for i in range(5)]
    s = SessionStore(root, durability="fsync")
    for i in range(5, 9):
        s.append_transcript_messages(SID, _turn(f"m{i}"))
    s.close()
    assert _tokens(root) == [f"m{i}" for i in range(9)]


def test_garbage_hints_in_the_lock_file_never_lose_an_acknowledged_append(root: Path) -> None:
    """Promise 4. Attack: the lock file's 16 hint bytes set to garbage, to the live
    epoch's number with a wrong end, to a wrong number with the right end, and the lock
    file cut to its generation and to half a hint, between killed durable writers; a
    power loss at the epoch's start after each."""
    rng = random.Random(1)
    want: list[str] = []
    for trial in range(8):
        toks = [f"t{trial}.{i}" for i in range(3)]
        _killed_writer(root, toks)
        want += toks
        ep = _epoch_or_none(root)
        assert ep is not None
        number, end = file_journal.hints(_paths(root).lock.read_bytes())
        size = os.path.getsize(log_path(root, SID))
        choice = trial % 5
        if choice == 0:
            _set_hints(root, rng.getrandbits(64), rng.getrandbits(64))
        elif choice == 1:
            _set_hints(root, number, end - 1)
        elif choice == 2:
            _set_hints(root, number ^ 2, size)
        elif choice == 3:
            os.truncate(_paths(root).lock, 8)
        else:
            os.truncate(_paths(root).lock, 16)
        _killed_writer(root, [f"u{trial}"])
        want.append(f"u{trial}")
        ep = _epoch_or_none(root)
        assert ep is not None
        os.truncate(log_path(root, SID), ep.start)
        assert _tokens(root) == want, trial


@pytest.mark.parametrize(
    "absurd",
    ["start_beyond_log", "start_zero", "wrong_link", "mid_line", "huge_seq", "bad_link_text"],
)
def test_a_header_with_a_valid_crc_and_absurd_values_changes_nothing(
    root: Path, absurd: str
) -> None:
    """Promise 4. Attack: a header that checks (CRC) but says the epoch starts past the
    log, at 0, after a line whose link is not the one it holds, in the middle of a line,
    with an absurd seq, with a link that is not hex; over a mirror holding the log's own
    lines from the start. A load changes nothing; durable appends go on durably."""
    _killed_writer(root, [f"m{i}" for i in range(8)], size=600)
    log = log_path(root, SID)
    whole = log.read_bytes()
    lines = _lines(whole)
    ep = _epoch_or_none(root)
    assert ep is not None
    k = 4
    start = sum(map(len, lines[:k]))
    link = lines[k - 1][-19:-3].decode()
    values = {
        "start_beyond_log": (len(whole) + 100, link, k),
        "start_zero": (0, "", 0),
        "wrong_link": (start, lines[k - 2][-19:-3].decode(), k),
        "mid_line": (start + 40, link, k),
        "huge_seq": (start, link, (1 << 64) - 1),
        "bad_link_text": (start, "\x7f" * 16, k),
    }
    s_, l_, q_ = values[absurd]
    mirror = b"".join(lines[k:]) if absurd != "start_zero" else whole
    _forge(root, s_, l_, q_, mirror[:-300])
    os.truncate(log, start + 10)
    cut = log.read_bytes()
    with _warnings() as said:
        got = _tokens(root)
    assert log.read_bytes() == cut
    assert not any("copied back" in w for w in said)
    assert got == [f"m{i}" for i in range(k)]
    _killed_writer(root, ["n0", "n1"])
    ep = _epoch_or_none(root)
    assert ep is not None
    os.truncate(log, ep.start)
    assert _tokens(root) == [*got, "n0", "n1"]


SITES = {
    "mirror_pwrite": ("pwrite", "log.journal"),
    "journal_fdatasync": ("fdatasync", "log.journal"),
    "hint_pwrite": ("pwrite", "log.lock"),
    "log_fdatasync": ("fdatasync", "log.jsonl"),
    "log_write": ("write", "log.jsonl"),
    "journal_create_fsync": ("fsync", "log.journal"),
}


def _faulty_workload(root: Path, site: str, k: int, err: int, ack_fd: int) -> None:
    """12 durable appends of 20 kB (the mirror fills, epochs restart) with the k-th
    call of the site failing once; an append that raises is retried once."""
    name, target = SITES[site]
    s = SessionStore(root, durability="fsync")
    with _Fault(name, target, lambda n: n == k, err) as fault:
        for i in range(12):
            tok = f"m{i}"
            try:
                s.append_transcript_messages(SID, _turn(tok, 20000))
            except StorageError:
                os.write(ack_fd, b"!" + tok.encode() + b"\n")
                s.append_transcript_messages(SID, _turn(tok, 20000))
            os.write(ack_fd, tok.encode() + b"\n")
    os.write(ack_fd, f"#{fault.calls}\n".encode())


@pytest.mark.parametrize("site", list(SITES))
def test_a_fault_at_a_journal_call_site_stores_once_or_raises(root: Path, site: str) -> None:
    """Promise 5. Attack: ENOSPC or EIO from one call of os.pwrite on the journal (the
    mirror, an epoch's header), os.fdatasync of the journal, os.pwrite of the lock
    file's hints, os.fdatasync and os.write of the log, each call of a 12-append
    workload in turn; the process then crashes and the power fails (the log cut at the
    epoch's start). Every append that returned is there once; one that raised is there
    only through its retry."""
    r, w = os.pipe()
    assert _in_child(lambda: _faulty_workload(root, site, 0, errno.EIO, w)) == 0
    os.close(w)
    calls = int([t for t in _read_pipe(r) if t.startswith("#")][0][1:])
    os.close(r)
    assert calls > 0
    shutil.rmtree(root)
    picks = sorted({1, 2, calls, *random.Random(site).sample(range(1, calls + 1), min(calls, 5))})
    for k in picks:
        err = errno.ENOSPC if k % 2 else errno.EIO
        r, w = os.pipe()
        assert _in_child(lambda k=k, err=err, w=w: _faulty_workload(root, site, k, err, w)) == 0
        os.close(w)
        report = _read_pipe(r)
        os.close(r)
        acked = [t for t in report if t[0] not in "!#"]
        assert acked == [f"m{i}" for i in range(12)], k
        ep = _epoch_or_none(root)
        if ep is not None:
            os.truncate(log_path(root, SID), ep.start)
        assert _tokens(root) == acked, (site, k)
        shutil.rmtree(root)


@pytest.mark.parametrize("fault", ["close_retire_flush", "close_hint_write", "compact_generation"])
def test_a_fault_retiring_the_epoch_never_leaves_other_writers_mirroring_into_it(
    root: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Promise 5 (and 1). Attack: store B and store A (two engines: two processes, in
    effect) share an epoch; A's close, or A's compaction, retires it and fails at the
    header's flush, the hints' write, or the generation's write. B goes on appending
    (acknowledged); a power loss then cuts the log back to its last flush. (Broken
    before the retire cleared the hints first: B mirrored into a cleared journal.)"""
    b = SessionStore(root, durability="fsync")
    b.append_transcript_messages(SID, _turn("m0"))
    a = SessionStore(root, durability="fsync")
    a.append_transcript_messages(SID, _turn("m1"))
    if fault == "close_retire_flush":
        injected = _Fault("fdatasync", "log.journal", lambda n: True)
    else:
        injected = _Fault("pwrite", "log.lock", lambda n: True)
    with injected:
        if fault == "compact_generation":
            with pytest.raises(StorageError):
                a.compact(SID, force=True)
        else:
            a.close()  # never raises
    durable = os.path.getsize(log_path(root, SID))  # the retire flushed the log
    for i in range(2, 6):
        b.append_transcript_messages(SID, _turn(f"m{i}"))
    # the power loss keeps what was flushed into the log: up to the retire, or to the
    # start of the epoch B started once the hints no longer named the old one
    ep = _epoch_or_none(root)
    os.truncate(log_path(root, SID), max(durable, ep.start) if ep is not None else durable)
    assert _tokens(root) == [f"m{i}" for i in range(6)]


@pytest.mark.parametrize("fault", ["copy_back_pwrite", "first_look_preadv", "journal_open"])
def test_a_transient_fault_in_recovery_never_loses_what_the_journal_holds(
    root: Path, fault: str
) -> None:
    """Promise 5 (and 1). Attack: after a power loss, one EIO in the recovery of the
    first process (its write of the copy, its first look's read of the journal, its
    open of the journal); that process loads and appends once the fault is gone; the
    next process must still find every acknowledged append."""
    _killed_writer(root, [f"m{i}" for i in range(10)])
    ep = _epoch_or_none(root)
    assert ep is not None
    os.truncate(log_path(root, SID), ep.start + 100)
    _drop_caches(root)
    if fault == "copy_back_pwrite":
        injected: Any = _Fault("pwrite", "log.jsonl", lambda n: n == 1)
    elif fault == "first_look_preadv":
        injected = _Fault("preadv", "log.journal", lambda n: n == 1)
    else:
        real = os.open

        class OpenFault:
            def __enter__(self) -> None:
                self.n = 0

                def once(path: Any, flags: int, *a: Any, **k: Any) -> int:
                    if os.fspath(path).endswith("log.journal") and self.n == 0:
                        self.n += 1
                        raise OSError(errno.EIO, "EIO")
                    return real(path, flags, *a, **k)

                os.open = once  # type: ignore[assignment]

            def __exit__(self, *exc: object) -> None:
                os.open = real

        injected = OpenFault()
    s = SessionStore(root, durability="fsync")
    with injected:
        try:
            s.last_seq(SID)
        except EventStoreError:
            pass  # refusing the session is fine; losing its appends is not
    try:
        s.append_transcript_messages(SID, _turn("m10"))
    except EventStoreError:
        pass
    s.close()
    got = _tokens(root)
    assert [t for t in got if t != "m10"] == [f"m{i}" for i in range(10)]


def test_close_never_raises_whatever_fails(root: Path) -> None:
    """Promise 5. Attack: close() of a store holding an epoch with every os.pwrite,
    os.fdatasync and os.open of the session's files failing; then (faults gone) nothing
    acknowledged is lost, even after a power loss at the epoch's start."""
    s = SessionStore(root, durability="fsync")
    for i in range(5):
        s.append_transcript_messages(SID, _turn(f"m{i}"))
    faults = [
        _Fault("pwrite", "log.journal", lambda n: True),
        _Fault("pwrite", "log.lock", lambda n: True),
        _Fault("fdatasync", "log.journal", lambda n: True),
        _Fault("fdatasync", "log.jsonl", lambda n: True, errno.ENOSPC),
    ]
    for f in faults:
        f.__enter__()
    try:
        s.close()
    finally:
        for f in reversed(faults):
            f.__exit__()
    ep = _epoch_or_none(root)
    if ep is not None:
        os.truncate(log_path(root, SID), ep.start)
    assert _tokens(root) == [f"m{i}" for i in range(5)]


def _old_release_replace(log: Path, extra: bytes = b"") -> None:
    """What a release before the generation did to replace the log: a copy renamed
    over it, nothing else."""
    tmp = log.with_name("log.jsonl.old-release")
    tmp.write_bytes(log.read_bytes() + extra)
    os.replace(tmp, log)


@pytest.mark.parametrize("durability", ["fsync", "flush"])
def test_appends_after_a_replace_without_a_generation_bump_land_in_the_new_log(
    root: Path, durability: str
) -> None:
    """Promise 6. Attack: 60 times, right after an append (the fast path armed), the log
    renamed over by a copy without bumping the generation; the next append must land in
    the file now at the path (read before any other process could copy anything back)."""
    s = SessionStore(root, durability=durability)  # type: ignore[arg-type]
    s.append_transcript_messages(SID, _turn("m0", 100))
    s.append_transcript_messages(SID, _turn("m1", 100))
    log = log_path(root, SID)
    for i in range(2, 62):
        _old_release_replace(log)
        s.append_transcript_messages(SID, _turn(f"m{i}", 100))
        assert _line_end(log.read_bytes(), f"m{i}") > 0, i
    s.close()
    assert _tokens(root) == [f"m{i}" for i in range(62)]


class _CoarseTimes:
    """A stat result whose times have `grain` ns granularity (a file system that keeps
    coarse directory times: 1 s for ext4 with 128-byte inodes, HFS+, FAT's 2 s; the
    kernel's coarse clock, a jiffy, before Linux 6.13's fine-grained timestamps)."""

    def __init__(self, st: os.stat_result, grain: int) -> None:
        self._st = st
        self.st_mtime_ns = st.st_mtime_ns // grain * grain
        self.st_ctime_ns = st.st_ctime_ns // grain * grain

    def __getattr__(self, name: str) -> Any:
        return getattr(self._st, name)


def test_the_fsync_fast_path_with_coarse_directory_times_follows_a_replaced_log(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promise 6. Attack: the same replace as above on a file system whose directory
    times have 1 s granularity (modelled by rounding what os.lstat says of the session
    directory), within one second of the directory's last change."""
    d = os.fspath(_paths(root).dir)
    real = os.lstat

    def coarse(path: Any, *a: Any, **k: Any) -> Any:
        st = real(path, *a, **k)
        return _CoarseTimes(st, 1_000_000_000) if os.fspath(path) == d else st

    monkeypatch.setattr(os, "lstat", coarse)
    while time.time() % 1 > 0.6:  # the whole attack inside one second
        time.sleep(0.02)
    s = SessionStore(root, durability="fsync")
    s.append_transcript_messages(SID, _turn("m0", 100))  # creates the log: a change
    s.append_transcript_messages(SID, _turn("m1", 100))  # the directory changed: stamp
    log = log_path(root, SID)
    _old_release_replace(log)
    s.append_transcript_messages(SID, _turn("m2", 100))
    monkeypatch.undo()
    assert _line_end(log.read_bytes(), "m2") > 0


@pytest.mark.parametrize("child_closes", [False, True])
def test_a_forked_child_appends_durably_beside_the_parents_epoch(
    root: Path, child_closes: bool
) -> None:
    """Promise 7. Attack: the parent holds an epoch (journal open, hints cached) and
    forks; the child appends durably with the same store object (and closes it, which
    retires the epoch, or dies without closing) while the parent appends too; then the
    parent appends more; a power loss at the epoch's start loses nothing of either."""
    s = SessionStore(root, durability="fsync")
    for i in range(5):
        s.append_transcript_messages(SID, _turn(f"p{i}"))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for i in range(10):
                s.append_transcript_messages(SID, _turn(f"c{i}"))
            if child_closes:
                s.close()
            code = 0
        finally:
            os._exit(code)
    for i in range(5, 10):
        s.append_transcript_messages(SID, _turn(f"p{i}"))
    assert wait_child(pid, 30) == 0
    for i in range(10, 15):
        s.append_transcript_messages(SID, _turn(f"p{i}"))
    ep = _epoch_or_none(root)
    assert ep is not None
    os.truncate(log_path(root, SID), ep.start)
    got = _tokens(root)
    assert sorted(got) == sorted([f"p{i}" for i in range(15)] + [f"c{i}" for i in range(10)])
    assert [t for t in got if t[0] == "p"] == [f"p{i}" for i in range(15)]
    assert _verify_ok(root)
    s.close()


def test_a_fork_while_a_parent_thread_is_appending_keeps_both_durable(root: Path) -> None:
    """Promise 7. Attack: a parent thread appends in a loop (holding the session's lock
    and the file lock at times) while the main thread forks children that append
    durably and die without closing; then a power loss at the epoch's start."""
    s = SessionStore(root, durability="fsync")
    s.append_transcript_messages(SID, _turn("p0"))
    done: list[str] = ["p0"]
    stop = threading.Event()

    def loop() -> None:
        i = 1
        while not stop.is_set():
            s.append_transcript_messages(SID, _turn(f"p{i}", 500))
            done.append(f"p{i}")
            i += 1

    t = threading.Thread(target=loop)
    t.start()
    try:
        children = []
        for k in range(3):
            time.sleep(0.05)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    for i in range(5):
                        s.append_transcript_messages(SID, _turn(f"c{k}.{i}", 500))
                        os.write(w, f"c{k}.{i}\n".encode())
                finally:
                    os._exit(0)
            os.close(w)
            children.append((pid, r))
        acked = []
        for pid, r in children:
            assert wait_child(pid, 30) == 0
            acked += _read_pipe(r)
            os.close(r)
    finally:
        stop.set()
        t.join()
    assert len(acked) == 15
    ep = _epoch_or_none(root)
    assert ep is not None
    os.truncate(log_path(root, SID), ep.start)
    _check_acked(root, [*done, *acked])
    s.close()


# -- issue 29 item 4: readers never write ---------------------------------------------------
#
# Recovery after a power loss belongs to writers (and `repair`), under the writers' lock:
# a reader that finds the log lacking what its journal acknowledged reads it laid over
# the log in memory, and changes no file of the store.


def _store_files(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under the store root: its bytes and modification time."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _power_loss_state(root: Path, n: int) -> list[str]:
    """A durable writer killed after `n` acknowledged turns, then a power loss that cut
    the log inside its journal's epoch, mid-line (a torn tail); the acknowledged turns."""
    toks = [f"m{i}" for i in range(n)]
    ep, _, whole = _crash(root, toks, size=900)
    keep = ep.start + (len(whole) - ep.start) // 2 + 7
    os.truncate(log_path(root, SID), keep)
    assert whole[keep - 1 : keep] != b"\n"
    return toks


def _api_reads(store: SessionStore, toks: list[str]) -> Iterator[tuple[str, bool]]:
    """(what was read, whether it returned the acknowledged events), one read at a time."""
    n = len(toks)

    def tokens(messages: list[Message]) -> list[str]:
        return [m.content.split(" ")[0] for m in messages]

    yield "transcript", tokens(store.load_transcript_messages(SID)) == toks
    yield "last page", tokens(store.load_transcript_messages(SID, last=3)) == toks[-3:]
    yield "page", tokens(store.load_transcript_messages(SID, start=n - 5, limit=2)) == toks[-5:-3]
    yield "bootstrap", store.load_bootstrap_state(SID) == BootstrapState()  # (turns only)
    yield "last_seq", store.last_seq(SID) == n
    yield "read_events", len(list(store.read_events(SID))) == n
    yield "transcript_at", tokens(store.transcript_at(SID, seq=n)) == toks
    yield "state_at", store.state_at(SID, seq=n) is not None
    report = store.verify(SID)
    yield "verify", report.ok
    yield "list_sessions", store.list_sessions() == [SID]
    follow = store.follow(SID, poll_interval=0.01)
    got = [next(follow) for _ in range(n)]
    follow.close()  # type: ignore[attr-defined]
    yield "follow", [e.seq for e in got] == list(range(1, n + 1))


def test_readers_never_write_after_a_power_loss_and_read_every_acknowledged_event(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 item 4: after a power loss that cut the log (mid-line) inside its
    journal's epoch, every read (the API's loads, pages, history, verify, follow; the
    CLI's read commands; a `serve` GET), each from a fresh store, reads every
    acknowledged event, and no file under the store root changes (bytes or mtime): the
    first reader used to copy the journal back into the log. The next writer does it."""
    toks = _power_loss_state(root, 30)
    before = _store_files(root)
    for durability in ("flush", "fsync"):
        for k in range(11):  # a fresh store for each read: each is its first use
            with SessionStore(root, durability=durability) as s:  # type: ignore[arg-type]
                what, ok = list(islice(_api_reads(s, toks), k + 1))[-1]
            assert ok, what
            assert _store_files(root) == before, what
    out_file = tmp_path / "report.html"
    for argv in (
        ["transcript", str(root), SID],
        ["log", str(root), SID, "--json"],
        ["state", str(root), SID],
        ["stats", str(root), SID],
        ["export", str(root), SID, "--format", "jsonl"],
        ["verify", str(root), SID],
        ["sessions", str(root)],
        ["report", str(root), SID, "-o", str(out_file)],
    ):
        rc, out, err = cli_in_process(capsys, *argv)
        assert rc == 0, (argv, err)
        assert _store_files(root) == before, argv
        if argv[0] in ("transcript", "export"):
            assert all(t in out for t in toks), argv
        if argv[0] == "log":
            assert len(out.strip().splitlines()) >= len(toks)
    server = ReportServer(root, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection(HOST, server.server_address[1], timeout=30)
        conn.request("GET", f"/session/{SID}")
        page = conn.getresponse().read().decode()
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert toks[-1] in page
    assert _store_files(root) == before
    with SessionStore(root, durability="fsync") as s:  # the next writer copies back
        s.append_transcript_messages(SID, _turn("after"))
    assert _tokens(root) == [*toks, "after"]
    assert _verify_ok(root)


def test_a_reader_never_writes_beside_a_live_writer_and_a_tool_that_replaced_the_log(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 item 4: with a durable writer alive (its epoch open), a tool holding
    `log.lock` replaces the log minus its last turn; the next reader (`eventstore
    transcript`, a `serve` GET) copied that turn back from the journal. It writes
    nothing now; the next writer settles the log under the lock."""
    writer = _append(root, 10)
    paths = _paths(root)
    data = paths.log.read_bytes()
    fd = os.open(paths.lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        tmp = paths.dir / "tool.tmp"
        tmp.write_bytes(data[: data.rfind(b"\n", 0, len(data) - 1) + 1])
        os.replace(tmp, paths.log)
    finally:
        os.close(fd)
    before = _store_files(root)
    rc, out, err = cli_in_process(capsys, "transcript", str(root), SID)
    assert rc == 0, err
    assert "m8" in out
    assert _store_files(root) == before
    server = ReportServer(root, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection(HOST, server.server_address[1], timeout=30)
        conn.request("GET", f"/session/{SID}")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert _store_files(root) == before
    writer.append_transcript_messages(SID, _turn("next"))
    writer.close()
    got = _tokens(root)
    assert got[:9] == [f"m{i}" for i in range(9)] and got[-1] == "next"
    assert len(got) == len(set(got))
    assert _verify_ok(root)


def test_a_reader_that_read_in_memory_continues_once_a_writer_copied_back(root: Path) -> None:
    """Issue 29 item 4, attacked: a long-lived reader reads the acknowledged appends laid
    over a cut log (its positions point past the log's end); another process's writer
    copies them back and appends, then compacts. The reader's next loads (catching up from
    those positions, then after the swap) hold each event once, and its follow yields the
    new events once."""
    toks = _power_loss_state(root, 24)
    reader = SessionStore(root, caches=False)
    try:
        assert [m.content.split(" ")[0] for m in reader.load_transcript_messages(SID)] == toks
        follow = reader.follow(SID, poll_interval=0.01)
        assert [next(follow).seq for _ in toks] == list(range(1, len(toks) + 1))

        def write(tok: str, compact: bool) -> None:
            with SessionStore(root, durability="fsync") as s:
                s.append_transcript_messages(SID, _turn(tok))
                if compact:
                    s.compact(SID, force=True)

        assert _in_child(lambda: write("a0", False)) == 0
        assert next(follow).seq == len(toks) + 1
        got = [m.content.split(" ")[0] for m in reader.load_transcript_messages(SID)]
        assert got == [*toks, "a0"]
        assert _in_child(lambda: write("a1", True)) == 0
        got = [m.content.split(" ")[0] for m in reader.load_transcript_messages(SID)]
        assert got == [*toks, "a0", "a1"]
        assert next(follow).seq == len(toks) + 2
        follow.close()  # type: ignore[attr-defined]
        assert reader.verify(SID).ok
    finally:
        reader.close()


def test_caches_a_reader_saved_over_the_overlay_read_the_acknowledged_events(
    root: Path,
) -> None:
    """Issue 29 item 4, attacked: a reader whose store keeps caches (every log long
    enough: `Tuning` at 0) folds a log whose middle a power loss zeroed (its size kept,
    so a cache's head is within it) laid over with the journal, and saves fold caches
    and a checked prefix of what it read. It writes those caches only (never the log,
    journal or lock file); fresh readers trusting them read every acknowledged event and
    verify, before and after the next writer copies the journal back."""
    _write(root, 40)
    ep = _epoch(root)
    assert ep is not None
    log = log_path(root, SID)
    whole = log.read_bytes()
    hole = ep.start + (len(whole) - ep.start) // 3
    log.write_bytes(whole[:hole] + bytes(3000) + whole[hole + 3000 :])
    for p in log.parent.glob("fold-*.cache"):
        p.unlink()
    before = _store_files(root)
    eager = Tuning(cache_on_close=0, cache_after_fold=0)
    toks = [f"m{i}" for i in range(40)]

    def read() -> list[str]:
        with SessionStore(root, tuning=eager) as s:
            got = [m.content.split(" ")[0] for m in s.load_transcript_messages(SID)]
            assert s.load_bootstrap_state(SID) == BootstrapState()
            assert s.verify(SID).ok
            return got

    assert read() == toks
    after = _store_files(root)
    changed = {name for name in after if after[name] != before.get(name)}
    assert changed and all(Path(name).name.startswith("fold-") for name in changed), changed
    assert read() == toks  # trusting them
    with SessionStore(root, durability="fsync", tuning=eager) as s:
        s.append_transcript_messages(SID, _turn("after"))
    assert log.read_bytes()[: len(whole)] == whole
    assert read() == [*toks, "after"]
