"""SessionStore keeps at most `cached_sessions` sessions' folded states in memory: a
long-lived process touching many sessions does not grow without bound, a dropped
session's caches are saved first, and a session dropped while a thread uses it stays
correct for both the thread and later callers."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from conftest import make_entry, make_features, make_manifest

from eventstore import SessionStore
from eventstore.aio import AsyncSessionStore
from eventstore.engines.file import FileEngine
from eventstore.errors import InvalidArgumentError
from eventstore.records import (
    Message,
    Role,
)


def test_the_store_keeps_at_most_cached_sessions(root: Path) -> None:
    with SessionStore(root, cached_sessions=3) as s:
        for i in range(10):
            sid = f"s{i}"
            s.initialize_session_if_missing(sid, make_manifest(sid), make_features(2))
            s.append_progress_entry(sid, make_entry(i))
            assert s.load_bootstrap_state(sid).recent_progress[-1].summary == f"step {i}"
            assert len(s.core.sessions) <= 3
        for i in range(10):  # every dropped session refolds to the same state
            state = s.load_bootstrap_state(f"s{i}")
            assert [p.summary for p in state.recent_progress] == [f"step {i}"]
            assert len(s.core.sessions) <= 3


@pytest.mark.parametrize("limit", [1, 4, 10, 1000])
def test_the_store_keeps_as_many_sessions_as_cached_sessions_says(root: Path, limit: int) -> None:
    """Up to the limit, every session stays folded: none is dropped early (it once kept
    about half of them, once more than half the limit were open)."""
    with SessionStore(root, cached_sessions=limit) as s:
        sids = [f"s{i}" for i in range(limit)]
        for sid in sids:
            s.append_progress_entry(sid, make_entry(0))
            s.load_bootstrap_state(sid)
        assert len(s.core.sessions) == limit
        assert all("bootstrap" in s.cache_info(sid).folds for sid in sids)
        s.append_progress_entry("one-more", make_entry(0))
        assert len(s.core.sessions) == limit  # the oldest opened went
        if limit > 1:
            assert "bootstrap" in s.cache_info(sids[-1]).folds


def test_a_store_keeps_256_sessions_by_default(root: Path) -> None:
    """The documented default bound (docs/session-api.md): a process going through many
    sessions keeps 256 folded states, not one per session it ever touched."""
    with SessionStore(root) as s:
        assert s.cached_sessions == 256
        for i in range(300):
            s.append_progress_entry(f"s{i}", make_entry(0))
        assert len(s.core.sessions) == 256


def test_a_dropped_session_saves_its_caches(root: Path) -> None:
    with SessionStore(root, cached_sessions=1) as s:
        s.initialize_session_if_missing("big", make_manifest("big"), make_features(50))
        for _ in range(80):
            s.append_transcript_messages("big", [Message(role=Role.USER, content="x" * 1000)])
        s.load_bootstrap_state("big")
        cache_dir = root / "sessions" / "big"
        assert not list(cache_dir.glob("fold-bootstrap.cache"))
        s.load_bootstrap_state("other")  # drops "big"
        assert list(cache_dir.glob("fold-bootstrap.cache"))  # saved before it was dropped


def test_a_session_dropped_under_a_writing_thread_stays_consistent(root: Path) -> None:
    with SessionStore(root, cached_sessions=1) as s:
        errors: list[BaseException] = []

        def write(sid: str) -> None:
            try:
                for i in range(60):
                    s.append_progress_entry(sid, make_entry(i))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(sid,)) for sid in ("a", "b", "a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for sid in ("a", "b"):
            summaries = [p.summary for p in s.load_bootstrap_state(sid).recent_progress]
            assert sorted(summaries) == sorted([f"step {i}" for i in range(60)] * 2)
            assert s.verify(sid).ok


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", None])
def test_a_bad_cached_sessions_is_refused(root: Path, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="cached_sessions"):
        SessionStore(root, cached_sessions=bad)  # type: ignore[arg-type]


def test_the_async_store_passes_cached_sessions_on(root: Path) -> None:
    store = AsyncSessionStore(root, cached_sessions=2)
    try:
        assert store.store.cached_sessions == 2
    finally:
        asyncio.run(store.close())


@pytest.mark.parametrize("durability", ["flush", "fsync"])
def test_the_file_engine_lets_go_of_the_sessions_the_store_drops(
    root: Path, durability: str
) -> None:
    """A long-running process touching many sessions once each keeps the engine's
    per-session state (descriptors, the last head seen, a durable writer's epoch) for
    about `cached_sessions` of them, not for every session ever touched; what it let go
    of reads and appends as before, in this process and the next."""
    with SessionStore(root, cached_sessions=4, durability=durability) as s:  # type: ignore[arg-type]
        engine = s.engine
        assert isinstance(engine, FileEngine)
        for i in range(40):
            s.append_progress_entry(f"s{i}", make_entry(i))
            assert s.load_bootstrap_state(f"s{i}").recent_progress[-1].summary == f"step {i}"
            assert engine.kept_sessions <= 5
        for i in range(40):  # let go of, then used again: appends chain on
            s.append_progress_entry(f"s{i}", make_entry(i + 100))
            assert engine.kept_sessions <= 5
    with SessionStore(root) as s:
        for i in range(40):
            summaries = [p.summary for p in s.load_bootstrap_state(f"s{i}").recent_progress]
            assert summaries == [f"step {i}", f"step {i + 100}"]
            assert s.verify(f"s{i}").ok


def test_a_session_let_go_of_sees_what_another_store_appended(root: Path) -> None:
    with SessionStore(root, cached_sessions=1) as a, SessionStore(root) as b:
        a.append_progress_entry("x", make_entry(0))
        a.load_bootstrap_state("y")  # drops "x": the engine lets go of it
        b.append_progress_entry("x", make_entry(1))
        a.append_progress_entry("x", make_entry(2))
        assert [p.summary for p in a.load_bootstrap_state("x").recent_progress] == [
            "step 0",
            "step 1",
            "step 2",
        ]
        assert a.verify("x").ok
