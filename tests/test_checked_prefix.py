"""The checked prefix (eventstore.core.checked_prefix): a digest of a live log's first bytes
that passed the hash-chain check, so a cold load checks them with one SHA-256.

Attacks: an edit anywhere in the vouched-for bytes (and a flip of every 397th byte), the
log cut short below the mark, a mark that is garbage, of another session, of another
log (after compaction), or with a wrong digest or size; a line whose hash does not
check appended after a reader's prefix; a fork. Writers keep no prefix (hashing what
they append cost an eighth of an append): a load that checked the log from its start
keeps one, and so does a compaction for the snapshot it wrote. Each time the load
either returns exactly what a fully checked fold returns or raises CorruptLogError:
never a state folded from bytes the chain did not pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import oracle
import pytest
from conftest import (
    cache_path,
    check_whole,
    log_path,
    make_entry,
    make_features,
    make_manifest,
    wait_child,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuning import tune

from eventstore import SessionStore
from eventstore.core import checked_prefix, tuning
from eventstore.core import fold_loop as fold_loop_module
from eventstore.core.tuning import Tuning
from eventstore.errors import CorruptLogError
from eventstore.format import reader as log_module
from eventstore.records import (
    Message,
    Role,
)

# these tests attack how a load reads and checks the log: no transcript fold cache
# stands in for it (see conftest.no_transcript_cache)
pytestmark = pytest.mark.usefixtures("no_transcript_cache")


MSG = [Message(role=Role.USER, content="u" * 300), Message(role=Role.ASSISTANT, content="a" * 900)]


def _mark_file(root: Path, sid: str = "s") -> Path:
    return cache_path(root, sid, checked_prefix.NAME)


def _fill(store: SessionStore, sid: str = "s", turns: int = 100) -> None:
    store.initialize_session_if_missing(sid, make_manifest(sid), make_features(5))
    for i in range(turns):
        store.append_transcript_messages(sid, MSG)
        if i % 5 == 0:
            store.append_progress_entry(sid, make_entry(i))


class _Spy:
    """Counts the bytes read_lines was given as already checked, and as not."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trusted = 0
        self.checked = 0
        real = log_module.read_lines

        def read_lines(buf: bytes, *a: Any, hashes_checked: bool = False, **kw: Any) -> Any:
            if hashes_checked:
                self.trusted += len(buf)
            else:
                self.checked += len(buf)
            return real(buf, *a, hashes_checked=hashes_checked, **kw)

        monkeypatch.setattr(fold_loop_module, "read_lines", read_lines)


@pytest.fixture
def written(root: Path) -> Path:
    """A session of ~150 KB, then a reader that checked it whole and saved its prefix."""
    with SessionStore(root) as s:
        _fill(s)
    assert not _mark_file(root).exists()  # a writer keeps none
    check_whole(root, "s")
    assert _mark_file(root).is_file()
    return root


