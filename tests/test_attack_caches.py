"""Attacks from outside on the side files a cold load trusts: the fold caches
(`fold-<projection>.cache`, eventstore/fold_cache.py) and the checked prefix
(`fold-x<digest>.cache`, eventstore/checked_prefix.py), and on compaction's snapshot
states, which a cold load trusts in the same way.

The attacker has write access to the files (damage, stale copies, swaps, races, other
processes of the same application) but does not recompute digests. The rule under
attack (README, "The log format" and "Guarantees"): the caches "only save time, are used
only while they check against the log": whatever a load returns must equal a fresh fold
of the log with no cache at all, and a damaged cache is ignored (and rebuilt), cheaply.

Every load is compared with `_truth`: a fold of an undamaged copy of the log by a store
that reads and writes no cache and trusts no checked prefix.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    FlipCounted,
    check_whole,
    log_path,
    make_checkpoint,
    make_entry,
    make_features,
    make_manifest,
)
from conftest import FlipsPerRun as ReadmeFlips

from eventstore import (
    Message,
    Role,
    SessionStore,
)
from eventstore.core import checked_prefix, fold_cache
from eventstore.engines.file.caches import cache_file_name

SID = "s"


# -- helpers ---------------------------------------------------------------------------


class FlipsPerRun(ReadmeFlips):
    """The README's custom projection, with its folds kept in the fold cache."""

    name = "flips_per_run"
    cache_folds = True


def _aware(root: Path) -> SessionStore:
    """The application as it is now: it knows `flip_counted`."""
    return SessionStore(root, event_types=[FlipCounted], projections=[FlipsPerRun()])


def _unaware(root: Path) -> SessionStore:
    """Another process on the same store that has the projection but not the event type
    (an older build, a tool, a worker started without the plug-in): the README says
    such a reader skips the type in folds and compaction keeps its lines verbatim."""
    return SessionStore(root, projections=[FlipsPerRun()])


def _fill_flips(root: Path, n: int = 150) -> None:
    with _aware(root) as s:  # > 64 KiB of log: caches are saved on close
        for i in range(n):
            s.append(SID, [FlipCounted(run_id=f"r{i % 3}")])
            s.append_transcript_messages(SID, [Message(Role.USER, "x" * 500)])


def _cache(root: Path, name: str = "bootstrap", sid: str = SID) -> Path:
    return log_path(root, sid).parent / cache_file_name(name)


def _side_files(root: Path, sid: str = SID) -> list[Path]:
    d = log_path(root, sid).parent
    return sorted(p for p in d.iterdir() if p.name.startswith("fold-"))


def _fill(store: SessionStore, sid: str = SID, turns: int = 80, start: int = 0) -> None:
    if not store.is_initialized(sid):
        store.initialize_session_if_missing(sid, make_manifest(sid), make_features(12))
    for i in range(start, start + turns):
        store.append_transcript_messages(sid, [Message(Role.USER, f"m{i} " + "w" * 900)])
        store.append_progress_entry(sid, make_entry(i))
        if i % 7 == 0:
            store.update_feature_pass(sid, f"f{i % 12 + 1}", i % 2 == 0)
            store.record_run_checkpoint(sid, make_checkpoint(f"run-{i}"))


def _truth(root: Path, sid: str = SID) -> Any:
    """A fold of an undamaged copy of the session's files (log and archive, no cache)
    by a store that reads and writes no cache and trusts no checked prefix."""
    src = log_path(root, sid).parent
    copy = root.parent / f"truth-{os.getpid()}-{id(src)}"
    shutil.rmtree(copy, ignore_errors=True)
    dest = log_path(copy, sid).parent
    dest.parent.mkdir(parents=True, mode=0o700)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("fold-*"))
    try:
        with SessionStore(copy) as s:
            s.core.caches.cached = {}
            s.core.caches.marks = False
            return s.load_bootstrap_state(sid), s.load_transcript_messages(sid)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _load(root: Path, sid: str = SID) -> Any:
    with SessionStore(root) as s:
        return s.load_bootstrap_state(sid), s.load_transcript_messages(sid)


# -- broken promises -------------------------------------------------------------------


