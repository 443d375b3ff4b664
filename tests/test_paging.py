"""Transcript paging: the newest N messages read from the end of a log (live lines, then
a compaction snapshot's transcript), equal to the last N of the full fold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    log_path,
    make_entry,
    write_compacted,
)
from engines import EngineCase, WholeLogsOnly
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import texts
from test_messages import rich_messages

from eventstore import (
    Message,
    ProgressEntry,
    Role,
    SessionStore,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from eventstore.engines.file.layout import SessionPaths
from eventstore.engines.memory import MemoryEngine
from eventstore.errors import CorruptLogError
from eventstore.format.codec import EventCodec
from eventstore.ops.compaction import Retention
from eventstore.ops.paging import last_messages


def _page(
    path: Path,
    n: int,
    size: int | None = None,
    checked: dict[bytes, dict[int, bytes]] | None = None,
) -> list[Message] | None:
    data = path.read_bytes()
    reads: list[tuple[int, int]] = []

    def read_span(start: int, end: int) -> bytes:
        assert 0 <= start <= end <= len(data)
        reads.append((start, end))
        return data[start:end]

    out = last_messages(
        read_span, len(data) if size is None else size, n, EventCodec(), path, checked
    )
    _page.reads = reads  # type: ignore[attr-defined]
    return out


def _log(store: SessionStore, sid: str) -> Path:
    return SessionPaths(store.root, sid).log


def _turn(i: int, pad: int = 0) -> list[Message]:
    """One turn with a tool call and its result, like a coding harness writes."""
    return [
        Message(Role.USER, f"turn {i}: fix test {i}" + "x" * pad),
        Message(
            Role.ASSISTANT,
            f"running test {i}",
            blocks=[
                TextBlock(text=f"running test {i}"),
                ToolUseBlock(id=f"t{i}", name="Bash", input={"command": f"pytest -k {i}"}),
            ],
            # a nested object with a `role` key: a false message boundary in a snapshot
            metadata={"trace": [{"a": 1}, {"role": "x", "content": "y"}]},
        ),
        Message(
            Role.TOOL,
            "",
            name="Bash",
            blocks=[ToolResultBlock(tool_use_id=f"t{i}", content=f"{i} passed")],
        ),
    ]


@pytest.mark.parametrize("compact_at", [None, 0, 5, 30])
def test_the_last_n_equal_the_fold_live_and_compacted(
    store: SessionStore, compact_at: int | None
) -> None:
    for i in range(40):
        if compact_at is not None and i == compact_at:
            store.compact("s", force=True)
        store.append_transcript_messages("s", _turn(i))
        if i % 3 == 0:
            store.append_progress_entry("s", ProgressEntry(run_id="r", summary=f"p{i}"))
    full = store.load_transcript_messages("s")
    assert len(full) == 120
    for n in (0, 1, 2, 3, 4, 20, 119, 120, 121, 500):
        assert _page(_log(store, "s"), n) == (full[max(0, len(full) - n) :] if n else [])


def test_a_compacted_log_is_paged_from_the_snapshot_without_reading_it_all(
    store: SessionStore,
) -> None:
    for i in range(2000):
        store.append_transcript_messages("s", _turn(i, pad=200))
    store.compact("s", force=True)
    store.append_transcript_messages("s", _turn(2000))
    log = _log(store, "s")
    full = store.load_transcript_messages("s")
    checked: dict[bytes, dict[int, bytes]] = {}
    assert _page(log, 20, checked=checked) == full[-20:]
    size = log.stat().st_size
    # the first page reads the snapshot line once, to check its hash...
    assert sum(b - a for a, b in _page.reads) >= size - 200_000  # type: ignore[attr-defined]
    assert len(checked) == 1
    # ...and remembers it: a later page reads the bytes of ~20 messages and headers
    assert _page(log, 20, checked=checked) == full[-20:]
    read = sum(b - a for a, b in _page.reads)  # type: ignore[attr-defined]
    assert size > 1_000_000 and read < 200_000


def test_a_long_live_log_is_read_only_at_its_end(store: SessionStore) -> None:
    for i in range(2000):
        store.append_transcript_messages("s", _turn(i, pad=200))
    log = _log(store, "s")
    assert _page(log, 20) == store.load_transcript_messages("s")[-20:]
    read = sum(b - a for a, b in _page.reads)  # type: ignore[attr-defined]
    assert read <= 2 * 64 * 1024


def test_messages_longer_than_a_read_chunk(store: SessionStore) -> None:
    big = [Message(Role.USER, "y" * 300_000), Message(Role.ASSISTANT, "z" * 200_000)]
    store.append_transcript_messages("s", big)
    store.append_transcript_messages("s", [Message(Role.USER, "after")])
    assert _page(_log(store, "s"), 3) == [*big, Message(Role.USER, "after")]
    store.compact("s", force=True)
    store.append_transcript_messages("s", [Message(Role.USER, "later")])
    assert _page(_log(store, "s"), 4) == [
        *big,
        Message(Role.USER, "after"),
        Message(Role.USER, "later"),
    ]


def test_a_torn_tail_past_the_committed_size_is_never_read(store: SessionStore) -> None:
    store.append_transcript_messages("s", [Message(Role.USER, "a")])
    log = _log(store, "s")
    committed = log.stat().st_size
    with log.open("ab") as f:
        f.write(b'{"type":"messages_appended","seq":2,"ts":"2026-01-01T00:00:00Z","messages":[{"ro')
    assert _page(log, 5, size=committed) == [Message(Role.USER, "a")]


def test_retention_trimmed_snapshots_page_what_they_keep(store: SessionStore) -> None:
    for i in range(30):
        store.append_transcript_messages("s", _turn(i))
    store.compact("s", retention=Retention(messages=10), force=True)
    store.append_transcript_messages("s", _turn(30))
    full = store.load_transcript_messages("s")
    assert len(full) == 13
    assert _page(_log(store, "s"), 50) == full
    assert _page(_log(store, "s"), 11) == full[-11:]


def test_a_corrupt_messages_line_in_the_page_is_an_error_naming_the_file(
    store: SessionStore,
) -> None:
    store.append_transcript_messages("s", [Message(Role.USER, "a")])
    store.append_transcript_messages("s", [Message(Role.USER, "b")])
    log = _log(store, "s")
    data = log.read_bytes()
    log.write_bytes(data.replace(b'"content":"b"', b'"content":7  '))
    with pytest.raises(CorruptLogError) as info:
        _page(log, 1)
    assert str(log) in str(info.value)


@pytest.mark.slow
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.lists(rich_messages, min_size=1, max_size=4).map(lambda b: ("messages", b)),
            texts.map(lambda t: ("progress", t)),
            st.sampled_from([("compact", None), ("compact", 2)]),
        ),
        max_size=12,
    ),
    st.integers(min_value=0, max_value=30),
)
def test_any_history_pages_like_the_fold(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, object]], n: int
) -> None:
    with SessionStore(tmp_path_factory.mktemp("page")) as s:
        s.append_progress_entry("s", ProgressEntry(run_id="r", summary="start"))
        for op, arg in ops:
            if op == "messages":
                s.append_transcript_messages("s", arg)  # type: ignore[arg-type]
            elif op == "progress":
                s.append_progress_entry("s", ProgressEntry(run_id="r", summary=str(arg)))
            else:
                s.compact(
                    "s", retention=None if arg is None else Retention(messages=arg), force=True
                )  # type: ignore[arg-type]
        full = s.load_transcript_messages("s")
        assert _page(_log(s, "s"), n) == (full[max(0, len(full) - n) :] if n else [])


# -- through the session API -------------------------------------------------------------


def _fill(store: SessionStore, turns: int, sid: str = "s") -> list[Message]:
    for i in range(turns):
        store.append_transcript_messages(sid, _turn(i))
    return [m for i in range(turns) for m in _turn(i)]


def test_pages_through_the_api_warm_and_cold(root: Path) -> None:
    with SessionStore(root) as s:
        full = _fill(s, 50)
    with SessionStore(root) as cold:
        assert cold.load_transcript_messages("s", last=7) == full[-7:]
        assert "transcript" not in cold.cache_info("s").folds  # nothing was folded
        assert cold.load_transcript_messages("s", start=140) == full[140:]
        assert "transcript" in cold.cache_info("s").folds  # start folds once
        assert cold.load_transcript_messages("s", last=7) == full[-7:]  # now warm
        assert cold.load_transcript_messages("s", start=3, limit=4) == full[3:7]
        assert cold.load_transcript_messages("s", limit=2) == full[:2]
        assert cold.load_transcript_messages("s", last=0) == []
        assert cold.load_transcript_messages("s", last=10_000) == full
        assert cold.load_transcript_messages("s", start=10_000) == []
        assert cold.load_transcript_messages("nobody", last=3) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"last": -1}, {"start": -2}, {"limit": 1.5}, {"last": True}, {"last": 2, "start": 1}],
)
def test_bad_page_arguments_are_refused(store: SessionStore, kwargs: dict[str, object]) -> None:
    from eventstore import InvalidRecordError

    with pytest.raises(InvalidRecordError):
        store.load_transcript_messages("s", **kwargs)  # type: ignore[arg-type]


def test_a_page_is_the_callers_own(root: Path) -> None:
    with SessionStore(root) as s:
        full = _fill(s, 3)
    for warm in (False, True):
        with SessionStore(root) as s:
            if warm:
                s.load_transcript_messages("s")
            page = s.load_transcript_messages("s", last=2)
            page[0].metadata["trace"].append("changed")
            page[0].blocks.clear()
            assert s.load_transcript_messages("s", last=2) == full[-2:]
            assert s.load_transcript_messages("s") == full


def test_cold_pages_after_another_process_compacts_and_appends(root: Path) -> None:
    with SessionStore(root) as writer, SessionStore(root) as reader:
        full = _fill(writer, 20)
        assert reader.load_transcript_messages("s", last=5) == full[-5:]
        writer.compact("s", force=True)
        assert reader.load_transcript_messages("s", last=5) == full[-5:]
        writer.append_transcript_messages("s", _turn(20))
        full += _turn(20)
        assert reader.load_transcript_messages("s", last=5) == full[-5:]
        reader.load_transcript_messages("s")  # warm now: a compaction swaps the file under it
        writer.compact("s", force=True)
        writer.append_transcript_messages("s", _turn(21))
        full += _turn(21)
        assert reader.load_transcript_messages("s", last=5) == full[-5:]


def test_pages_beside_a_live_writer_are_whole_batches_in_order(root: Path) -> None:
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with SessionStore(root) as w:
                i = 0
                while not stop.is_set() and i < 400:
                    w.append_transcript_messages("s", _turn(i))
                    if i % 97 == 96:
                        w.compact("s", force=True)
                    i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=write)
    t.start()
    seen = 0
    try:
        while t.is_alive():
            with SessionStore(root) as r:  # cold every time
                page = r.load_transcript_messages("s", last=6)
            if page:
                # whole turns, in order: the page ends with the last committed batch
                last_call = page[-1].tool_results[0].tool_use_id
                i = int(last_call[1:])
                expected = [m for j in range(max(0, i - 1), i + 1) for m in _turn(j)]
                assert page == expected[-6:]
                assert i >= seen
                seen = i
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_pages_on_the_memory_engine_and_from_an_engine_without_a_ranged_view() -> None:
    inner = MemoryEngine()
    with SessionStore(inner) as s:
        full = _fill(s, 10)
        s.compact("s", force=True)
        s.append_transcript_messages("s", _turn(10))
        full += _turn(10)
        assert s.load_transcript_messages("s", last=5) == full[-5:]  # cold, from a copy
    with SessionStore(WholeLogsOnly(inner)) as s:
        assert s.load_transcript_messages("s", last=5) == full[-5:]  # folded instead
        assert "transcript" in s.cache_info("s").folds


# -- attacks: cold last pages of damaged logs ---------------------------------------------


SID = "s"


def _messages_log(url: str, n: int = 12, compact_at: int | None = None) -> list[Message]:
    with SessionStore(url) as s:
        for i in range(n):
            if i == compact_at:
                assert s.compact(SID, force=True).compacted
            s.append_transcript_messages(SID, [Message(Role.USER, f"turn {i:03d}")])
            if i % 4 == 0:
                s.append_progress_entry(SID, make_entry(i))
        return s.load_transcript_messages(SID)


@pytest.mark.usefixtures("no_transcript_cache")
@pytest.mark.parametrize("compact_at", [None, 3], ids=["live log", "after a snapshot"])
@pytest.mark.parametrize("edit", ["content", "seq", "drop a line", "swap two lines", "type"])
def test_a_cold_last_page_never_returns_a_line_that_fails_its_hash(
    case: EngineCase, url: str, compact_at: int | None, edit: str
) -> None:
    """`load_transcript_messages(sid, last=N)` on a cold store reads the log from its
    end: each messages line it returns must have passed its hash check, like a fold's
    (it returned an edited message before), and so must each line it passes ("type":
    the newest messages line's type edited, it was skipped unchecked and the page
    returned older messages as the newest, on every engine)."""
    _messages_log(url, compact_at=compact_at)

    def damage(data: bytes) -> bytes:
        lines = data.split(b"\n")
        last = max(i for i, ln in enumerate(lines) if b'"turn 011"' in ln)
        if edit == "content":
            lines[last] = lines[last].replace(b"turn 011", b"turn 911")
        elif edit == "seq":
            seq = json.loads(lines[last])["seq"]
            lines[last] = lines[last].replace(b'"seq":%d' % seq, b'"seq":%d' % (seq + 7))
        elif edit == "type":
            lines[last] = lines[last].replace(b'"messages_appended"', b'"messages_appende_"')
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


@pytest.mark.usefixtures("no_transcript_cache")
@pytest.mark.parametrize("compact_at", [None, 1, 5])
def test_a_cold_last_page_of_an_intact_log_equals_the_fold(
    case: EngineCase, url: str, compact_at: int | None
) -> None:
    full = _messages_log(url, n=15, compact_at=compact_at)
    for n in (1, 2, 5, 10, 15, 40):
        with SessionStore(url) as s:
            assert s.load_transcript_messages(SID, last=n) == full[-n:]


def test_a_cold_last_page_reads_only_the_logs_end_on_every_engine(
    case: EngineCase, url: str
) -> None:
    """`load_transcript_messages(sid, last=N)` on a cold store reads the log from its
    end on every engine (by bytes on files and memory, by seq on PostgreSQL and Redis),
    with or without the transcript's fold cache: a line edited far before the page
    never reaches it, while a load of the whole transcript reports it."""
    full = _messages_log(url, n=300)
    with SessionStore(url) as s:
        case.rewrite(s, SID, lambda b: b.replace(b'"turn 010"', b'"turn 910"'))
    with SessionStore(url) as s:
        assert s.load_transcript_messages(SID, last=20) == full[-20:]
        with pytest.raises(CorruptLogError):
            s.load_transcript_messages(SID)


@pytest.mark.usefixtures("no_transcript_cache")
def test_a_cold_last_page_in_a_compacted_logs_tail_reads_the_tail_alone(
    case: EngineCase, url: str
) -> None:
    """A compacted log whose live tail holds the page: a cold `last=N` reads that tail
    alone on every engine (by seq too: it stops before the line after the snapshot),
    so a message edited inside the snapshot never reaches it, while a load of the whole
    transcript, which reads the snapshot, reports the edit."""
    full = _messages_log(url, n=12, compact_at=8)
    with SessionStore(url) as s:
        case.rewrite(s, SID, lambda b: b.replace(b'"turn 002"', b'"turn 902"', 1))
    with SessionStore(url) as s:
        assert s.load_transcript_messages(SID, last=2) == full[-2:]
        with pytest.raises(CorruptLogError):
            s.load_transcript_messages(SID)


@pytest.mark.usefixtures("no_transcript_cache")
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


# -- attacks -------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_transcript_cache")  # the log read itself is attacked
def test_a_remembered_snapshot_check_never_vouches_for_bytes_changed_since(root: Path) -> None:
    """A store pages `last=N` from a compacted log (checking the snapshot line whole and
    remembering its `h`). The snapshot's transcript entry is then edited in place,
    its `h` left as it was (so the line fails its check). The next page on the same
    store must not return the edited message: it was never checked."""
    write_compacted(root, SID, 50, after=0)
    log = log_path(root, SID)
    with SessionStore(root) as s:
        assert s.load_transcript_messages(SID, last=2)[-1].content.startswith("msg0049")
        data = log.read_bytes()
        edited = data.replace(b"msg0049", b"EVIL049", 1)
        assert len(edited) == len(data)
        with open(log, "r+b") as fh:  # in place: the same file, the same size
            fh.write(edited)
        try:
            page = s.load_transcript_messages(SID, last=2)
        except CorruptLogError:
            page = None
        assert page is None or all("EVIL" not in m.content for m in page)
        with pytest.raises(CorruptLogError):  # what a fresh store says
            SessionStore(root).load_transcript_messages(SID, last=2)
        # a header edited to point the transcript elsewhere is no better
        log.write_bytes(data)
        assert s.load_transcript_messages(SID, last=1)[0].content.startswith("msg0049")
        head = json.loads(data[: data.index(b',"states":{')] + b"}")
        a, b = head["layout"]["transcript"]
        lying = data.replace(b"[%d,%d]" % (a, b), b"[%d,%d]" % (a, b - 1), 1)
        assert lying != data and len(lying) == len(data)
        with open(log, "r+b") as fh:
            fh.write(lying)
        try:
            page = s.load_transcript_messages(SID, last=3)
        except CorruptLogError:
            page = None
        assert page is None or [m.content[:7] for m in page] == ["msg0047", "msg0048", "msg0049"]


def test_a_remembered_snapshot_still_pages_cheaply_and_equal(root: Path) -> None:
    """The remembered check keeps working for an unchanged line (and for another
    compaction's line): every page equals the fold."""
    write_compacted(root, SID, 300)
    with SessionStore(root) as s:
        pages = [s.load_transcript_messages(SID, last=k) for k in (1, 5, 120, 302, 400)]
        assert sess_checked(s)
        with SessionStore(root) as other:
            other.append_transcript_messages(SID, [Message(Role.USER, "x")])
            assert other.compact(SID, force=True).compacted
        pages.append(s.load_transcript_messages(SID, last=7))
    with SessionStore(root) as cold:
        full = cold.load_transcript_messages(SID)
    assert [len(p) for p in pages] == [1, 5, 120, 302, 302, 7]
    assert pages[:5] == [full[:-1][-k:] for k in (1, 5, 120, 302, 400)]
    assert pages[5] == full[-7:]


def sess_checked(s: SessionStore) -> bool:
    return bool(s.cache_info(SID).checked_snapshots)
