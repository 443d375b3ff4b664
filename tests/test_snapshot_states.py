"""Reading a projection's state out of a snapshot (projections.base.restore_state):
msgspec decodes the entry and its state in one pass, in place; whatever is irregular
is reported as before, and a projection that decodes its own state gets bytes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import oracle
import pytest
from conftest import (
    log_path,
    make_entry,
    make_features,
    make_manifest,
    write_compacted,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import snapshots

from eventstore import (
    EventStoreError,
    SessionStore,
    Snapshot,
)
from eventstore.aio import AsyncSessionStore
from eventstore.engines.file.layout import SessionPaths
from eventstore.errors import (
    CorruptLogError,
    SnapshotVersionError,
)
from eventstore.format import reader as log_module
from eventstore.format.codec import EventCodec
from eventstore.format.events import Event, MessagesAppended
from eventstore.records import (
    BootstrapState,
    Message,
    Role,
)
from projections import (
    BootstrapProjection,
    StructProjection,
    TranscriptProjection,
    restore_state,
    snapshot_entry,
)

TS = datetime(2026, 1, 2, tzinfo=UTC)


def _snapshot(**states: bytes) -> Snapshot:
    return Snapshot(seq=7, base_h="0" * 16, states={k: msgspec.Raw(v) for k, v in states.items()})


def test_a_stored_state_reads_back_equal() -> None:
    state = BootstrapState(manifest=make_manifest("s"), feature_list=make_features(3))
    messages = [Message(Role.USER, "hi ✓"), Message(Role.ASSISTANT, "x" * 5000)]
    snap = _snapshot(
        bootstrap=bytes(snapshot_entry(BootstrapProjection(), state)),
        transcript=bytes(snapshot_entry(TranscriptProjection(), messages)),
    )
    assert restore_state(BootstrapProjection(), snap) == state
    assert restore_state(TranscriptProjection(), snap) == messages


@pytest.mark.parametrize(
    "entry, error, words",
    [
        (b'{"version":1,"state":{"manifest":5}}', CorruptLogError, "does not decode"),
        (b'{"version":1,"state":{"feature_list":"no"}}', CorruptLogError, "does not decode"),
        (b"[1,2]", CorruptLogError, "is malformed"),
        (b'{"version":1}', CorruptLogError, "is malformed"),
        (b'{"version":2,"state":{}}', SnapshotVersionError, "version 2"),
        (b'{"version":2,"state":{"manifest":5}}', SnapshotVersionError, "version 2"),
    ],
)
def test_an_irregular_entry_is_reported(entry: bytes, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        restore_state(BootstrapProjection(), _snapshot(bootstrap=entry))


def test_a_projection_that_decodes_its_own_state_gets_bytes() -> None:
    seen: list[Any] = []

    class Counting(TranscriptProjection):
        def decode_state(self, data: bytes) -> list[Message]:
            seen.append(type(data))
            return super().decode_state(data)

    messages = [Message(Role.USER, "a")]
    snap = _snapshot(transcript=bytes(snapshot_entry(TranscriptProjection(), messages)))
    assert restore_state(Counting(), snap) == messages and seen == [bytes]


# -- a long snapshot opening the log is decoded by its layout (eventstore.format.reader) ---------


def _log_with(snap: Snapshot, after: int = 2) -> tuple[bytes, EventCodec]:
    """A log of `snap` (encoded as compaction writes it) and `after` message lines."""
    codec = EventCodec()
    line, stamped = codec.encode_snapshot(snap, 9, snap.base_h, TS)
    rest, _, _ = codec.encode_batch(
        [MessagesAppended(messages=[Message(Role.USER, f"after {i}")]) for i in range(after)],
        10,
        snap.base_h,
        TS,
        None,
    )
    return line + rest, codec


def _long_snapshot_log(messages: int) -> tuple[list[Message], bytes, Any]:
    """A log opening with a snapshot of `messages` 200-character messages (and an empty
    bootstrap state), two message lines after it, and a transcript decoder."""
    big = [Message(Role.USER, "m" * 200) for _ in range(messages)]
    snap = _snapshot(
        bootstrap=bytes(snapshot_entry(BootstrapProjection(), BootstrapState())),
        transcript=bytes(snapshot_entry(TranscriptProjection(), big)),
    )
    data, codec = _log_with(snap)
    return big, data, codec.decoder(frozenset({"messages_appended"}))


@settings(max_examples=60, deadline=None)
@given(snapshots(), st.integers(0, 3))
def test_an_opening_snapshot_decoded_by_its_layout_equals_the_whole_decode(
    snap: Snapshot, after: int
) -> None:
    data, codec = _log_with(snap, after)
    dec = codec.decoder(frozenset({"messages_appended"}))
    whole = dec.decode_lines(data)
    long_enough = log_module.LONG_SNAPSHOT
    try:
        log_module.LONG_SNAPSHOT = 0  # every snapshot takes the path
        for region in (data, memoryview(data)):
            got = log_module._decode_lines(dec, region, 0)
            assert got == whole
            assert [bytes(r) for r in got[0].states.values()] == [  # type: ignore[attr-defined]
                bytes(r)
                for r in whole[0].states.values()  # type: ignore[attr-defined]
            ]
    finally:
        log_module.LONG_SNAPSHOT = long_enough


def test_a_long_snapshot_cuts_its_states_without_a_scan(tmp_path: Path) -> None:
    """The states are cut by the layout, never parsed on the way: a state that is not
    JSON at all comes through as bytes (decode_lines would refuse the line), so what
    vouches for them is the line's hash, which every load checks."""
    big, data, dec = _long_snapshot_log(2000)
    got = log_module._decode_lines(dec, memoryview(data), 0)
    assert got == dec.decode_lines(data) and len(got) == 3
    assert restore_state(TranscriptProjection(), got[0]) == big  # type: ignore[arg-type]
    broken = data.replace(b'"content":"m', b'"content":\x01m', 1)  # the transcript's state
    assert len(broken) == len(data)
    with pytest.raises(msgspec.DecodeError):
        dec.decode_lines(broken)
    cut = log_module._decode_lines(dec, memoryview(broken), 0)
    assert b"\x01" in bytes(cut[0].states["transcript"])  # type: ignore[attr-defined]
    # a load checks the line's hash first: the damage is reported, never folded
    (tmp_path / "store").mkdir(mode=0o700)
    paths = SessionPaths(tmp_path / "store", "s")
    paths.create()
    paths.log.write_bytes(broken)
    with SessionStore(tmp_path / "store") as store, pytest.raises(CorruptLogError):
        store.load_transcript_messages("s")