def test_a_fold_cache_left_by_a_process_that_did_not_know_an_event_type_is_not_trusted(
    root: Path,
) -> None:
    """A process with the projection but without the event type folds the log (the
    README: such a reader skips the type) and closes: it saves its fold, which lacks
    every `flip_counted`, as a cache that checks (right session, projection, version and
    head). The application that knows the type then trusts that cache: its cold load
    answers {} where the log (and the same store with the cache deleted) says 150 flips.

    A cache must only save time; here it changes the answer, for every later process,
    until the log grows past it (and then it answers with a count missing 150 flips)."""
    _fill_flips(root)
    with _aware(root) as s:
        s.core.caches.cached = {}
        truth = s.load(SID, "flips_per_run")
    assert truth == {"r0": 50, "r1": 50, "r2": 50}
    for p in _side_files(root):
        p.unlink()
    with _unaware(root) as other:
        assert other.load(SID, "flips_per_run") == {}  # skipped, as documented
    assert _cache(root, "flips_per_run").is_file()  # ... and saved on close
    with _aware(root) as s:
        assert s.load(SID, "flips_per_run") == truth  # fails: {} from the cache


def test_a_snapshot_written_by_a_compactor_that_did_not_know_an_event_type(
    root: Path,
) -> None:
    """The same on compaction: the unaware process compacts (`unknown_kept=150`: the
    lines are kept verbatim, and `known` records that the compactor did not know
    `flip_counted`), but it stores its own fold of `flips_per_run` ({}) as the
    snapshot's state, and a reader that knows the type trusts it, with or without the
    fold cache. README, Compaction: "Every projection, built-in or yours, gives the
    same answer before and after" -- before: 150 flips; after: none."""
    _fill_flips(root)
    with _aware(root) as s:
        s.core.caches.cached = {}
        before = s.load(SID, "flips_per_run")
    with _unaware(root) as other:
        report = other.compact(SID)
        assert report.compacted and report.unknown_kept == 150
    for p in _side_files(root):
        p.unlink()  # not the fold cache's doing: the snapshot itself
    with _aware(root) as s:
        assert s.load(SID, "flips_per_run") == before  # fails: {}


def test_a_huge_file_planted_as_a_cache_is_not_read_whole(root: Path) -> None:
    """A 256 MiB (sparse) file of zeros where the fold cache and the checked prefix
    live: `FileEngine.load_cache` reads the whole file into memory before it looks at
    its first line, for each of the two, on every cold load, and the close of a small
    session never replaces them. Measured: a 1 GiB pair turns a 1 ms cold load of a
    20-line session into ~4 s and 1 GiB of memory. A cache no longer than its header
    says it is is ignored after reading its first line (a few hundred bytes)."""
    with SessionStore(root) as s:
        for i in range(20):
            s.append_transcript_messages(SID, [Message(Role.USER, f"m{i}")])
        s.append_progress_entry(SID, make_entry(1))
    truth = _truth(root)
    for name in ("bootstrap", checked_prefix.NAME):
        with open(_cache(root, name), "wb") as f:
            f.truncate(256 << 20)
    tracemalloc.start()
    try:
        got = _load(root)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == truth
    assert peak < 32 << 20, f"a cold load of a 20-line session allocated {peak >> 20} MiB"


# -- attacks that found nothing: kept as coverage --------------------------------------


def _snap(root: Path, sid: str = SID) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in _side_files(root, sid)}


def _plant(root: Path, files: dict[str, bytes], sid: str = SID) -> None:
    for p in _side_files(root, sid):
        p.unlink()
    d = log_path(root, sid).parent
    for name, data in files.items():
        (d / name).write_bytes(data)


@pytest.mark.parametrize(
    "history",
    ["older state", "before compaction", "before repair", "other session", "before removal"],
)
def test_side_files_from_another_time_or_session_never_change_a_load(
    root: Path, history: str
) -> None:
    """Every side file saved at one moment (a fold cache, a checked prefix) planted back
    after the log moved on: appended to, compacted and re-grown past the same seq,
    repaired (a bad middle line cut) and re-grown, removed and re-created with the same
    events, or copied from another session of the same shape. Each load (bootstrap and
    transcript, fresh processes) equals the fold of an undamaged copy of the log."""
    with SessionStore(root) as s:
        _fill(s)
        if history == "other session":
            _fill(s, "t")
    check_whole(root, "t" if history == "other session" else SID)  # and a checked prefix
    stale = _snap(root, "t" if history == "other session" else SID)
    assert any(n.startswith("fold-x") for n in stale) and "fold-bootstrap.cache" in stale
    with SessionStore(root) as s:
        if history == "before compaction":
            assert s.compact(SID, archive=False, force=True).compacted
        elif history == "before repair":
            from eventstore.ops.repair import repair

            log = log_path(root, SID)
            data = log.read_bytes()
            cut = data.index(b'"seq":100,')
            log.write_bytes(data[:cut] + b"X" + data[cut + 1 :])  # a bad line mid-log
            s.close()
            s = SessionStore(root)
            repair(s, SID)
        elif history == "before removal":
            assert s.delete_session(SID)
        _fill(s, start=500)  # re-grown well past the seq and size the files vouched for
    truth = _truth(root)
    _plant(root, stale)
    assert _load(root) == truth
    _plant(root, stale)
    with SessionStore(root) as s:  # a warm store catching up under stale files
        s.load_bootstrap_state(SID)
        s.append_progress_entry(SID, make_entry(999))
        assert (s.load_bootstrap_state(SID), s.load_transcript_messages(SID)) == _truth(root)