def test_a_reader_saves_its_prefix_and_a_cold_load_trusts_it(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = log_path(written, "s").stat().st_size
    kept = json.loads(_mark_file(written).read_bytes().split(b"\n")[1])
    assert kept["size"] == size  # the whole log: the reader checked every byte
    truth = oracle.truth(written, "s")
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        assert s.load_transcript_messages("s") == truth.transcript
        assert spy.trusted == size and spy.checked == 0


def test_a_copied_store_trusts_the_prefix_its_reader_saved(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark is bound to the log's bytes and the lock file's generation, not its
    inode: in a copy of the store (`shutil.copytree`, new inodes) a cold load checks
    the whole log with the one digest."""
    copy = shutil.copytree(written, written.parent / "copy")
    assert os.stat(log_path(copy, "s")).st_ino != os.stat(log_path(written, "s")).st_ino
    size = log_path(copy, "s").stat().st_size
    truth = oracle.truth(copy, "s")
    spy = _Spy(monkeypatch)
    with SessionStore(copy) as s:
        assert s.load_transcript_messages("s") == truth.transcript
    assert spy.trusted == size and spy.checked == 0


def test_a_load_checks_line_by_line_what_was_appended_after_the_prefix(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(written) as other:
        other.core.caches.marks = (
            False  # a writer that keeps no prefix (another process, an old release)
        )
        other.append_transcript_messages("s", [Message(role=Role.USER, content="later")])
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        messages = s.load_transcript_messages("s")
    assert spy.trusted > 0 and 0 < spy.checked < 1000
    assert messages[-1].content == "later" and messages == oracle.truth(written, "s").transcript


@pytest.mark.parametrize("where", ["a message", "a progress summary", "a hash"])
def test_an_edit_in_the_vouched_bytes_is_caught(written: Path, where: str) -> None:
    log = log_path(written, "s")
    data = log.read_bytes()
    needle = {"a message": b"u" * 300, "a progress summary": b"step 50", "a hash": b'"h":"'}[where]
    at = data.index(needle, len(data) // 2) + len(needle) - 2
    edited = data[:at] + (b"v" if data[at : at + 1] != b"v" else b"w") + data[at + 1 :]
    log.write_bytes(edited)  # same length, still JSON: only the chain can tell
    with SessionStore(written) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")


@pytest.mark.slow
@pytest.mark.parametrize(
    "piece", [None, 4096], ids=["one piece", "4 KiB pieces (views, hashed aside)"]
)
def test_a_flip_of_any_byte_is_caught_or_harmless(
    written: Path, monkeypatch: pytest.MonkeyPatch, piece: int | None
) -> None:
    if piece is not None:  # pieces cut mid-batch come as views; each hashed on the side
        tune(monkeypatch, read_piece=piece)
        tune(monkeypatch, hash_aside=0)
    log = log_path(written, "s")
    data = log.read_bytes()
    truth = oracle.truth(written, "s")
    for at in range(0, len(data), 397):
        flipped = bytes([data[at] ^ 0x01])
        log.write_bytes(data[:at] + flipped + data[at + 1 :])
        try:
            with SessionStore(written) as s:
                got = s.load_bootstrap_state("s"), s.load_transcript_messages("s")
        except CorruptLogError:
            continue
        assert got == truth, f"a flip at byte {at} changed what a load returned"
    log.write_bytes(data)


def test_a_log_cut_below_the_mark_ignores_the_mark(written: Path) -> None:
    log = log_path(written, "s")
    data = log.read_bytes()
    cut = data.rindex(b"\n", 0, len(data) // 2) + 1
    log.write_bytes(data[:cut])
    with SessionStore(written) as s:
        cut_messages = s.load_transcript_messages("s")
    assert cut_messages == oracle.truth(written, "s").transcript and len(cut_messages) < 200


@pytest.mark.parametrize(
    "damage",
    ["garbage", "empty", "other session", "wrong digest", "wrong size", "shorter size", "format"],
)
def test_a_damaged_or_foreign_mark_is_ignored(written: Path, damage: str) -> None:
    mark = _mark_file(written)
    head, line, _ = mark.read_bytes().split(b"\n")
    kept = json.loads(line)
    if damage == "garbage":
        line = b"\x00not json"
    elif damage == "empty":
        line = b""
    elif damage == "other session":
        kept["session"] = "t"
    elif damage == "wrong digest":
        kept["sha256"] = "0" * 64
    elif damage == "wrong size":
        kept["size"] += 1
    elif damage == "shorter size":
        kept["size"] //= 2
    else:
        kept["format"] = 99
    if damage not in ("garbage", "empty"):
        line = json.dumps(kept).encode()
    mark.write_bytes(head + b"\n" + line + b"\n")
    truth = oracle.truth(written, "s")
    with SessionStore(written) as s:
        assert s.load_transcript_messages("s") == truth.transcript
        assert s.load_bootstrap_state("s") == truth.state


def test_verify_finds_an_edit_even_under_a_forged_mark(
    written: Path,
) -> None:
    """The threat model, pinned: the digest, like the chain, is unkeyed. An edit caught
    by the chain is also caught with a mark, unless the editor also rewrites the mark's
    digest; `verify` always checks the whole chain and still finds it."""
    log = log_path(written, "s")
    data = log.read_bytes()
    at = data.index(b"u" * 300) + 10
    edited = data[:at] + b"v" + data[at + 1 :]
    log.write_bytes(edited)
    mark = _mark_file(written)
    head, line, _ = mark.read_bytes().split(b"\n")
    kept = json.loads(line)
    import hashlib

    kept["sha256"] = hashlib.sha256(edited[: kept["size"]]).hexdigest()
    mark.write_bytes(head + b"\n" + json.dumps(kept).encode() + b"\n")
    with SessionStore(written) as s:
        assert not s.verify("s").ok


def test_a_mark_of_a_replaced_log_is_not_used(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore(written) as s:
        s.core.caches.marks = False  # a compactor that keeps no prefix (an older release): the mark
        s.compact("s")  # left on disk is the replaced log's
    truth = oracle.truth(written, "s")
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        assert s.load_transcript_messages("s") == truth.transcript
    assert spy.trusted == 0  # the old log's mark names another file: the engine drops it


def test_bytes_appended_after_a_readers_prefix_are_never_vouched_for(root: Path) -> None:
    """A reader keeps its prefix while a line whose hash does not check is appended
    behind its back: its own append is refused (a writer never chains onto a last line
    that does not check), nothing written, and the prefix stops before the bad line,
    so a cold load still checks that line (and fails)."""
    with SessionStore(root) as w:
        _fill(w, turns=60)
    with SessionStore(root) as r:
        r.load_transcript_messages("s")  # checked from the start: the prefix
        log = log_path(root, "s")
        lines = log.read_bytes().splitlines(keepends=True)
        last = json.loads(lines[-1])
        bad = dict(last, seq=last["seq"] + 1, h="0" * 16)
        bad.pop("key", None)
        with open(log, "ab") as fh:
            fh.write(json.dumps(bad, separators=(",", ":")).encode() + b"\n")
        before = log.read_bytes()
        with pytest.raises(CorruptLogError):
            r.append_progress_entry("s", make_entry(999))
        assert log.read_bytes() == before
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")


def test_a_writer_keeps_no_prefix(root: Path) -> None:
    """What it appends is not hashed for a prefix (an eighth of an append's cost): the
    next cold load from the start checks every line, and keeps the prefix then."""
    with SessionStore(root) as w:
        _fill(w, turns=60)
        assert w.cache_info("s").prefix is None
    assert not _mark_file(root).exists()


def test_a_reader_that_checked_a_long_log_saves_a_prefix(root: Path) -> None:
    with SessionStore(root) as w:
        w.core.caches.marks = False
        _fill(w, turns=900)  # > 1 MiB
    assert not _mark_file(root).exists()
    truth = oracle.truth(root, "s")
    s = SessionStore(root)
    assert s.load_transcript_messages("s") == truth.transcript
    assert _mark_file(root).is_file()  # after a long checked fold, not only on close
    s.close()
    with SessionStore(root) as again:
        assert again.load_transcript_messages("s") == truth.transcript


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_without_the_parents_prefix(written: Path) -> None:
    with SessionStore(written) as s:
        s.load_transcript_messages("s")
        assert s.cache_info("s").prefix is not None
        pid = os.fork()
        if pid == 0:  # the child: no prefix inherited, and its loads still check
            ok = s.cache_info("s").prefix is None and len(s.load_transcript_messages("s")) == 200
            os._exit(0 if ok else 1)
        assert wait_child(pid, 60) == 0


def test_a_load_that_uses_the_saved_prefix_does_not_rewrite_it(written: Path) -> None:
    before = os.stat(_mark_file(written)).st_ino
    with SessionStore(written) as s:
        s.load_transcript_messages("s")
        s.load_bootstrap_state("s")
    assert os.stat(_mark_file(written)).st_ino == before  # no write (and no fsync) on a load


def test_a_compaction_vouches_for_the_snapshot_it_wrote(
    written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = oracle.truth(written, "s")
    with SessionStore(written) as s:
        assert s.compact("s", force=True).compacted
    log = log_path(written, "s")
    size = log.stat().st_size
    kept = json.loads(_mark_file(written).read_bytes().split(b"\n")[1])
    assert kept["size"] == size  # the new log, the one line the compaction encoded
    spy = _Spy(monkeypatch)
    with SessionStore(written) as s:
        assert (s.load_bootstrap_state("s"), s.load_transcript_messages("s")) == truth
    assert spy.trusted == size and spy.checked == 0  # the first cold load checks no hash
    data = log.read_bytes()
    at = data.index(b"u" * 300) + 100
    log.write_bytes(data[:at] + b"v" + data[at + 1 :])  # same length, still JSON
    with SessionStore(written) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")


# -- attacks on the load paths the checked prefix serves ----------------------------------
#
# Its side thread, pieces as views, compaction's vouching, snapshot headers, flipped bits
# in a compacted log. The rule under attack (README, Guarantees, "What a load checks"): a
# load never returns a state built from a byte that failed its hash check.


SID = "s"


def _text(i: int) -> str:
    return f"m{i} " + "w" * (i * 37 % 700)


def _fill_checked(root: Path, n: int = 300, sid: str = SID) -> list[str]:
    with SessionStore(root) as s:
        for i in range(n):
            s.append_transcript_messages(sid, [Message(Role.USER, _text(i))])
    check_whole(root, sid)  # a reader's checked prefix (> 64 KiB), saved on its close
    return [_text(i) for i in range(n)]


def _edit(log: Path, needle: bytes, start: int = 0) -> None:
    """Change one byte inside `needle` in place (same file, same length, still JSON)."""
    data = log.read_bytes()
    at = data.index(needle, start) + len(needle) - 1
    log.write_bytes(data[:at] + (b"v" if data[at : at + 1] != b"v" else b"x") + data[at + 1 :])


class _Interrupted(BaseException):
    """What a KeyboardInterrupt (or a timeout raised by a signal handler) is: no Exception."""


def test_an_interrupt_mid_load_keeps_nothing_folded_from_unproven_bytes(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold load folds the checked prefix's first pieces before their digest is
    proven (at the piece where the prefix ends). Interrupted in between, the store must
    not keep that fold: the next load would build on bytes nobody checked."""
    _fill_checked(root)
    _edit(log_path(root, SID), b"m3 ")  # in the first piece, inside the vouched bytes
    tune(monkeypatch, read_piece=4096)
    s = SessionStore(root)
    real = s.engine.read_some
    calls = [0]

    def read_some(*a: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:  # the first piece is folded, the prefix not yet proven
            raise _Interrupted
        return real(*a, **kw)

    monkeypatch.setattr(s.engine, "read_some", read_some)
    with pytest.raises(_Interrupted):
        s.load_transcript_messages(SID)
    monkeypatch.setattr(s.engine, "read_some", real)
    try:
        with pytest.raises(CorruptLogError):
            s.load_transcript_messages(SID)
    finally:
        s.close()


def test_a_writer_never_vouches_for_a_log_another_process_compacted(root: Path) -> None:
    """Another process compacts: the new log's snapshot ends at the same chain point
    (seq, link) as the writer's stale head, so the writer's next append lands after the
    snapshot. Its prefix must not grow by that batch (it did, and was saved on close
    over the compactor's own, a digest of bytes that are not the log's)."""
    writer = SessionStore(root)
    for i in range(300):
        writer.append_transcript_messages(SID, [Message(Role.USER, _text(i))])
    with SessionStore(root) as other:
        assert other.compact(SID, force=True).compacted
    writer.append_transcript_messages(SID, [Message(Role.USER, "after")])
    p = writer.cache_info(SID).prefix
    log = log_path(root, SID)
    assert p is None or p.size == log.stat().st_size
    writer.close()
    kept = json.loads(cache_path(root, SID, checked_prefix.NAME).read_bytes().split(b"\n")[1])
    assert kept["sha256"] == hashlib.sha256(log.read_bytes()[: kept["size"]]).hexdigest()
    with SessionStore(root) as s:
        got = s.load_transcript_messages(SID)
    assert [m.content for m in got] == [*(_text(i) for i in range(300)), "after"]


@pytest.mark.parametrize("failure", [RuntimeError, _Interrupted])
def test_a_hash_failing_on_the_side_thread_never_hangs_nor_serves_unchecked_bytes(
    root: Path, monkeypatch: pytest.MonkeyPatch, failure: type[BaseException]
) -> None:
    from eventstore.core import checked_prefix

    expected = _fill_checked(root)
    _edit(log_path(root, SID), b"m5 ")  # inside the vouched bytes
    tune(monkeypatch, read_piece=4096)
    tune(monkeypatch, hash_aside=0)
    main = threading.get_ident()
    real = checked_prefix.Prefix.extend

    def extend(self: Any, data: Any, head: Any) -> None:
        if threading.get_ident() != main:
            raise failure("the hash failed on the side thread")
        real(self, data, head)

    monkeypatch.setattr(checked_prefix.Prefix, "extend", extend)
    before = set(threading.enumerate())
    with SessionStore(root) as s:
        if failure is RuntimeError:  # folded again, checking every line: the edit is found
            with pytest.raises(CorruptLogError):
                s.load_transcript_messages(SID)
        else:  # raised to the caller; the next load starts over and finds the edit
            with pytest.raises(_Interrupted):
                s.load_transcript_messages(SID)
            monkeypatch.setattr(checked_prefix.Prefix, "extend", real)
            with pytest.raises(CorruptLogError):
                s.load_transcript_messages(SID)
    assert set(threading.enumerate()) == before  # no helper left behind
    assert len(expected) == 300


@pytest.mark.parametrize("cut", ["below, mid-line", "below, at a line", "at", "above, mid-line"])
def test_a_log_cut_anywhere_around_its_mark_loads_like_a_checked_fold(root: Path, cut: str) -> None:
    _fill_checked(root)
    log = log_path(root, SID)
    mark = json.loads(cache_path(root, SID, checked_prefix.NAME).read_bytes().split(b"\n")[1])
    with SessionStore(root) as s:
        s.core.caches.marks = False  # appended behind the mark: not vouched for
        s.append_transcript_messages(SID, [Message(Role.USER, "after the mark " * 20)])
    data = log.read_bytes()
    size = mark["size"]
    at = {
        "below, mid-line": size - 40,
        "below, at a line": data.rindex(b"\n", 0, size - 1) + 1,
        "at": size,
        "above, mid-line": size + 60,
    }[cut]
    with open(log, "r+b") as fh:  # in place: the same file, so the mark's head may match
        fh.truncate(at)
    got = oracle.or_corrupt(oracle.cold_load, root, SID)
    assert got == oracle.or_corrupt(oracle.truth, root, SID) and got is not CorruptLogError
    assert len(got.transcript) == (300 if at >= size else 299)


def test_a_mark_kept_in_memory_for_a_log_replaced_with_other_bytes_of_its_size(
    root: Path,
) -> None:
    """A store keeps its session's checked prefix in memory; another writer replaces the
    log, in place, by another log of the very same size (another session's bytes). The
    next fold from the start (a projection not folded yet) uses the in-memory mark."""
    _fill_checked(root, n=150, sid="a")
    _fill_checked(root, n=150, sid="b")
    a, b = log_path(root, "a"), log_path(root, "b")
    assert a.stat().st_size == b.stat().st_size  # same texts, same envelopes
    with SessionStore(root) as s:
        s.load_transcript_messages("a")
        assert s.cache_info("a").prefix is not None
        other = b.read_bytes()
        with open(a, "r+b") as fh:
            fh.write(other)
        got = s.load_bootstrap_state("a")  # a fold from the start, under the old mark
        assert got == SessionStore(root).load_bootstrap_state("b")


def test_a_compaction_vouching_late_after_others_appended_and_compacted(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between installing its snapshot and saving the prefix that vouches for it, the
    compactor is overtaken: another process appends, compacts again and appends. The
    vouch saved late must not be used for the log that is live by then."""
    from eventstore.core import checked_prefix

    expected = _fill_checked(root, n=200)
    real = checked_prefix.store
    done = [False]

    def late_store(engine: Any, sid: str, prefix: Any, mac: Any = None) -> None:
        if not done[0]:
            done[0] = True
            with SessionStore(root) as other:
                other.append_transcript_messages(SID, [Message(Role.USER, "x1")])
                assert other.compact(SID, force=True).compacted
                other.append_transcript_messages(SID, [Message(Role.USER, "x2")])
        real(engine, sid, prefix, mac)

    monkeypatch.setattr(checked_prefix, "store", late_store)
    with SessionStore(root) as s:
        assert s.compact(SID, force=True).compacted
    monkeypatch.setattr(checked_prefix, "store", real)
    got = oracle.or_corrupt(oracle.cold_load, root, SID)
    assert got == oracle.or_corrupt(oracle.truth, root, SID)
    assert [m.content for m in got.transcript] == [*expected, "x1", "x2"]


@pytest.mark.parametrize(
    "lie",
    ["length to the next line's end", "length past the file", "layout outside the line",
     "layout on another state", "next line glued on", "a state's byte"],
)  # fmt: skip
@pytest.mark.parametrize("piece", [None, 2048])
def test_a_snapshot_whose_header_lies_is_never_served(
    root: Path, monkeypatch: pytest.MonkeyPatch, lie: str, piece: int | None
) -> None:
    """The file engine takes an opening snapshot's end and envelope from its header
    (one pread). A header edited to lie about the line (its hash then fails) must make
    loads raise, whatever the piece size, never serve a state or a wrong head."""
    if piece is not None:
        tune(monkeypatch, read_piece=piece)
        tune(monkeypatch, hash_aside=0)
    _fill_checked(root, n=60)
    with SessionStore(root) as s:
        assert s.compact(SID, force=True).compacted
        s.append_transcript_messages(SID, [Message(Role.USER, "after")])
        s.append_transcript_messages(SID, [Message(Role.USER, "after 2")])
    log = log_path(root, SID)
    snap, rest = log.read_bytes().split(b"\n", 1)
    head = json.loads(snap[: snap.index(b',"states":{')] + b"}")
    if lie == "length to the next line's end":
        new = rest.index(b"\n") + 1 + head["length"]
        snap = snap.replace(b'"length":%d' % head["length"], b'"length":%d' % new, 1)
    elif lie == "length past the file":
        snap = snap.replace(b'"length":%d' % head["length"], b'"length":%d' % (10**9), 1)
    elif lie == "layout outside the line":
        a, b = head["layout"]["transcript"]
        snap = snap.replace(
            b'"transcript":[%d,%d]' % (a, b), b'"transcript":[%d,%d]' % (a, b + 10**6), 1
        )
    elif lie == "layout on another state":
        t, bs = head["layout"]["transcript"], head["layout"]["bootstrap"]
        snap = snap.replace(
            b'"transcript":[%d,%d]' % tuple(t), b'"transcript":[%d,%d]' % tuple(bs), 1
        )
    elif lie == "next line glued on":
        rest = b" " + rest  # the newline after the snapshot is gone: two lines in one
    else:
        snap = snap.replace(b"m41 ", b"m14 ", 1)
    log.write_bytes(snap + (b"" if lie == "next line glued on" else b"\n") + rest)
    assert oracle.or_corrupt(oracle.cold_load, root, SID) is CorruptLogError
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID, start=0)
    with SessionStore(root) as s:
        assert not s.verify(SID).ok


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    at=st.floats(min_value=0, max_value=1, exclude_max=True),
    bit=st.integers(min_value=0, max_value=7),
    piece=st.sampled_from([1024, 4096, 1 << 20]),
)
def test_a_flipped_bit_in_a_compacted_log_is_caught_or_harmless(
    tmp_path_factory: pytest.TempPathFactory, at: float, bit: int, piece: int
) -> None:
    """Cold loads of a compacted log (its snapshot vouched for by the compaction, lines
    appended after it) in pieces of any size, hashed on the side thread, and a cold
    page: any flipped bit is an error or changes nothing they return."""
    root = _compacted_root(tmp_path_factory)
    log = log_path(root, SID)
    data = log.read_bytes()
    i = int(at * len(data))
    log.write_bytes(data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1 :])
    old = tuning.DEFAULT_TUNING
    tuning.DEFAULT_TUNING = Tuning(read_piece=piece, hash_aside=0)
    try:
        got = oracle.or_corrupt(oracle.cold_load, root, SID)
    finally:
        tuning.DEFAULT_TUNING = old
        log.write_bytes(data)
    assert got is CorruptLogError or got == _COMPACTED_TRUTH[0], f"a flip at byte {i}"


_COMPACTED_TRUTH: list[Any] = []


def _compacted_root(factory: pytest.TempPathFactory) -> Path:
    if not _COMPACTED_TRUTH:
        root = factory.mktemp("compacted") / "store"
        _fill_checked(root, n=80)
        with SessionStore(root) as s:
            s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
            assert s.compact(SID, force=True).compacted
            for i in range(5):
                s.append_transcript_messages(SID, [Message(Role.USER, _text(i))])
        _COMPACTED_TRUTH.extend([oracle.or_corrupt(oracle.truth, root, SID), root])
    return _COMPACTED_TRUTH[1]  # type: ignore[no-any-return]
