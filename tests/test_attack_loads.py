"""Attacks from outside on the newest load paths (the checked prefix and its side
thread, pieces as views, the snapshot header, compaction's vouching, snapshot states
decoded in place, messages handed to the caller), each pinned as a test.

The rule under attack (README, Guarantees, "What a load checks"): a load never returns
a state built from a byte that failed its hash check, and what a load returns is the
caller's own.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import check_whole, log_path, make_entry, make_features, make_manifest
from engines import EngineCase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuning import tune

from eventstore import SessionStore
from eventstore.core import tuning
from eventstore.core.tuning import Tuning
from eventstore.errors import CorruptLogError
from eventstore.format.events import (
    FeatureListReplaced,
    ManifestSet,
    MessagesAppended,
)
from eventstore.records import (
    BootstrapState,
    Message,
    Role,
    ToolUseBlock,
)

# these tests attack how a load reads and checks the log: no transcript fold cache
# stands in for it (see conftest.no_transcript_cache)
pytestmark = pytest.mark.usefixtures("no_transcript_cache")


SID = "s"


def _text(i: int) -> str:
    return f"m{i} " + "w" * (i * 37 % 700)


def _fill(root: Path, n: int = 300, sid: str = SID) -> list[str]:
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
    _fill(root)
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


# -- cold `last=N` pages (eventstore/transcript_pages.py, last_messages) ----------------


def _messages_log(url: str, n: int = 12, compact_at: int | None = None) -> list[Message]:
    with SessionStore(url) as s:
        for i in range(n):
            if i == compact_at:
                assert s.compact(SID, force=True).compacted
            s.append_transcript_messages(SID, [Message(Role.USER, f"turn {i:03d}")])
            if i % 4 == 0:
                s.append_progress_entry(SID, make_entry(i))
        return s.load_transcript_messages(SID)


@pytest.mark.parametrize("compact_at", [None, 3], ids=["live log", "after a snapshot"])
@pytest.mark.parametrize("edit", ["content", "seq", "drop a line", "swap two lines"])
def test_a_cold_last_page_never_returns_a_line_that_fails_its_hash(
    case: EngineCase, url: str, compact_at: int | None, edit: str
) -> None:
    """`load_transcript_messages(sid, last=N)` on a cold store reads the log from its
    end: each messages line it returns must have passed its hash check, like a fold's
    (it returned an edited message before)."""
    _messages_log(url, compact_at=compact_at)

    def damage(data: bytes) -> bytes:
        lines = data.split(b"\n")
        last = max(i for i, ln in enumerate(lines) if b'"turn 011"' in ln)
        if edit == "content":
            lines[last] = lines[last].replace(b"turn 011", b"turn 911")
        elif edit == "seq":
            seq = json.loads(lines[last])["seq"]
            lines[last] = lines[last].replace(b'"seq":%d' % seq, b'"seq":%d' % (seq + 7))
        elif edit == "drop a line":
            del lines[last - 1]  # the line before: the chain breaks at the one returned
        else:
            lines[last - 1], lines[last - 2] = lines[last - 2], lines[last - 1]
        return b"\n".join(lines)

    with SessionStore(url) as s:
        case.rewrite(s, SID, damage)
    for n in (1, 3):
        with SessionStore(url) as s, pytest.raises(CorruptLogError):
            s.load_transcript_messages(SID, last=n)


@pytest.mark.parametrize("compact_at", [None, 1, 5])
def test_a_cold_last_page_of_an_intact_log_equals_the_fold(
    case: EngineCase, url: str, compact_at: int | None
) -> None:
    full = _messages_log(url, n=15, compact_at=compact_at)
    for n in (1, 2, 5, 10, 15, 40):
        with SessionStore(url) as s:
            assert s.load_transcript_messages(SID, last=n) == full[-n:]


def test_a_cold_last_page_never_returns_an_edited_snapshot_message(root: Path) -> None:
    with SessionStore(root) as s:
        for i in range(12):
            s.append_transcript_messages(SID, [Message(Role.USER, f"turn {i:03d}")])
        assert s.compact(SID, force=True).compacted
    log = log_path(root, SID)
    log.write_bytes(log.read_bytes().replace(b"turn 011", b"turn 911"))  # same length, JSON
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID)  # a fold sees the edit
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID, last=2)  # returned "turn 911"


# -- the checked prefix a writer keeps (eventstore/store.py, _extend_prefix) ------------


def test_a_writer_never_vouches_for_a_log_another_process_compacted(root: Path) -> None:
    """Another process compacts: the new log's snapshot ends at the same chain point
    (seq, link) as the writer's stale head, so the writer's next append lands after the
    snapshot. Its prefix must not grow by that batch (it did, and was saved on close
    over the compactor's own, a digest of bytes that are not the log's)."""
    from eventstore.core import checked_prefix
    from eventstore.engines.file.caches import cache_file_name

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
    kept = json.loads(
        (log.parent / cache_file_name(checked_prefix.NAME)).read_bytes().split(b"\n")[1]
    )
    assert kept["sha256"] == hashlib.sha256(log.read_bytes()[: kept["size"]]).hexdigest()
    with SessionStore(root) as s:
        got = s.load_transcript_messages(SID)
    assert [m.content for m in got] == [*(_text(i) for i in range(300)), "after"]


# -- attacks that found no bug: kept as coverage ---------------------------------------


def _truth(root: Path) -> Any:
    """What a load checking every line returns (no checked prefix), or the error type."""
    try:
        with SessionStore(root) as s:
            s.core.caches.marks = False
            return s.load_transcript_messages(SID), s.load_bootstrap_state(SID)
    except CorruptLogError:
        return CorruptLogError


def _load(root: Path) -> Any:
    try:
        with SessionStore(root) as s:
            return s.load_transcript_messages(SID), s.load_bootstrap_state(SID)
    except CorruptLogError:
        return CorruptLogError


@pytest.mark.parametrize("failure", [RuntimeError, _Interrupted])
def test_a_hash_failing_on_the_side_thread_never_hangs_nor_serves_unchecked_bytes(
    root: Path, monkeypatch: pytest.MonkeyPatch, failure: type[BaseException]
) -> None:
    from eventstore.core import checked_prefix

    expected = _fill(root)
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
    from eventstore.core import checked_prefix
    from eventstore.engines.file.caches import cache_file_name

    _fill(root)
    log = log_path(root, SID)
    mark = json.loads(
        (log.parent / cache_file_name(checked_prefix.NAME)).read_bytes().split(b"\n")[1]
    )
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
    got = _load(root)
    assert got == _truth(root) and got is not CorruptLogError
    assert len(got[0]) == (300 if at >= size else 299)


def test_a_mark_kept_in_memory_for_a_log_replaced_with_other_bytes_of_its_size(
    root: Path,
) -> None:
    """A store keeps its session's checked prefix in memory; another writer replaces the
    log, in place, by another log of the very same size (another session's bytes). The
    next fold from the start (a projection not folded yet) uses the in-memory mark."""
    _fill(root, n=150, sid="a")
    _fill(root, n=150, sid="b")
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

    expected = _fill(root, n=200)
    real = checked_prefix.store
    done = [False]

    def late_store(engine: Any, sid: str, prefix: Any) -> None:
        if not done[0]:
            done[0] = True
            with SessionStore(root) as other:
                other.append_transcript_messages(SID, [Message(Role.USER, "x1")])
                assert other.compact(SID, force=True).compacted
                other.append_transcript_messages(SID, [Message(Role.USER, "x2")])
        real(engine, sid, prefix)

    monkeypatch.setattr(checked_prefix, "store", late_store)
    with SessionStore(root) as s:
        assert s.compact(SID, force=True).compacted
    monkeypatch.setattr(checked_prefix, "store", real)
    got = _load(root)
    assert got == _truth(root)
    assert [m.content for m in got[0]] == [*expected, "x1", "x2"]


def _rehash(line: bytes, link: str) -> bytes:
    """`line` with its `h` made to check again (a forger's edit, or a bad tool's)."""
    from eventstore.format.chain import (
        line_hash,
        split_hash,
    )

    sh = split_hash(line)
    assert sh is not None
    return line[:-18] + line_hash(link, sh[0]).encode() + b'"}'


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
    _fill(root, n=60)
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
    assert _load(root) is CorruptLogError
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages(SID, start=0)
    with SessionStore(root) as s:
        assert not s.verify(SID).ok


def _rich(i: int) -> list[Message]:
    return [
        Message(Role.USER, f"plain {i}"),
        Message(
            Role.ASSISTANT,
            f"rich {i}",
            blocks=[ToolUseBlock(id=f"t{i}", name="Bash", input={"argv": ["ls", str(i)]})],
            metadata={"trace": {"depth": [i]}},
        ),
    ]


def _vandalize(value: Any) -> None:
    """Change everything a caller can change in what a load returned."""
    if isinstance(value, list):
        for item in value:
            _vandalize(item)
        value.append(Message(Role.SYSTEM, "planted"))
    elif isinstance(value, dict):
        for item in list(value.values()):
            _vandalize(item)
        value["planted"] = ["x"]
    elif isinstance(value, Message):
        _vandalize(value.blocks)
        _vandalize(value.metadata)
        for b in value.blocks:
            if isinstance(b, ToolUseBlock):
                _vandalize(b.input)
    elif isinstance(value, BootstrapState):
        if value.manifest is not None:
            _vandalize(value.manifest.metadata)
            if value.manifest.init_plan is not None:
                value.manifest.init_plan.steps.clear()
        for f in value.feature_list:
            f.steps.append("planted")
            f.passes = not f.passes
        value.feature_list.reverse()
        value.recent_progress.clear()
        value.checkpoints.clear()
    elif isinstance(value, MessagesAppended):
        _vandalize(value.messages)
    elif isinstance(value, (ManifestSet, FeatureListReplaced)):
        _vandalize(value.manifest.metadata if isinstance(value, ManifestSet) else value.features)


@pytest.mark.parametrize("compacted", [False, True])
def test_nothing_any_load_returns_changes_the_store_when_changed(url: str, compacted: bool) -> None:
    with SessionStore(url) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(3))
        for i in range(6):
            s.append_transcript_messages(SID, _rich(i))
            s.append_progress_entry(SID, make_entry(i))
        if compacted:
            assert s.compact(SID, force=True).compacted
            s.append_transcript_messages(SID, _rich(6))
        truth = (
            s.load_transcript_messages(SID),
            s.load_bootstrap_state(SID),
            list(s.read_events(SID)),
            s.load(SID, "idempotency"),
        )
    for warm in (False, True):
        with SessionStore(url) as s:
            if warm:
                s.load_transcript_messages(SID)
                s.load_bootstrap_state(SID)
            last = s.last_seq(SID)
            for got in (
                s.load_transcript_messages(SID, last=3),
                s.load_transcript_messages(SID, last=100),
                s.load_transcript_messages(SID, start=1, limit=2),
                s.load_transcript_messages(SID, start=5),
                s.load_transcript_messages(SID),
                s.load(SID, "transcript"),
                s.load(SID, "bootstrap"),
                s.load(SID, "idempotency"),
                s.load_bootstrap_state(SID),
                s.transcript_at(SID, seq=last),
                s.state_at(SID, seq=last),
                list(s.read_events(SID)),
            ):
                _vandalize(got)
            assert s.load_transcript_messages(SID) == truth[0]
            assert s.load_transcript_messages(SID, last=4) == truth[0][-4:]
            assert s.load_bootstrap_state(SID) == truth[1]
            assert list(s.read_events(SID)) == truth[2]
            assert s.load(SID, "idempotency") == truth[3]
            assert s.transcript_at(SID, seq=last) == truth[0]
        with SessionStore(url) as s:  # and nothing of it reached a cache
            assert s.load_transcript_messages(SID) == truth[0]
            assert s.load_bootstrap_state(SID) == truth[1]


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
        got = _load(root)
    finally:
        tuning.DEFAULT_TUNING = old
        log.write_bytes(data)
    assert got is CorruptLogError or got == _COMPACTED_TRUTH[0], f"a flip at byte {i}"


_COMPACTED_TRUTH: list[Any] = []


def _compacted_root(factory: pytest.TempPathFactory) -> Path:
    if not _COMPACTED_TRUTH:
        root = factory.mktemp("compacted") / "store"
        _fill(root, n=80)
        with SessionStore(root) as s:
            s.initialize_session_if_missing(SID, make_manifest(SID), make_features(2))
            assert s.compact(SID, force=True).compacted
            for i in range(5):
                s.append_transcript_messages(SID, [Message(Role.USER, _text(i))])
        _COMPACTED_TRUTH.extend([_truth(root), root])
    return _COMPACTED_TRUTH[1]  # type: ignore[no-any-return]