def test_a_cache_or_prefix_cut_at_every_byte_is_ignored(root: Path) -> None:
    """The fold cache and the checked prefix, each cut at every length short of whole:
    neither is ever handed to a load (the load path, `fold_cache.load` and
    `checked_prefix.load`, on the real file)."""
    with SessionStore(root) as s:
        _fill(s, turns=70)
    check_whole(root, SID)
    store = SessionStore(root)
    try:
        for name in ("bootstrap", checked_prefix.NAME):
            path = _cache(root, name)
            good = path.read_bytes()
            step = 1 if name != "bootstrap" else max(1, len(good) // 1500)
            cuts = sorted({*range(0, len(good), step), *range(len(good) - 80, len(good))})
            for n in cuts:
                path.write_bytes(good[:n])
                if name == "bootstrap":
                    known = fold_cache.known_types(store.bootstrap, store.codec.types)
                    got = fold_cache.load(store.engine, SID, store.bootstrap, known)
                else:
                    got = checked_prefix.load(store.engine, SID)
                if n == len(good) - 1 and name != "bootstrap":
                    # only the closing newline gone: the same record (its digest is
                    # of the log's bytes, proven again by the load that uses it)
                    assert got == checked_prefix.load(store.engine, SID) or got is None
                    continue
                assert got is None, (name, n, len(good))
            path.write_bytes(good)
    finally:
        store.close()
    assert _load(root) == _truth(root)


def test_racing_cache_savers_a_compactor_and_a_writer_never_change_a_load(root: Path) -> None:
    """Two child processes load and close in a loop (each saves its fold cache and
    checked prefix, racing each other's atomic renames), while the parent appends and
    compacts. Every load in the children and in the parent equals the fold of the log
    as it ends, cut at the seq it reached (the log only grows)."""
    with SessionStore(root) as s:
        _fill(s, turns=40)
    child = textwrap.dedent(
        f"""
        import sys
        from eventstore import SessionStore
        import os, time
        seen, rounds, deadline = 0, 0, time.monotonic() + 30
        while rounds < 3 or not os.path.exists({str(root / "done")!r}):
            assert time.monotonic() < deadline
            rounds += 1
            with SessionStore({str(root)!r}) as s:
                b = s.load_bootstrap_state({SID!r})
                t = s.load_transcript_messages({SID!r})
                n = len(b.recent_progress)
                assert n >= seen and len(t) >= n, (n, seen, len(t))
                assert [m.content.split()[0] for m in t] == [f"m{{i}}" for i in range(len(t))]
                seen = n
            open({str(root)!r} + f"/ready-{{os.getpid()}}", "w").close()
        print(rounds)
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 30
        while len(list(root.glob("ready-*"))) < 2:  # both are loading and closing
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.01)
        with SessionStore(root) as s:
            for k in range(10):
                _fill(s, turns=8, start=40 + 8 * k)
                s.compact(SID, archive=k % 2 == 0, force=True)
        (root / "done").touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert _load(root) == _truth(root)


def test_a_cache_save_killed_midway_leaves_nothing_a_load_trusts(root: Path) -> None:
    """A process SIGKILLed while it writes its fold cache (after the temporary file's
    first bytes, before the rename): the old cache stays whole, the half-written
    temporary file is never read, loads equal the truth, and the next compaction
    sweeps the temporary file away."""
    with SessionStore(root) as s:
        _fill(s)
    before = _cache(root).read_bytes()
    child = textwrap.dedent(
        f"""
        import os, signal
        from eventstore import SessionStore
        from eventstore.engines.file import layout
        real = layout.write_all
        def write_all(fd, data, *, fsync=False):
            real(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        layout.write_all = write_all
        s = SessionStore({str(root)!r})
        s.append_progress_entry({SID!r}, __import__("conftest").make_entry(777))
        s.load_bootstrap_state({SID!r})
        s.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    r = subprocess.run([sys.executable, "-c", child], env=env, timeout=60, capture_output=True)
    assert r.returncode == -9, r.stderr
    d = log_path(root, SID).parent
    assert any(".tmp-" in n for n in os.listdir(d))  # the killed write's debris
    assert _cache(root).read_bytes() == before
    assert _load(root) == _truth(root)
    with SessionStore(root) as s:
        s.compact(SID, force=True)
    assert not any(".tmp-" in n for n in os.listdir(d))
    assert _load(root) == _truth(root)