@pytest.mark.parametrize(
    "lie",
    [
        "a range one byte short",
        "a range one byte long",
        "states swapped",
        "a state left out",
        "a range past the line",
    ],
)
def test_a_layout_that_does_not_describe_its_line_is_decoded_whole(lie: str) -> None:
    _, data, dec = _long_snapshot_log(500)
    head = dec.decode_lines(data)[0]
    layout = dict(head.layout)  # type: ignore[attr-defined]
    (a1, b1), (a2, b2) = layout["bootstrap"], layout["transcript"]
    lied = {
        "a range one byte short": {"bootstrap": (a1, b1 - 1), "transcript": (a2, b2)},
        "a range one byte long": {"bootstrap": (a1, b1), "transcript": (a2, b2 + 1)},
        "states swapped": {"transcript": (a2, b2), "bootstrap": (a1, b1)},
        "a state left out": {"transcript": (a2, b2)},
        "a range past the line": {"bootstrap": (a1, b1), "transcript": (a2, len(data) + 5)},
    }[lie]
    old = msgspec.json.encode(layout)
    new = msgspec.json.encode({k: list(v) for k, v in lied.items()})
    if lie == "a state left out":
        new = new[:-1] + b" " * (len(old) - len(new)) + b"}"  # same length: offsets hold
    assert len(new) <= len(old)
    new = new[:-1] + b" " * (len(old) - len(new)) + b"}"
    edited = data.replace(old, new, 1)
    assert edited != data and len(edited) == len(data)
    got = log_module._decode_lines(dec, memoryview(edited), 0)
    assert got == dec.decode_lines(edited)  # the whole decode: what the line really holds
    assert got[0].states == head.states  # type: ignore[attr-defined]


