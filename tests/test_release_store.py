"""A store written by the 0.1.0 release (fixtures/stores/release-0.1.0, made by
fixtures/stores/make.py with that release's code) loads, verifies and continues
unchanged: the file engine reads and writes the release's format byte for byte."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import FIXTURES, make_entry

from eventstore import SessionStore

STORES = FIXTURES / "stores"
# the generator defines the custom event type the release store holds; loaded by path
# (other fixture generators are also called make.py)
_spec = importlib.util.spec_from_file_location("release_store_make", STORES / "make.py")
assert _spec is not None and _spec.loader is not None
_make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_make)
Note = _make.Note

EXPECTED: dict[str, Any] = msgspec.json.decode(
    (STORES / "release-0.1.0.expected.json").read_bytes()
)


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """A private copy of the release store (the tests write to it)."""
    root = tmp_path / "release"
    shutil.copytree(STORES / "release-0.1.0", root)
    return root


def _json(value: Any) -> Any:
    return msgspec.json.decode(msgspec.json.encode(value))


def test_the_fixture_has_the_sessions_it_promises() -> None:
    assert sorted(EXPECTED) == sorted(
        ["plain", "compacted", "bare-snapshot", "keyed", "custom", "séance ✓/日本"]
    )


@pytest.mark.parametrize("sid", sorted(EXPECTED))
def test_every_session_reads_back_as_the_release_read_it(release: Path, sid: str) -> None:
    want = EXPECTED[sid]
    with SessionStore(release, event_types=[Note]) as store:
        assert sid in store.list_sessions()
        assert store.last_seq(sid) == want["last_seq"]
        assert _json(store.load_bootstrap_state(sid)) == want["bootstrap"]
        assert _json(store.load_transcript_messages(sid)) == want["transcript"]
        assert [_json(ev) for ev in store.read_events(sid)] == want["events"]
        report = store.verify(sid)
        assert report.ok == want["ok"] and report.head_hash == want["head_hash"]
        assert [p.kind for p in report.problems] == want["problems"]


@pytest.mark.parametrize("sid", sorted(EXPECTED))
def test_every_session_continues_byte_compatibly(release: Path, sid: str) -> None:
    """New appends chain onto the release's lines (old bytes untouched), idempotency keys
    the release wrote still replay, and compaction keeps it all verifiable."""
    with SessionStore(release, event_types=[Note]) as store:
        with store.engine.history(sid) as hist:
            assert hist.live is not None
            log = Path(hist.live.where)
        before = log.read_bytes()
        store.append_progress_entry(sid, make_entry(99))
        after = log.read_bytes()
        assert after.startswith(before)
        assert store.last_seq(sid) == EXPECTED[sid]["last_seq"] + 1
        assert store.verify(sid).ok
        if sid == "keyed":
            again = store.append(
                sid, [Note(text="batch a"), Note(text="batch b")], idempotency_key="k3"
            )
            assert again.replayed
        store.compact(sid)
        assert store.verify(sid).ok
        state = store.load_bootstrap_state(sid)
    with SessionStore(release, event_types=[Note]) as fresh:
        assert fresh.load_bootstrap_state(sid) == state
        assert fresh.state_at(sid, seq=EXPECTED[sid]["last_seq"] + 1) == state
