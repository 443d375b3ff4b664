"""What only the file engine does: files set aside, leftovers of crashed removals, the
archive of a compaction that raced appends."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import log_path, make_entry
from tuning import tune

from eventstore import (
    SessionStore,
    Snapshot,
    entropy,
)
from eventstore.engines.file.engine import FileEngine
from eventstore.engines.file.layout import SessionPaths, write_atomically
from eventstore.ops import audit
from projections import snapshot_entry


def test_a_torn_tail_is_saved_aside_before_the_next_writer_cuts_it(root: Path) -> None:
    with SessionStore(root) as store:
        for i in range(3):
            store.append_progress_entry("s", make_entry(i))
    path = log_path(root, "s")
    torn = b'{"type":"progress_appended","seq":4,"ts":"2026-'
    with open(path, "ab") as f:
        f.write(torn)
    with SessionStore(root) as store:
        store.append_progress_entry("s", make_entry(3))
        assert store.verify("s").ok
    aside = sorted(path.parent.glob("log.jsonl.torn-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == torn


def test_an_aside_never_replaces_an_earlier_one_when_the_clock_is_set_back(root: Path) -> None:
    """Files set aside are named by the time: with the clock set back to the same instant
    (`entropy.fixed` from one start each time), the second torn tail saved replaced the
    first, bytes recovery promised to keep, and a second `repair` failed with
    `StorageError` (the name of its hard link was taken). Each gets a name of its own."""
    with SessionStore(root) as store:
        store.append_progress_entry("s", make_entry(0))
    path = log_path(root, "s")
    torn = [b'{"type":"progress_appended","seq":%d,"ts":"2026-' % (k + 2) for k in range(2)]
    for k, tail in enumerate(torn):
        with path.open("ab") as f:
            f.write(tail)
        with entropy.fixed(k), SessionStore(root) as store:
            store.append_progress_entry("s", make_entry(k + 1))
    assert sorted(p.read_bytes() for p in path.parent.glob("log.jsonl.torn-*")) == torn
    moved, originals = [], []
    for k in range(2):
        data = path.read_bytes()
        first = data.index(b"\n") + 1
        path.write_bytes(data[:first] + b"garbage\n" + data[first:])  # a bad line in the middle
        originals.append(path.read_bytes())
        with entropy.fixed(k), SessionStore(root) as store:
            report = audit.repair(store, "s")
            assert report.moved_to is not None and store.verify("s").ok
            moved.append(Path(report.moved_to))
    assert moved[0] != moved[1] and [p.read_bytes() for p in moved] == originals


def test_leftovers_of_a_crashed_removal_are_never_listed_and_are_cleaned(root: Path) -> None:
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry(0))
        store.append_progress_entry("b", make_entry(0))
        # a removal that crashed after its rename, before deleting what it renamed
        sessions = SessionPaths(root, "a").dir.parent
        (sessions / "a").rename(sessions / ".removed-deadbeef")
        assert store.list_sessions() == ["b"]
        assert store.delete_session("b", purge=True) is True
        assert sorted(p.name for p in sessions.iterdir()) == []


def test_an_archive_holds_only_what_the_snapshot_replaced(root: Path) -> None:
    """Lines appended between the fold and the install stay live after the snapshot; the
    archive keeps lines up to the snapshot's seq only, so history holds each line once."""
    with SessionStore(root) as store:
        for i in range(4):
            store.append_progress_entry("s", make_entry(i))
        state = store.load_bootstrap_state("s")
        engine = store.engine
        assert isinstance(engine, FileEngine)
        covers = engine.read("s", None).head
        store.append_progress_entry("s", make_entry(4))  # lands after the fold
        entry = snapshot_entry(store.bootstrap, state)
        snap = Snapshot(base_h=covers.link, states={"bootstrap": entry})
        when = make_entry(0).created_at
        line, _ = store.codec.encode_snapshot(snap, covers.seq, covers.link, when)
        done = engine.install_snapshot("s", line, covers, keep_history=True)
        assert done.archived is not None and done.archived.endswith(
            "000000000001-000000000004.jsonl"
        )
        assert Path(done.archived).read_bytes().count(b"\n") == 4
        live = log_path(root, "s").read_bytes()
        assert live.startswith(line) and live.count(b"\n") == 2
        assert done.head.seq == 5