# -- attacks -------------------------------------------------------------------------------


SID = "s"


def _drop_caches(root: Path) -> None:
    """Remove the fold caches and checked prefix beside the log (a cold reader)."""
    for p in log_path(root, SID).parent.iterdir():
        if p.is_file() and p.name not in ("log.jsonl", "log.lock"):
            p.unlink()


def _forge_second_states(line: bytes, key: bytes) -> bytes:
    """The snapshot `line` with a second (empty) states object after the first, its
    `length` and `h` made to match (a forger's edit: the hash is not a secret)."""
    head = json.loads(line[: line.index(b',"states":{')] + b"}")
    body = line[:-24] + b"," + key + b":{}"
    length = len(body) + 24
    assert len(str(length)) == len(str(head["length"]))
    body = body.replace(b'"length":%d' % head["length"], b'"length":%d' % length, 1)
    return oracle.rehash(body + line[-24:], head["base_h"])


@pytest.mark.parametrize("key", [b'"states"', b'"st\\u0061tes"'])
def test_a_snapshot_declaring_its_states_twice_decodes_as_the_whole_line_says(
    root: Path, key: bytes
) -> None:
    """JSON decoders keep the last of two equal keys: a line whose states object is
    followed by `"states":{}` holds no states when decoded whole. Decoded by its layout
    it must say the same (the same events either way), and a load must give the same
    answer whichever way the line was decoded."""
    write_compacted(root, SID, 800, archive=False)
    log = log_path(root, SID)
    snap, rest = log.read_bytes().split(b"\n", 1)
    assert len(snap) > log_module.LONG_SNAPSHOT
    forged = _forge_second_states(snap, key)
    data = forged + b"\n" + rest
    dec = EventCodec().decoder(frozenset({"messages_appended"}))
    whole = dec.decode_lines(data)
    assert whole[0].states == {}  # type: ignore[attr-defined]
    cut = log_module._decode_lines(dec, memoryview(data), 0)
    assert cut == whole and cut[0].states == {}  # type: ignore[attr-defined]
    log.write_bytes(data)

    def outcome() -> object:
        _drop_caches(root)
        try:
            with SessionStore(root) as s:
                return s.load_transcript_messages(SID)
        except EventStoreError as exc:
            return type(exc)

    by_layout = outcome()
    long_enough = log_module.LONG_SNAPSHOT
    log_module.LONG_SNAPSHOT = 1 << 40  # every snapshot decoded whole
    try:
        assert by_layout == outcome()
    finally:
        log_module.LONG_SNAPSHOT = long_enough


class Whatever(Event, tag="whatever_happened", kw_only=True):
    """A custom event type: unknown to a store opened without it."""

    what: str


def _named(name: str, big: bool = False) -> type[StructProjection[Any]]:
    class Counter(StructProjection[dict[str, Any]]):
        event_types = frozenset({"whatever_happened", "messages_appended"})
        state_type = dict[str, Any]

        def initial(self) -> dict[str, Any]:
            return {}

        def apply(self, state: dict[str, Any], event: Event) -> dict[str, Any]:
            if name == "empty":
                pass  # its state stays {}: an entry of `{"version":1,"state":{}}`
            elif type(event) is Whatever:
                state[event.what] = state.get(event.what, 0) + 1
            elif big and type(event) is MessagesAppended:
                state.setdefault("texts", []).extend(m.content for m in event.messages)
            return state

    Counter.name = name
    return Counter


_NAMES = ['q"uote\\back', "ünï ✓ \u2028", 'x,"states":{', "ctl\x01\x1f", "empty"]


def _projections() -> list[StructProjection[Any]]:
    return [_named(n, big=(i == 0))() for i, n in enumerate(_NAMES)]


