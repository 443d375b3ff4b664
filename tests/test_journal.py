"""The file engine's journal (`durability="fsync"`, eventstore/engines/file_journal.py):
an append flushes the preallocated mirror, not the growing log; what a power loss took
from the log and the journal acknowledged is copied back before anything reads it;
nothing else is ever changed by it.

Power losses are modelled here by cutting the log (or zeroing a range of it) the way a
crash can leave it; `tests/test_crash_states.py` explores every crash state of the
real system calls under two persistence models.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import log_path, make_entry, wait_child

from eventstore import (
    CorruptLogError,
    Message,
    Role,
    SessionStore,
)
from eventstore.engines.file import journal as file_journal
from eventstore.engines.file.layout import SessionPaths
from eventstore.ops.repair import repair

SID = "s"


def _turn(i: int) -> list[Message]:
    return [Message(role=Role.USER, content=f"m{i} " + "x" * 1500)]


def _append(root: Path, n: int, first: int = 0) -> SessionStore:
    """A durable store that appended turns `first`.. `first + n`, left open."""
    s = SessionStore(root, durability="fsync")
    for i in range(first, first + n):
        s.append_transcript_messages(SID, _turn(i))
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
    with SessionStore(root) as s:
        s.core.caches.cached = {}
        return [m.content.split(" ")[0] for m in s.load_transcript_messages(SID)]


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
        store.append_transcript_messages(SID, _turn(i))
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
        with caplog.at_level(logging.WARNING, logger="eventstore"):
            assert _contents(root) == [f"m{i}" for i in range(60)], keep
        assert log.read_bytes() == whole, keep
        assert "copied back" in caplog.text
        caplog.clear()
        with SessionStore(root) as s:
            assert s.verify(SID).ok


def test_zeros_where_a_write_was_lost_are_filled_from_the_journal(root: Path) -> None:
    """A file system may keep a later write and not an earlier one: a run of zeros."""
    _write(root, 40)
    ep = _epoch(root)
    assert ep is not None
    log = log_path(root, SID)
    whole = log.read_bytes()
    hole = ep.start + (len(whole) - ep.start) // 3
    log.write_bytes(whole[:hole] + bytes(3000) + whole[hole + 3000 :])
    for p in log.parent.glob("fold-*.cache"):
        p.unlink()
    assert _contents(root) == [f"m{i}" for i in range(40)]
    assert log.read_bytes() == whole


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
        flush.append_transcript_messages(SID, _turn(5))
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
            s.append_transcript_messages(SID, _turn(i))
        assert _epoch(root) is not None
    assert _epoch(root) is None
    assert _contents(root) == [f"m{i}" for i in range(20)]


def test_removing_a_session_removes_its_journal(root: Path) -> None:
    _write(root, 3)
    with SessionStore(root, durability="fsync") as s:
        assert s.delete_session(SID)
    assert not SessionPaths(root, SID).dir.exists()


def test_a_flush_store_keeps_no_journal(root: Path) -> None:
    with SessionStore(root) as s:
        for i in range(20):
            s.append_progress_entry(SID, make_entry(i))
    assert not SessionPaths(root, SID).journal.exists()


def test_the_fsync_fast_path_never_stats_the_log(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking the log's times makes its next write log its inode, which every flush of
    the journal then commits too (~50 us an append here): steady durable appends ask
    the kernel where the descriptor points instead, and take the size by lseek."""
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
        store.append_transcript_messages(SID, _turn(i))
    monkeypatch.undo()
    store.close()
    assert not [p for p in stats if p.endswith("log.jsonl")], stats
    assert _contents(root) == [f"m{i}" for i in range(40)]
