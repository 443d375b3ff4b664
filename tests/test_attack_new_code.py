"""An outside attack on what changed since 9a43d11: the collector paused during cold
loads (eventstore/gc_pause.py, `SessionStore._loaded`), copies made under the session's
lock, pieces vouched for by a checked prefix folded before their digest is awaited, the
fold cache's `known` types and compaction leaving out states it could not fold, and the
smaller fixes (write_atomically's shortened temporary names, parse_time, follow).

The rule under attack (README, Guarantees): a load never returns (and a store never
keeps, in memory or in a side file) a state built from bytes that failed their check,
and every projection gives the same answer before and after compaction and with or
without the caches.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FlipCounted, log_path, make_entry
from conftest import FlipsPerRun as ReadmeFlips

from eventstore import (
    Event,
    Message,
    Role,
    SessionStore,
)
from eventstore.engines.file.layout import write_atomically
from projections import StructProjection

SID = "s"


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    """Each test starts with the collector on (tests/test_gc_pause.py's
    test_a_collector_already_off_stays_off leaves it off for the rest of a session) and
    leaves it as it found it."""
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


class AllFlips(ReadmeFlips):
    """The README's flips-per-run projection, but reading every event type
    (`event_types=None`, which the Projection protocol allows: "None: all")."""

    name = "all_flips"
    event_types = None


def _side_files(root: Path, sid: str = SID) -> list[Path]:
    return sorted(log_path(root, sid).parent.glob("fold-*.cache"))


# -- findings --------------------------------------------------------------------------


def test_compaction_by_an_unaware_process_keeps_an_all_types_projection_state(
    tmp_path: Path,
) -> None:
    """01c7587 leaves out of a snapshot the state of a projection that reads an event
    type the compactor skipped, but only when `event_types` is a set: a projection with
    `event_types=None` reads every type, the skipped ones included, yet its state (folded
    without them) is stored, and a reader that decodes them trusts it. README,
    Compaction: every projection gives the same answer before and after."""
    root = tmp_path / "store"
    with SessionStore(root, event_types=[FlipCounted], projections=[AllFlips()]) as s:
        for i in range(40):
            s.append(SID, [FlipCounted(run_id="r1")])
            s.append_progress_entry(SID, make_entry(i))
        before = s.load(SID, "all_flips")
    assert before == {"r1": 40}
    with SessionStore(root, projections=[AllFlips()]) as unaware:  # knows no flip_counted
        report = unaware.compact(SID, force=True)
        assert report.compacted and report.unknown_kept == 40
    for p in _side_files(root):
        p.unlink()
    with SessionStore(root, event_types=[FlipCounted], projections=[AllFlips()]) as s:
        assert s.load(SID, "all_flips") == before  # fails: {} (the unaware fold)


class _Nesting(StructProjection[dict[str, int]]):
    """Counts every event, its fold kept in the fold cache; while `nest` is set, its
    apply loads another session of the same store after counting (a projection that
    looks something up, a logging hook...)."""

    name = "nesting"
    version = 1
    event_types = None
    state_type = dict[str, int]
    cache_folds = True

    def __init__(self) -> None:
        self.store: SessionStore | None = None
        self.nest = False

    def initial(self) -> dict[str, int]:
        return {"n": 0}

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        state["n"] += 1  # in place, as the protocol allows
        if self.nest:
            self.nest = False
            assert self.store is not None
            self.store.load_bootstrap_state("other")
        return state


def test_a_nested_load_never_saves_a_half_folded_state_as_a_fold_cache(
    tmp_path: Path,
) -> None:
    """A load whose projection's apply loads another session (brief item 1: nested
    loads): with the store's session cache full, that load evicts the session being
    folded, and eviction saves its fold cache (`_save_caches`, through the RLock the
    folding thread already holds) while the piece is half folded in place: the state
    holds the first new event, the head is the one before it. Every later cold load
    (this store's next, another process's) counts that event twice."""
    root = tmp_path / "store"
    with SessionStore(root) as s:
        s.append_progress_entry("other", make_entry(0))
    proj = _Nesting()
    store = SessionStore(root, projections=[proj], cached_sessions=1)
    proj.store = store
    try:
        big = "x" * 2000
        for i in range(60):  # ~120 KB: past the 64 KiB a cache is saved for
            store.append_transcript_messages(SID, [Message(Role.USER, f"{i} {big}")])
        assert store.load(SID, "nesting") == {"n": 60}
        with SessionStore(root) as writer:  # another process appends three events
            for i in range(3):
                writer.append_progress_entry(SID, make_entry(i))
        proj.nest = True
        assert store.load(SID, "nesting") == {"n": 63}
        # the session was evicted by the nested load: the next load is cold
        assert store.load(SID, "nesting") == {"n": 63}  # fails: {"n": 64}
    finally:
        store.close()
    with SessionStore(root, projections=[_Nesting()]) as fresh:
        assert fresh.load(SID, "nesting") == {"n": 63}


class _Holder:
    __slots__ = ("__weakref__", "me", "pad")

    def __init__(self) -> None:
        self.pad = bytearray(1024)
        self.me = self  # a cycle: only the cyclic collector frees it


class _Cyclic(StructProjection[dict[str, int]]):
    """A projection whose apply makes short-lived cyclic garbage (a node with a parent
    pointer, say, built and dropped per event), and records how many of those are
    alive, uncollected, at once."""

    name = "cyclic"
    version = 1
    event_types = None
    state_type = dict[str, int]

    def __init__(self) -> None:
        self.alive = 0
        self.peak = 0
        self.refs: list[weakref.ref[_Holder]] = []

    def initial(self) -> dict[str, int]:
        return {"n": 0}

    def _gone(self, _ref: object) -> None:
        self.alive -= 1

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        self.refs.append(weakref.ref(_Holder(), self._gone))
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        state["n"] += 1
        return state


def test_a_cold_load_does_not_keep_a_user_projection_s_cyclic_garbage(
    tmp_path: Path,
) -> None:
    """gc_pause's docstring: "Decoded records cannot form cycles, so nothing is lost by
    collecting after the load": true of the built-in projections, not of a user's, whose
    apply may make cyclic garbage, yet `load(sid, projection)` pauses the collector for
    any projection. With the collector on, a few hundred of those cycles are alive at
    once (generation 0 runs every 700 allocations); paused, every one of them is until
    the load ends: memory grows with the length of the log (here 1 KiB per event; a
    100,000-event log, 100 MiB)."""
    root = tmp_path / "store"
    n = 6000
    with SessionStore(root) as s:
        for i in range(n):
            s.append_progress_entry(SID, make_entry(i))
    proj = _Cyclic()
    assert gc.isenabled()
    with SessionStore(root, projections=[proj]) as s:
        assert s.load(SID, "cyclic") == {"n": n}
    gc.collect()
    assert gc.isenabled() and proj.alive == 0
    assert proj.peak < n // 4, f"{proj.peak} of {n} cyclic garbage objects alive at once"
    # fails: 6000 of 6000 (the collector was paused for the whole fold)


def test_write_atomically_takes_a_name_that_is_not_utf_8(tmp_path: Path) -> None:
    """8f26bc8 cuts the temporary name to the target name's first 120 bytes with
    `path.name.encode()`: a name that is not UTF-8 (Linux names are bytes; Python gives
    them with surrogate escapes, as argv does for `report -o`) raised UnicodeEncodeError,
    where it was written before."""
    target = tmp_path / os.fsdecode(b"report-\xff.html")
    write_atomically(target, b"<html></html>")  # fails: UnicodeEncodeError
    assert target.read_bytes() == b"<html></html>"
    assert os.listdir(tmp_path) == [target.name]


# -- attacks that found nothing: kept as coverage --------------------------------------


def test_loads_in_many_threads_with_failures_leave_the_collector_as_it_was(
    tmp_path: Path,
) -> None:
    """Cold loads overlapping in threads (each its own store: every load is cold), some
    failing in their projection's apply, some nesting a cold load of another session,
    never leave the collector off, and leave it off when it was off."""

    class Flaky(_Nesting):
        name = "flaky"
        cache_folds = False

        def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
            state["n"] += 1
            kind = threading.current_thread().name
            if kind.endswith("fail") and state["n"] == 3:
                raise RuntimeError("boom")
            if kind.endswith("nest") and state["n"] == 2 and self.store is not None:
                self.store.load(f"{SID}-x", "flaky")
            return state

    root = tmp_path / "store"
    with SessionStore(root) as s:
        for sid in (SID, f"{SID}-x"):
            for i in range(5):
                s.append_progress_entry(sid, make_entry(i))
    for enabled in (True, False, True):
        (gc.enable if enabled else gc.disable)()
        try:
            errors: list[BaseException] = []
            results: list[Any] = []

            def run(errors: list[BaseException] = errors, results: list[Any] = results) -> None:
                proj = Flaky()
                with SessionStore(root, projections=[proj]) as s:
                    proj.store = s
                    try:
                        results.append(s.load(SID, "flaky"))
                    except RuntimeError as exc:
                        errors.append(exc)

            threads = [
                threading.Thread(target=run, name=f"t{i}-{kind}")
                for i in range(4)
                for kind in ("ok", "fail", "nest")
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert not any(t.is_alive() for t in threads)
            assert len(errors) == 4 and results == [{"n": 5}] * 8
            assert gc.isenabled() is enabled
        finally:
            gc.enable()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_from_inside_a_cold_load_gives_the_child_its_collector(tmp_path: Path) -> None:
    """A projection's apply forks (the forking thread itself holds the pause): the
    child has the collector on at once, finishes the load with the right state and
    loads again; the parent's pause ends with its load."""
    parent = os.getpid()

    class Forking(_Nesting):
        name = "forking"
        cache_folds = False

        def __init__(self) -> None:
            super().__init__()
            self.child = 0

        def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
            state["n"] += 1
            if state["n"] == 3 and not self.child:
                self.child = os.fork() or -1
                if self.child == -1 and not gc.isenabled():
                    os._exit(2)
            return state

    root = tmp_path / "store"
    with SessionStore(root) as s:
        for i in range(10):
            s.append_progress_entry(SID, make_entry(i))
    proj = Forking()
    s = SessionStore(root, projections=[proj])
    try:
        got = s.load(SID, "forking")
    finally:
        if os.getpid() != parent:  # the child never returns into pytest
            try:
                ok = got == {"n": 10} and gc.isenabled()
                ok = ok and s.load(SID, "forking") == {"n": 10} and gc.isenabled()
            finally:
                os._exit(0 if ok else 3)  # noqa: B012
    s.close()
    assert proj.child > 0
    assert got == {"n": 10} and gc.isenabled()
    for _ in range(200):
        pid, status = os.waitpid(proj.child, os.WNOHANG)
        if pid:
            break
        time.sleep(0.05)
    else:
        os.kill(proj.child, 9)
        os.waitpid(proj.child, 0)
        pytest.fail("the forked child did not finish in 10 s")
    assert os.waitstatus_to_exitcode(status) == 0