def test_an_install_stopped_before_naming_its_archive_reads_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction whose log got a tail meanwhile archives a copy of its prefix, then
    removes the pending link to the whole old log; stopped in between (a crash, an I/O
    error), both stay: two overlapping copies from seq 1. History readers read each
    event once and `verify` is clean (the copies are compared), instead of a sequence
    error at the second copy."""
    import eventstore.engines.file.engine as file_engine
    from eventstore import StorageError

    with SessionStore(root) as s:
        for i in range(10):
            s.append_progress_entry("s", make_entry(i))
        install = s.engine.install_snapshot

        def with_a_tail(*args: Any, **kw: Any) -> Any:
            with SessionStore(root) as other:  # appended after the fold, before the swap
                other.append_progress_entry("s", make_entry(99))
            return install(*args, **kw)

        real_unlink = os.unlink

        def unlink(path: Any, *a: Any, **kw: Any) -> None:
            if str(path).endswith(".pending"):
                raise OSError(5, "injected")
            real_unlink(path, *a, **kw)

        monkeypatch.setattr(s.engine, "install_snapshot", with_a_tail)
        monkeypatch.setattr(file_engine.os, "unlink", unlink)
        with pytest.raises(StorageError, match="naming the archive failed"):
            s.compact("s")
        monkeypatch.undo()
    archive = sorted(p.name for p in (log_path(root, "s").parent / "archive").iterdir())
    assert archive == ["000000000001-000000000010.jsonl", "000000000001-000000000011.jsonl.pending"]
    with SessionStore(root) as s:
        assert [e.seq for e in s.read_events("s")] == list(range(1, 12))
        report = s.verify("s")
        assert report.ok, report.problems
        assert [p.summary for p in s.load_bootstrap_state("s").recent_progress][-1] == "step 99"


@pytest.mark.usefixtures("no_transcript_cache")  # the log read itself is attacked
def test_a_snapshot_longer_than_a_piece_is_read_at_once_and_still_checked(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load reads a log that opens with a long snapshot in pieces: the snapshot's
    header says where its line ends, so the first piece is that line read in one pread
    (not a piece, then 4 pieces, then the line); its bytes are still checked."""
    from eventstore.engines.file import engine as file_module
    from eventstore.errors import CorruptLogError
    from eventstore.records import (
        Message,
        Role,
    )

    with SessionStore(root) as s:
        for i in range(300):
            s.append_transcript_messages("s", [Message(Role.USER, f"{i} " + "x" * 1000)])
        s.compact("s")
        for i in range(100):
            s.append_transcript_messages("s", [Message(Role.USER, f"after {i} " + "z" * 1000)])
        expected = s.load_transcript_messages("s")
    log = log_path(root, "s")
    data = log.read_bytes()
    snapshot_end = data.index(b"\n") + 1
    assert snapshot_end > 256 << 10
    reads: list[int] = []
    real = file_module.pread_all

    def pread_all(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(file_module, "pread_all", pread_all)
    engine = FileEngine(root)
    res, more = engine.read_some("s", None, 64 << 10)
    assert reads == [snapshot_end] and res.data == data[:snapshot_end] and more
    assert res.head.seq == 300 and res.head.size == snapshot_end
    rest = b""
    while more:
        res, more = engine.read_some("s", res.head.position, 64 << 10)
        rest += res.data
    assert rest == data[snapshot_end:]
    with SessionStore(root) as s:
        assert s.load_transcript_messages("s") == expected
    at = data.index(b"x" * 1000, snapshot_end // 2) + 500  # inside the transcript state
    log.write_bytes(data[:at] + b"y" + data[at + 1 :])
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")


@pytest.mark.parametrize("marks", [True, False], ids=["checked prefix", "every line checked"])
def test_a_load_in_small_pieces_folds_what_a_whole_read_does(
    root: Path, monkeypatch: pytest.MonkeyPatch, marks: bool
) -> None:
    """Pieces cut at their last whole batch come as views of the engine's buffer
    (not copied): read in place when checked, copied when their lines are hashed."""
    from eventstore.records import (
        Message,
        Role,
    )

    with SessionStore(root) as s:
        for i in range(120):
            s.append_transcript_messages(
                "s", [Message(Role.USER, f"{i} " + "q" * (i * 37 % 700)), Message(Role.TOOL, "t")]
            )
            if i % 7 == 0:
                s.append_progress_entry("s", make_entry(i))
        whole = s.load_transcript_messages("s"), s.load_bootstrap_state("s")
    res, more = FileEngine(root).read_some("s", None, 4096)
    assert more and isinstance(res.data, memoryview) and bytes(res.data).endswith(b"\n")
    tune(monkeypatch, read_piece=4096)
    with SessionStore(root) as s:
        s.core.caches.marks = marks
        assert (s.load_transcript_messages("s"), s.load_bootstrap_state("s")) == whole


# -- attacks -------------------------------------------------------------------------------


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "cache"])
def test_a_failed_rename_keeps_a_durable_file_and_leaves_no_part_of_a_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """Attack: ENOSPC from the rename of `write_atomically`. A durable file (a log, a
    key, a manifest) keeps its old bytes; a cache (`durable=False`, whose old file is let
    go before the rename) is the old or none, never a part of the new; no temporary file
    is left; the next write lands."""
    target = tmp_path / "f"
    write_atomically(target, b"old", durable=durable)

    def enospc(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(os, "replace", enospc)
        with pytest.raises(OSError) as err:
            write_atomically(target, [b"ne", b"w"], durable=durable)
    assert err.value.errno == errno.ENOSPC
    assert [n for n in os.listdir(tmp_path) if n != "f"] == []
    assert target.exists() or not durable
    assert not target.exists() or target.read_bytes() == b"old"
    write_atomically(target, [b"ne", b"w"], durable=durable)
    assert target.read_bytes() == b"new"


@pytest.mark.usefixtures("collector_on")
def test_write_atomically_takes_a_name_that_is_not_utf_8(tmp_path: Path) -> None:
    """8f26bc8 cuts the temporary name to the target name's first 120 bytes with
    `path.name.encode()`: a name that is not UTF-8 (Linux names are bytes; Python gives
    them with surrogate escapes, as argv does for `report -o`) raised UnicodeEncodeError,
    where it was written before."""
    target = tmp_path / os.fsdecode(b"report-\xff.html")
    write_atomically(target, b"<html></html>")  # fails: UnicodeEncodeError
    assert target.read_bytes() == b"<html></html>"
    assert os.listdir(tmp_path) == [target.name]
