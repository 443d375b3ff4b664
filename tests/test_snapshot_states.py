"""Reading a projection's state out of a snapshot (projections.base.restore_state):
msgspec decodes the entry and its state in one pass, in place; whatever is irregular
is reported as before, and a projection that decodes its own state gets bytes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from conftest import make_features, make_manifest

from eventstore import Snapshot
from eventstore.errors import CorruptLogError, SnapshotVersionError
from eventstore.records import BootstrapState, Message, Role
from projections import BootstrapProjection, TranscriptProjection, restore_state, snapshot_entry


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
