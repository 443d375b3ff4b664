"""Reading a projection's state out of a snapshot (projections.base.restore_state):
msgspec decodes the entry and its state in one pass, in place; whatever is irregular
is reported as before, and a projection that decodes its own state gets bytes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import make_features, make_manifest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import snapshots

from eventstore import (
    SessionStore,
    Snapshot,
)
from eventstore.engines.file.layout import SessionPaths
from eventstore.errors import (
    CorruptLogError,
    SnapshotVersionError,
)
from eventstore.format import reader as log_module
from eventstore.format.codec import EventCodec
from eventstore.format.events import MessagesAppended
from eventstore.records import (
    BootstrapState,
    Message,
    Role,
)
from projections import (
    BootstrapProjection,
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