def _everything(s: SessionStore | Any) -> dict[str, Any]:
    last = s.last_seq(SID)
    out: dict[str, Any] = {
        "transcript": s.load_transcript_messages(SID),
        "bootstrap": s.load_bootstrap_state(SID),
        "last": [s.load_transcript_messages(SID, last=k) for k in (0, 1, 7, 10_000)],
        "pages": [
            s.load_transcript_messages(SID, start=a, limit=b)
            for a, b in ((0, 3), (5, None), (10_000, 2))
        ],
        "state_at": s.state_at(SID, seq=last),
        "transcript_at": s.transcript_at(SID, seq=last),
        "state_at_mid": s.state_at(SID, seq=last // 2),
        "events": [
            (type(e).__name__, e.seq) for e in s.read_events(SID) if type(e).__name__ != "Snapshot"
        ],
        "verify": s.verify(SID).ok,
    }
    for n in _NAMES:
        try:
            out[n] = s.load(SID, n)
        except KeyError:
            out[n] = "unknown projection"
    return out


def _write_history(s: SessionStore) -> None:
    s.initialize_session_if_missing(SID, make_manifest(SID), make_features(3))
    for i in range(400):
        s.append_transcript_messages(
            SID, [Message(Role.USER, f"m{i} " + "t" * (i % 300)), Message(Role.TOOL, "")]
        )
        if i % 40 == 0:
            s.append(SID, [Whatever(what=f"w{i % 3}")])
            s.append_progress_entry(SID, make_entry(i))


@pytest.mark.parametrize("reader_knows", [True, False])
def test_a_snapshot_of_odd_projections_loads_like_the_log_it_replaced(
    tmp_path: Path, reader_knows: bool
) -> None:
    """Projections whose names need JSON escapes (quotes, backslashes, unicode line
    separators, control bytes, the very bytes that open the states), an empty state,
    a large one, custom events kept as unknown by a writer that does not know them:
    every load API on the compacted log (decoded by its layout: it is long) answers as
    on an uncompacted copy, cold and warm, also for a reader without the projections."""
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    kw: dict[str, Any] = {"event_types": [Whatever], "projections": _projections()}
    for r in (plain, packed):
        with SessionStore(r, **kw) as s:
            _write_history(s)
    # compacted by a writer that does not know the custom event (kept verbatim), then
    # by one that does; a few appends after
    with SessionStore(packed) as s:
        assert s.compact(SID, force=True).compacted
    with SessionStore(packed, **kw) as s:
        s.append_transcript_messages(SID, [Message(Role.USER, "between")])
        assert s.compact(SID, force=True).compacted
    with SessionStore(plain, **kw) as s:
        s.append_transcript_messages(SID, [Message(Role.USER, "between")])
    for r in (plain, packed):
        with SessionStore(r, **kw) as s:
            s.append(SID, [Whatever(what="late")])
    snap = log_path(packed, SID).read_bytes().split(b"\n", 1)[0]
    assert len(snap) > log_module.LONG_SNAPSHOT and b'"unknown":[' in snap
    read_kw = kw if reader_knows else {}
    with SessionStore(plain, **read_kw) as s:
        want = _everything(s)
    with SessionStore(packed, **read_kw) as s:
        got_cold = _everything(s)
        got_warm = _everything(s)
    for got in (got_cold, got_warm):
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == want[k], k
    assert want["empty"] in ({}, "unknown projection")


def test_the_memory_engine_and_the_async_store_agree_after_compaction(tmp_path: Path) -> None:
    import asyncio

    url = "memory://attack-hot-path"
    kw: dict[str, Any] = {"event_types": [Whatever]}
    with SessionStore(url, **kw) as mem, SessionStore(tmp_path / "f", **kw) as fs:
        for s in (mem, fs):
            _write_history(s)
            assert s.compact(SID, force=True).compacted
            s.append_transcript_messages(SID, [Message(Role.USER, "after")])
        assert _everything(mem) == _everything(fs)

    async def through_aio() -> tuple[Any, ...]:
        async with AsyncSessionStore(tmp_path / "f", **kw) as a:
            await a.append_transcript_messages(SID, [Message(Role.USER, "async")])
            await a.compact(SID, force=True)
            return (
                await a.load_transcript_messages(SID),
                await a.load_bootstrap_state(SID),
                await a.verify(SID),
            )

    msgs, boot, report = asyncio.run(through_aio())
    with SessionStore(tmp_path / "f", **kw) as cold:
        assert cold.load_transcript_messages(SID) == msgs
        assert cold.load_bootstrap_state(SID) == boot
    assert report.ok and msgs[-2:] == [Message(Role.USER, "after"), Message(Role.USER, "async")]
